"""The docs are tests: every runnable block of README.md and docs/*.md runs as written, in a fresh clone of the
working tree, from a fresh shell per page (`doc_blocks.page_script`), README.md first and then each page of docs/
in order, as a new user reads them after the README's first hour.

What is not run, on purpose: the install and the test command (ci:install, ci:test: the suite already runs inside
an installed venv, whose `asyncrl` runs the clone's code through PYTHONPATH; `.ci/run` runs them for real) and
the blocks marked as an illustration (they need a user's own files, machines or GPU, or sketch code that lives
in a file). Two things differ from a user's terminal, both to fit the suite's budget: the demos'
setups (data and SFT warm starts) are the session's, made once by `asyncrl demo --setup-only` and placed where
the demo caches them (so every demo reuses them as it would after a user's own `--setup-only`), and every
`asyncrl train` / `python examples/...` command gets `trainer.total_steps=4` (`TRAIN_STEPS`); demos and
benchmarks run whole.

A page fails when a command fails (`set -e`), when it leaves a process running (a server it started and did not
stop), or when the clone holds an untracked file afterwards (everything lands under ignored folders). What the
runs printed and wrote is checked further by the tests below: the README demo's figures, the advice, the
train command's final validation.

Cost: 23 minutes for tests/docs on the 2-core VM at load average 3-14 from other work, the tools and longtail
warm starts included (pages, measured one by one at load ~5: README 6.5 min, lora 4.6, agents 2.9, the others
under a minute each). The README's demos, longtail runs and `bench modes` are most of it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.docs.doc_blocks import BLOCK_START, DocBlock, doc_blocks, page_script
from tests.e2e.test_agents import assert_the_tools_demo_learned

pytestmark = [pytest.mark.slow, pytest.mark.timeout(5400)]

REPO = Path(__file__).resolve().parents[2]
PAGES = ("README.md", *sorted(f"docs/{path.name}" for path in (REPO / "docs").glob("*.md")))
TRAIN_STEPS = 4
PAGE_TIMEOUT_S = 2700  # generous: a page's demos took minutes each on a 2-core machine shared with other work
# Folders of a working tree that are not part of a fresh clone (the same as .gitignore's and git's own).
NOT_CLONED = (".git", ".venv", "outputs", "runs", "build", "dist", "__pycache__", ".pytest_cache", "*.egg-info",
              ".devbundle")
CAPPED = re.compile(r"^(asyncrl train |python examples/)")


@dataclass
class PageRun:
    page: str
    returncode: int
    output: str
    leftover: list[str]    # processes of the page's session still running after its script ended


def fresh_clone(target: Path) -> Path:
    """The working tree as a new repository: tracked and untracked files that git does not ignore (as .ci/run
    copies them), committed once, so `git status` shows what the commands leave behind."""
    if (REPO / ".git").exists():
        listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                                capture_output=True).stdout.decode().split("\0")
        for name in filter(None, listed):
            if (REPO / name).is_file():
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / name, target / name)
    else:
        shutil.copytree(REPO, target, ignore=shutil.ignore_patterns(*NOT_CLONED), dirs_exist_ok=True)
    for command in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "clone"]):
        subprocess.run(["git", *command], cwd=target, check=True, capture_output=True)
    return target


def capped(line: str) -> str:
    """A training command with the suite's step budget (before its trailing comment, if any)."""
    if not CAPPED.match(line.strip()):
        return line
    command = re.sub(r"\s+#.*$", "", line)
    return f"{command} trainer.total_steps={TRAIN_STEPS}"


def session_processes(session: int) -> list[str]:
    """'pid command' of every live process (zombies aside) whose session is `session`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == session and fields[0] != "Z":
                command = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                found.append(f"{stat.parent.name} {command}")
        except (OSError, IndexError, ValueError):
            continue   # gone meanwhile
    return found


def run_page(folder: Path, page: str, environment: dict[str, str],
             runs: Callable[[DocBlock], bool] = lambda block: block.is_run) -> PageRun:
    """The page's script (the blocks `runs` picks) in a fresh bash, its own session, in `folder`. Its output goes
    to a file: a process it leaves running would hold a pipe open after the script ends."""
    script = page_script(doc_blocks(folder / page), capped, runs)
    log = folder.parent / f"{folder.name}-{page.replace('/', '-')}.log"
    with log.open("w") as output:
        process = subprocess.Popen(["bash", "-c", script], cwd=folder, env=environment, stdout=output,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        try:
            process.wait(timeout=PAGE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            output.write(f"\n[docs test] {page} ran past {PAGE_TIMEOUT_S} s\n")
    leftover = wait_until_gone(process.pid)   # a process the page stopped may take a moment to exit
    if leftover:
        os.killpg(process.pid, signal.SIGKILL)
        wait_until_gone(process.pid)
    return PageRun(page, process.returncode, log.read_text(), leftover)


def wait_until_gone(session: int, timeout_s: float = 10.0) -> list[str]:
    """The session's processes still running after `timeout_s` (none, once they have exited)."""
    deadline = time.monotonic() + timeout_s
    while (processes := session_processes(session)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return processes


@pytest.fixture(scope="module")
def clone(tmp_path_factory, demo_setups) -> tuple[Path, dict[str, str]]:
    """A fresh clone with the demos' setups in place, and the environment its pages run in."""
    root = fresh_clone(tmp_path_factory.mktemp("docs") / "asyncrl")
    shutil.copytree(demo_setups, root / "outputs" / "demo" / "setup")   # where `asyncrl demo` caches them
    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                   "PYTHONPATH": str(root)}
    return root, environment


