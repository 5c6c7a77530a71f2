"""Ends a local Ray cluster's processes when the driver that started it dies, however it dies (SIGKILL too).

    python cluster_reaper.py DRIVER_PID DRIVER_START ROOT_PID:ROOT_START ...   (started by `start_ray`)

Ray ties its raylet and GCS to the driver (the kernel signals them when it dies), but the agents the raylet
starts only exit after failing to report to the dead GCS, a minute later, and anything they started lingers
too. This process, in a session of its own, follows the cluster's processes (the roots the driver names and
everything below them, looked up once a second) and kills every one still alive when the driver is gone, or
when the driver closes this process's stdin (a deliberate shutdown: only leftovers remain then).

Run as a script, it imports nothing of asyncrl (so it starts in milliseconds); it reads Linux's /proc.
A process is named by (pid, start time), so a reused pid is never killed.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from pathlib import Path

POLL_S = 1.0
Process = tuple[int, int]  # (pid, start time in clock ticks since boot)


def start_time(pid: int) -> int | None:
    """The process's start time, or None when it is gone (a zombie counts as gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else int(fields[19])


def parents() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, start time) of every process."""
    table: dict[int, tuple[int, int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        table[int(entry.name)] = (int(fields[1]), int(fields[19]))
    return table


def descendants(tracked: set[Process]) -> set[Process]:
    """Those of `tracked` still alive and every process below one of them."""
    table = parents()
    found = {process for process in tracked if table.get(process[0], (0, -1))[1] == process[1]}
    while True:
        pids = {pid for pid, _ in found}
        below = {(pid, start) for pid, (parent, start) in table.items() if parent in pids} - found
        if not below:
            return found
        found |= below


def kill(tracked: set[Process]) -> None:
    for pid, start in tracked:
        if start_time(pid) == start:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def main(arguments: list[str]) -> None:
    driver = (int(arguments[0]), int(arguments[1]))
    tracked = {(int(pid), int(start)) for pid, start in (root.split(":") for root in arguments[2:])}
    while start_time(driver[0]) == driver[1]:
        readable, _, _ = select.select([sys.stdin], [], [], POLL_S)
        tracked = descendants(tracked)
        if readable and not sys.stdin.buffer.read1(64):
            break  # the driver closed the pipe: shut down on purpose
    kill(descendants(tracked))


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver's Ctrl-C is the driver's
    main(sys.argv[1:])
