"""Reward code is imported only in scoring processes, under a time limit: a module that hangs, exits or raises
at import fails the check (and the executor) with the file named, and nothing of it runs in the caller."""

import os
import time

import pytest

from asyncrl.rewards import RewardExecutor, RewardLoadError, RewardRequest, check_reward_function
from tests.rewards.helpers import requests, scores, write_reward_file

SCORE = """
def score(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0
"""


def test_a_module_that_hangs_at_import_fails_within_the_import_timeout_naming_the_file(tmp_path):
    path = write_reward_file(tmp_path, "import time\ntime.sleep(600)\n" + SCORE, "hangs_at_import.py")
    started = time.monotonic()
    with pytest.raises(RewardLoadError, match=rf"reward function {path}:score did not load within 3s"):
        check_reward_function(f"{path}:score", import_timeout_s=3)
    # The bug this replaces waited forever; the bound only has to be finite and generous.
    assert time.monotonic() - started < 3 + 30
    with pytest.raises(RewardLoadError, match=rf"{path}:score did not load within 3s"):
        RewardExecutor(f"{path}:score", timeout_s=5, num_workers=2, import_timeout_s=3)


@pytest.mark.parametrize("code", [0, 5])
def test_a_module_that_exits_at_import_fails_naming_the_file_and_the_exit_code(tmp_path, code):
    path = write_reward_file(tmp_path, f"import os\nos._exit({code})\n" + SCORE, "exits_at_import.py")
    with pytest.raises(RewardLoadError, match=rf"reward function {path}:score: its scoring process exited with "
                                              rf"code {code} while loading it"):
        check_reward_function(f"{path}:score")


@pytest.mark.parametrize("statement, cause", [
    ("1 / 0", r"ZeroDivisionError: division by zero \(line 2\)"),
    ("raise SystemExit(4)", r"SystemExit: 4 \(line 2\)"),
    ("import no_such_module_for_a_reward",
     r"ModuleNotFoundError: No module named 'no_such_module_for_a_reward' \(line 2\)"),
    ("def broken(:", r"SyntaxError: invalid syntax \(raises_at_import.py, line 2\)"),
])
def test_a_module_that_raises_at_import_fails_with_the_tracebacks_last_line_and_the_line(tmp_path, statement, cause):
    path = write_reward_file(tmp_path, f"import os\n{statement}\n" + SCORE, "raises_at_import.py")
    message = rf"^reward function file {path} failed to import: {cause}$"
    with pytest.raises(RewardLoadError, match=message):
        check_reward_function(f"{path}:score")
    with pytest.raises(RewardLoadError, match=message):
        RewardExecutor(f"{path}:score", timeout_s=5)


def test_a_package_module_that_raises_at_import_is_named(tmp_path, monkeypatch):
    write_reward_file(tmp_path, "raise RuntimeError('no API key')\n" + SCORE, "broken_scorer_module.py")
    monkeypatch.syspath_prepend(tmp_path)  # a spawned process starts with its parent's sys.path
    with pytest.raises(RewardLoadError, match=r"reward function 'broken_scorer_module:score': module "
                                              r"'broken_scorer_module' failed to import: RuntimeError: no API key"):
        check_reward_function("broken_scorer_module:score")


def test_reward_code_runs_only_in_the_scoring_processes(tmp_path):
    marker = tmp_path / "imported_by.txt"
    path = write_reward_file(tmp_path, f"""
        import os
        with open({str(marker)!r}, "a") as marker:
            marker.write(f"{{os.getpid()}}\\n")

        def score(data_source, solution_str, ground_truth, extra_info=None):
            return float(os.getpid())
    """)
    check_reward_function(f"{path}:score")
    assert len(marker.read_text().split()) == 1  # the check's own process, since stopped
    executor = RewardExecutor(f"{path}:score", timeout_s=10, num_workers=2)
    try:
        importers = [int(pid) for pid in marker.read_text().split()]
        assert sorted(importers[1:]) == sorted(executor.pids()) and len(importers) == 3
        assert os.getpid() not in importers
        assert set(scores(executor.score(requests("a", "b", "c")))) <= {float(pid) for pid in executor.pids()}
    finally:
        executor.close()


def test_the_memory_limit_covers_the_modules_imports(tmp_path):
    path = write_reward_file(tmp_path, "ballast = bytearray(2 ** 34)\n" + SCORE, "heavy_at_import.py")
    with pytest.raises(RewardLoadError, match=rf"reward function file {path} failed to import: MemoryError"):
        check_reward_function(f"{path}:score", max_memory_mb=256)


def test_the_built_in_scorer_loads_from_an_empty_spec():
    check_reward_function("")
    executor = RewardExecutor("", timeout_s=10)
    try:
        results = executor.score([RewardRequest("asyncrl/arithmetic", "42", "42", {})])
        assert scores(results) == [1.0]
    finally:
        executor.close()
