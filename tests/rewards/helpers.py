"""Shared by the reward tests: reward files written to a temporary folder, requests, process states."""

import textwrap
import time
from pathlib import Path

from asyncrl.rewards import RewardRequest


def write_reward_file(folder: Path, source: str, name: str = "reward.py") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(source))
    return path


def requests(*texts: str) -> list[RewardRequest]:
    return [RewardRequest("custom", text, "yes", {}) for text in texts]


def scores(results) -> list[float]:
    return [result.score for result in results]


def wait_until_dead(pid: int, within_s: float = 30.0) -> None:
    """Until the process has exited (a zombie not yet reaped, or gone): the state its parent meets next."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                         if line.startswith("State:"))
        except FileNotFoundError:
            return
        if "zombie" in state:
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} still alive after {within_s}s")
