"""SIGKILL for this run's rollout replica once the run has logged a given step, for fault tests.

    killer = ReplicaKiller(monkeypatch, ray_session, output_dir, after_step=2)   # before train(config)
    summary = train(config)
    killer.join()          # killer.killed: the process id; killer.children: its child processes at the kill

The replicas are this run's, as the runtime launches them (its `launch_replicas` is wrapped): the fault hits this
run's replica, by the process id it reports, whatever else runs on the machine.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import psutil

from asyncrl.launch import runtime
from asyncrl.telemetry import read_metrics


def last_step(output_dir: Path) -> int:
    try:
        return max((row["step"] for row in read_metrics(output_dir / "metrics.jsonl")), default=-1)
    except (FileNotFoundError, ValueError):
        return -1


class ReplicaKiller:
    def __init__(self, monkeypatch, ray_session, output_dir: Path, after_step: int, timeout_s: float = 600.0):
        self.replicas: list = []
        self.killed: list[int] = []
        self.children: list[psutil.Process] = []
        launch = runtime.launch_replicas

        def launch_and_keep(*args):
            self.replicas.extend(launch(*args))
            return list(self.replicas)

        monkeypatch.setattr(runtime, "launch_replicas", launch_and_keep)

        def kill_after_step() -> None:
            deadline = time.monotonic() + timeout_s
            while last_step(output_dir) < after_step and time.monotonic() < deadline:
                time.sleep(0.1)
            (replica,) = self.replicas
            pid = ray_session.get(replica.pid.remote(), timeout=60)
            self.children = psutil.Process(pid).children(recursive=True)
            os.kill(pid, signal.SIGKILL)
            self.killed.append(pid)

        self.thread = threading.Thread(target=kill_after_step, daemon=True)
        self.thread.start()

    def join(self) -> None:
        self.thread.join(timeout=10)
