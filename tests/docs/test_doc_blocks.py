"""What the docs test relies on, checked without running the docs: every fenced block names its language, a
runnable block holds no placeholder for the user to replace nor installs anything, and the page runner fails on a
broken command and finds a process left running."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from tests.docs.doc_blocks import doc_blocks
from tests.docs.test_docs import PAGES, REPO, block_that_failed, run_page

BLOCKS = [block for page in PAGES for block in doc_blocks(REPO / page)]
# A name the user would have to replace: a word in capitals with an underscore, neither an environment variable
# being set (NAME=...) nor one being read ($NAME) (MODEL_DIR, HEAD_IP), one followed by a slash (OUTPUT/...), or
# the value of a lower-case key (model.path=MODEL).
PLACEHOLDER = re.compile(r"(?<![\w$/{.-])[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+(?![\w=}])|(?<![\w$/{.-])[A-Z]{3,}/"
                         r"|(?<=[a-z_]=)[A-Z]{3,}\b")


def test_every_block_names_its_language():
    unnamed = [block.name for block in BLOCKS if not block.language]
    assert unnamed == [], f"fenced blocks without a language (bash, python, yaml, text, ...): {unnamed}"


def test_the_docs_have_runnable_blocks_and_every_marker_says_why():
    assert sum(block.is_run for block in BLOCKS) >= 15
    assert all(block.reason for block in BLOCKS if block.marker == "illustration"), \
        [block.name for block in BLOCKS if block.marker and not block.reason]


@pytest.mark.parametrize("block", [block for block in BLOCKS if block.is_run and block.language == "bash"],
                         ids=lambda block: block.name)
def test_a_runnable_block_has_no_placeholder(block):
    code = "\n".join(re.sub(r"\s#.*$", "", line) for line in block.text.splitlines())   # comments may name them
    assert PLACEHOLDER.findall(code) == [], f"{block.name}: replace the placeholders or mark it an illustration"


def write_page(folder: Path, *blocks: str) -> str:
    (folder / "page.md").write_text("# A page\n\n" + "\n".join(f"```bash\n{block}\n```\n" for block in blocks))
    return "page.md"


def environment() -> dict[str, str]:
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def test_a_broken_command_fails_its_page_and_names_its_block(tmp_path):
    page = write_page(tmp_path, "asyncrl config show rollout.n=2", "asyncrl config show rollout.nn=2\necho after")
    run = run_page(tmp_path, page, environment())
    assert run.returncode != 0
    assert block_that_failed(run) == "### doc block page.md:7"
    assert "rollout.nn" in run.output and "after" not in run.output.split("page.md:7")[1]


def test_a_process_left_running_by_a_page_is_found_and_stopped(tmp_path):
    page = write_page(tmp_path, "sleep 300 &\necho started")
    run = run_page(tmp_path, page, environment())
    assert run.returncode == 0 and "started" in run.output
    assert len(run.leftover) == 1 and run.leftover[0].split(" ", 1)[1].startswith("sleep 300")
    stat = Path(f"/proc/{run.leftover[0].split()[0]}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"   # and stopped


def test_no_runnable_block_installs_packages():
    # The install command is the README's (ci:install); the docs test runs inside that venv and must not change it.
    installs = [block.name for block in BLOCKS if block.is_run and re.search(r"(^|\s)pip3? install", block.text)]
    assert installs == [], installs
