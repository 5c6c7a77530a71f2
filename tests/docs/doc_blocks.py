"""The fenced blocks of the user docs (README.md, docs/*.md) and how the docs test runs them.

Every block names its language. `bash` and `python` blocks are runnable: the docs test runs them as written,
unless the line before the block marks it with a reason:

    <!-- illustration: needs your own Ray cluster -->   not run: it needs what a user brings (files, machines, a
                                                       GPU), or it sketches code that lives in a file
    <!-- ci:install --> / <!-- ci:test -->              the install and the test command, run by .ci/run
    <!-- vllm: needs vLLM (...) -->                     run by tests/docs/test_vllm_docs.py in the vLLM environment

Other languages (`yaml`, `text`, `json`) are configs, outputs and diagrams, read by a human.

A page runs as one bash script in a fresh shell (`page_script`): its runnable blocks in order, a python block
through `python - <<'EOF'`, each after a line that names it, so a failure names the block. `set -e` stops the
page at the first command that fails.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

RUNNABLE = ("bash", "python")
FENCE = re.compile(r"^(?P<indent> *)```(?P<language>[\w-]*)[ \t]*\n(?P<text>.*?)^(?P=indent)```[ \t]*$", re.S | re.M)
MARKER = re.compile(r"<!--\s*(?P<kind>illustration|ci|vllm):?\s*(?P<reason>.*?)\s*-->\s*$")
BLOCK_START = "### doc block {name}"


@dataclass(frozen=True)
class DocBlock:
    path: Path            # the page
    line: int             # the line of its opening fence
    language: str         # "" when the fence names none
    text: str             # the block's lines, indentation removed
    marker: str           # "illustration", "ci", "vllm" or ""
    reason: str           # what the marker says after its kind

    @property
    def name(self) -> str:
        return f"{self.path.name}:{self.line}"

    @property
    def is_run(self) -> bool:
        return self.language in RUNNABLE and not self.marker


def doc_blocks(path: Path) -> list[DocBlock]:
    text = path.read_text()
    blocks = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.search(before)
        indent = len(match.group("indent"))
        body = "".join(row[indent:] for row in match.group("text").splitlines(keepends=True))
        blocks.append(DocBlock(path, line, match.group("language"), body, marker.group("kind") if marker else "",
                               marker.group("reason") if marker else ""))
    return blocks


def page_script(blocks: list[DocBlock], rewrite=lambda command: command,
                runs: Callable[[DocBlock], bool] = lambda block: block.is_run) -> str:
    """One bash script running the page's blocks that `runs` picks (its runnable blocks), in order; `rewrite(line)`
    may change a line of a bash block (its continuations joined) before it runs."""
    parts = ["set -eo pipefail"]
    for block in blocks:
        if not runs(block):
            continue
        parts.append(f"echo; echo {quote(BLOCK_START.format(name=block.name))}")   # on a line of its own
        if block.language == "python":
            parts.append(f"python - <<'ASYNCRL_DOC_PYTHON'\n{block.text}ASYNCRL_DOC_PYTHON")
        else:
            parts += [rewrite(line) for line in block.text.replace("\\\n", " ").splitlines()]
    return "\n".join(parts) + "\n"


def quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"