@pytest.fixture(scope="module")
def readme(clone) -> PageRun:
    root, environment = clone
    return run_page(root, "README.md", environment)


def block_that_failed(run: PageRun) -> str:
    started = [line for line in run.output.splitlines() if line.startswith(BLOCK_START.split("{")[0])]
    return started[-1] if started else "(before any block)"


def assert_page_ran(run: PageRun) -> None:
    assert run.returncode == 0, f"{run.page}: {block_that_failed(run)} failed\n{run.output[-4000:]}"
    assert not run.leftover, f"{run.page} left processes running: {run.leftover}"


def test_the_readme_runs_as_written(readme, clone):
    assert_page_ran(readme)
    root, _ = clone
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=root, check=True,
                            capture_output=True, text=True).stdout
    assert status == "", status


@pytest.mark.parametrize("page", [page for page in PAGES if page != "README.md" and
                                  any(block.is_run for block in doc_blocks(REPO / page))])
def test_every_page_runs_as_written_after_the_readme(readme, clone, agents_page, page):
    assert_page_ran(readme)
    root, environment = clone
    run = agents_page if page == "docs/agents.md" else run_page(root, page, environment)
    assert_page_ran(run)
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=root, check=True,
                            capture_output=True, text=True).stdout
    assert status == "", f"{page} left untracked files:\n{status}"


def block_outputs(run: PageRun) -> dict[str, str]:
    """What each block of the page printed, by block name (`readme.md:38`)."""
    outputs, name = {}, None
    for line in run.output.splitlines(keepends=True):
        if line.startswith(BLOCK_START.split("{")[0]):
            name = line.strip().rsplit(" ", 1)[1]
            outputs[name] = ""
        elif name is not None:
            outputs[name] += line
    return outputs


def output_of(run: PageRun, command: str) -> str:
    """What the block holding `command` printed: a line of it that is `command`, comment aside, or `command` with
    arguments when `command` ends in a space."""
    def holds(line: str) -> bool:
        line = re.sub(r"\s+#.*$", "", line).strip()
        return line.startswith(command) if command.endswith(" ") else line == command
    (block,) = [block for block in doc_blocks(REPO / run.page)
                if block.is_run and any(holds(line) for line in block.text.replace("\\\n", " ").splitlines())]
    return block_outputs(run)[block.name]


def test_the_readme_demo_learns_what_the_readme_says_and_prints_no_warning(readme, clone, demo_setups):
    assert_page_ran(readme)
    root, _ = clone
    recorded = json.loads((REPO / "docs" / "figures" / "demo_run.json").read_text())
    measured, points = recorded["measured"], recorded["tolerance"]["accuracy_points"] / 100
    summary = json.loads((root / recorded["summary"]).read_text())
    before = summary["initial_validation"]["val/score/mean"]
    after = summary["final_validation"]["val/score/mean"]
    assert after >= before + 0.15 or after >= 0.9, (before, after)  # RL learned
    assert abs(before - measured["accuracy_before"]) <= points, (before, measured)
    assert abs(after - measured["accuracy_after"]) <= points, (after, measured)
    for name in ("metrics.jsonl", "summary.json", "timeline.json", "plots/score_vs_step.png", "policy/config.json"):
        assert (root / "outputs" / "demo" / "arithmetic-sync" / name).is_file(), name
    demo = output_of(readme, "asyncrl demo")
    assert f"{after:.1%} after GRPO" in demo                    # the accuracy it measured
    assert "reusing the data and warm-started model" in demo    # the session's setup, as after --setup-only
    assert "a sync step trains data.train_batch_size = 32 prompts x rollout.n = 8 responses" in demo
    warnings = [line for line in demo.splitlines() if re.search(r"warn", line, re.I)]
    assert warnings == [], warnings


def test_the_readme_job_prints_its_validation_and_advice(readme, clone):
    assert_page_ran(readme)
    job = output_of(readme, "asyncrl train ")
    assert re.search(r"^validation val/score/mean: [\d.]+ before training -> [\d.]+ at step 4$", job, re.M), job
    assert "blocking ray.get" not in job    # fully_async: the rollouter's gets run off its event loop
    # valid advice: a split that keeps a device on each side, a balanced split kept, or why none can be made
    assert re.search(r"[1-9]\d* rollout : [1-9]\d* trainer|the split is balanced|cannot be split", job), job
    assert " 0 rollout :" not in job and " 0 trainer" not in job


@pytest.fixture(scope="module")
def agents_page(readme, clone) -> PageRun:
    """docs/agents.md, run as written (the tools demo in sync and in fully_async), once for the tests below."""
    root, environment = clone
    return run_page(root, "docs/agents.md", environment)


@pytest.mark.parametrize("mode", ["sync", "fully_async"])
def test_the_documented_tools_demo_learns(agents_page, clone, mode):
    """The learning margins of tests/e2e/test_agents.py (which runs one_step_off), on the documented runs."""
    assert_page_ran(agents_page)
    output = clone[0] / "outputs" / "demo" / f"tools-{mode}"
    assert_the_tools_demo_learned(json.loads((output / "summary.json").read_text()), output)
