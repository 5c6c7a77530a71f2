"""Ctrl-C as a terminal sends it: SIGINT to the whole process group of `asyncrl train` (the driver, the Ray
processes it started and the scoring processes). Each time the run finishes its step, saves a checkpoint and
exits 0; five interrupts and five resumes later the epoch is done with every prompt trained exactly once."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as parquet
import pytest

from asyncrl.config import dump_config
from asyncrl.launch import train
from asyncrl.recipes import training_loop
from asyncrl.telemetry import read_metrics

# An epoch of 320 prompts, 8 per step: a segment trains a step or three before its interrupt lands (the
# poll sees a new step, then the signal ends the step in progress), so the five segments stay well inside it.
NUM_STEPS = 40
NUM_INTERRUPTS = 5


def last_step(output_dir: Path) -> int:
    try:
        return max((row["step"] for row in read_metrics(output_dir / "metrics.jsonl")), default=0)
    except (FileNotFoundError, ValueError):
        return 0


def start(config_path: Path, log_path: Path) -> subprocess.Popen:
    """`asyncrl train` as a shell starts it: the leader of a process group of its own."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log_path.open("w") as log:
        return subprocess.Popen([sys.executable, "-m", "asyncrl.cli", "train", str(config_path)], env=env,
                                stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)


def scorer_pids(log: str) -> list[int]:
    """The driver's scoring processes, from the run's start-up line `processes: ..., reward/scorer0 pid N, ...`."""
    line = next(line for line in log.splitlines() if "processes: " in line)
    return [int(pid) for pid in re.findall(r"reward/scorer\d+ pid (\d+)", line)]


def is_gone(pid: int) -> bool:
    """Exited (a zombie not reaped yet counts: it runs nothing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True


def interrupt_after_a_new_step(process: subprocess.Popen, output: Path, log_path: Path, after: int) -> str:
    """Wait until a step past `after` is logged, Ctrl-C the process group, return the run's stdout."""
    deadline = time.monotonic() + 300
    while last_step(output) <= after:
        assert process.poll() is None, log_path.read_text()[-3000:]
        assert time.monotonic() < deadline, f"no step past {after} within 300s: {log_path.read_text()[-2000:]}"
        time.sleep(0.1)
    os.killpg(process.pid, signal.SIGINT)
    stdout, _ = process.communicate(timeout=300)
    return stdout


@pytest.mark.timeout(1200)   # six runs through Ray; about two minutes on an idle 2-core machine
def test_ctrl_c_to_the_process_group_saves_and_exits_0_five_times_then_the_epoch_completes(make_raw_config,
                                                                                             raw_policy, tmp_path):
    epoch = tmp_path / "epoch.parquet"
    parquet.write_table(parquet.read_table(raw_policy["train"]).slice(0, 8 * NUM_STEPS), epoch)
    config = make_raw_config(f"data.train_files=[{epoch}]", "data.train_batch_size=8", "actor.ppo_mini_batch_size=8",
                         "trainer.dump_rollouts=true", "trainer.val_before_train=false", "data.val_files=[]",
                         "trainer.save_freq=-1", "ray.num_cpus=2", "reward.num_workers=2")
    config_path = tmp_path / "run.yaml"
    config_path.write_text(dump_config(config))
    output = Path(config.trainer.output_dir)
    stopped_at = [0]
    for attempt in range(NUM_INTERRUPTS):
        log_path = tmp_path / f"segment{attempt}.log"
        process = start(config_path, log_path)
        stdout = interrupt_after_a_new_step(process, output, log_path, stopped_at[-1])
        log = log_path.read_text()
        assert process.returncode == 0, (attempt, process.returncode, log[-3000:])
        assert "stopped by SIGINT after" in stdout, (stdout, log[-3000:])
        assert "Traceback" not in log and "KeyboardInterrupt" not in log, log[-3000:]
        scorers = scorer_pids(log)
        assert len(scorers) == 2 and all(is_gone(pid) for pid in scorers)   # logged at start, closed at the end
        step = int(stdout.split("stopped by SIGINT after step ")[1].split()[0])
        assert stopped_at[-1] < step < NUM_STEPS, (stopped_at, step)
        assert (output / "checkpoints" / f"step_{step}" / "driver.json").is_file()  # save_freq=-1: the stop saved it
        stopped_at.append(step)
    final = start(config_path, tmp_path / "final.log")
    stdout, _ = final.communicate(timeout=600)
    assert final.returncode == 0, (tmp_path / "final.log").read_text()[-3000:]
    assert json.loads((output / "summary.json").read_text())["last_step"] == NUM_STEPS
    steps = [row["step"] for row in read_metrics(output / "metrics.jsonl") if "critic/score/mean" in row]
    assert steps == list(range(1, NUM_STEPS + 1))   # one line per step: each resume replaced nothing it kept
    trained = Counter(json.loads(line)["prompt_id"] for step in range(1, NUM_STEPS + 1)
                      for line in (output / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()
                      if json.loads(line)["sample_index"] == 0)
    assert set(trained) == {f"epoch.parquet:{row}" for row in range(8 * NUM_STEPS)}   # none lost
    assert set(trained.values()) == {1}, trained.most_common(3)                       # none repeated


def test_ctrl_c_while_the_run_finishes_lets_it_finish(make_raw_config, ray_session, monkeypatch):
    """A SIGINT while the last step's end runs (final checkpoint, export, plots) is the stop the run is already
    making: it completes, with its summary and plots, and raises nothing."""
    plot_run = training_loop.plot_run

    def interrupted_while_plotting(output_dir):
        os.kill(os.getpid(), signal.SIGINT)   # as Ctrl-C in the terminal, to the driver's main thread
        return plot_run(output_dir)

    monkeypatch.setattr(training_loop, "plot_run", interrupted_while_plotting)
    config = make_raw_config("trainer.total_steps=2", "data.train_batch_size=8", "actor.ppo_mini_batch_size=8",
                             "trainer.val_before_train=false", "data.val_files=[]")
    summary = train(config)
    assert summary["steps"] == 2 and "stopped_by" not in summary
    output = Path(config.trainer.output_dir)
    assert json.loads((output / "summary.json").read_text())["steps"] == 2
    assert (output / "policy" / "config.json").is_file() and list((output / "plots").glob("*.png"))
