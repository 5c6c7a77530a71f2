"""Start scoring processes and wait until each has loaded the reward function, or fail naming it.

    check_reward_function("my_reward.py:compute_score", import_timeout_s=120)   # before Ray starts

The check is the only place the driver touches a reward module, and it does so in a scoring process: a module
whose top level hangs, exits or raises stops the run with a `RewardLoadError` naming the file and the cause
("did not load within 120s", "exited with code 0 while loading it", the exception's last line), and none of
its code runs in the driver.
"""

from __future__ import annotations

import multiprocessing
import time
from typing import Optional

from asyncrl.rewards.limits import ScoringLimits
from asyncrl.rewards.process import ScoringProcess, stop_all

DEFAULT_IMPORT_TIMEOUT_S = 120.0  # spawning re-imports the main module (torch, for `asyncrl train`) on a busy host


def spawn_context():
    # Spawned, not forked: a forked child would inherit the driver's threads, torch and Ray state.
    return multiprocessing.get_context("spawn")


def start_scoring_processes(spec: str, count: int, limits: ScoringLimits,
                            import_timeout_s: float) -> list[ScoringProcess]:
    """`count` processes with the function loaded; on a failure every one is killed and RewardLoadError
    raised."""
    context = spawn_context()
    processes = []
    try:
        processes += [ScoringProcess(context, spec, limits, import_timeout_s) for _ in range(count)]
        for process in processes:  # all started first, then waited for: they load concurrently
            process.connection.poll(max(0.0, process.deadline - time.monotonic()))
            process.finish_loading()
    except BaseException:
        for process in processes:
            process.kill()
        raise
    return processes


def check_reward_function(spec: str, import_timeout_s: float = DEFAULT_IMPORT_TIMEOUT_S,
                          max_memory_mb: Optional[float] = None) -> None:
    """Load the function in one scoring process under the import timeout (and memory limit), then stop it;
    raises RewardLoadError naming the file when it cannot. For the composition root, before Ray starts."""
    stop_all(start_scoring_processes(spec, 1, ScoringLimits(max_memory_mb=max_memory_mb), import_timeout_s))
