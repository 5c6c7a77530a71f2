"""Runs killed with SIGKILL and resumed: a fully-async run killed at three different points trains every
prompt of the epoch exactly once (checkpoints hold the data cursor, the queue and the parked partial
samples) and still learns; a one_step_off run killed mid-epoch and resumed trains every prompt once too (the
batch generated ahead at the kill is generated again, not lost or trained twice); killed and resumed, every step
of a fully_async or one_step_off run trains at the policy version an uninterrupted run of the same cadence trains it
at (a checkpoint names its weights by the version they carry). The uninterrupted runs' versions are asserted where
those runs are made: tests/e2e/test_fully_async.py (a sync every 2 steps) and tests/e2e/test_one_step_off.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as parquet

from asyncrl.config import dump_config
from asyncrl.telemetry import read_metrics


def last_step(output_dir: Path) -> int:
    try:
        return max((row["step"] for row in read_metrics(output_dir / "metrics.jsonl")), default=-1)
    except (FileNotFoundError, ValueError):
        return -1


def run_until(config_path: Path, output_dir: Path, kill_after_step: int | None, timeout_s: float = 420) -> int:
    """Run `asyncrl train` in its own session; SIGKILL the whole session once `kill_after_step` was logged."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen([sys.executable, "-m", "asyncrl.cli", "train", str(config_path)], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while process.poll() is None and time.monotonic() < deadline:
        if kill_after_step is not None and last_step(output_dir) >= kill_after_step:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return -9
        time.sleep(0.2)
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        raise AssertionError(f"run did not finish in {timeout_s}s")
    assert process.returncode == 0, process.stderr.read().decode()[-3000:]
    return 0


def trained_versions(output_dir: Path) -> dict[int, int]:
    """The policy version each training step trained at (`param_version` of its metrics line)."""
    return {row["step"]: int(row["param_version"]) for row in read_metrics(output_dir / "metrics.jsonl")
            if "critic/score/mean" in row}


def trained_prompts(output_dir: Path, num_steps: int) -> Counter:
    """How many times each prompt was trained, from the rollouts the steps dumped (one sample per group)."""
    rollouts = output_dir / "rollouts"
    return Counter(json.loads(line)["prompt_id"] for step in range(1, num_steps + 1)
                   for line in (rollouts / f"step_{step}.jsonl").read_text().splitlines()
                   if json.loads(line)["sample_index"] == 0)


def test_sigkill_at_three_points_then_resume_trains_every_prompt_once(make_config, warm_policy, tmp_path):
    output_dir = tmp_path / "killed"
    epoch = tmp_path / "epoch.parquet"  # an epoch of 96 prompts: 12 steps of 8
    parquet.write_table(parquet.read_table(warm_policy["train"]).slice(0, 96), epoch)
    config = make_config("trainer.mode=fully_async", "rollout.n_gpus_per_node=1", "trainer.dump_rollouts=true",
                         f"data.train_files=[{epoch}]", "data.train_batch_size=8",
                         "actor.ppo_mini_batch_size=8", "trainer.save_freq=1",
                         "async_training.trigger_parameter_sync_step=2", "async_training.staleness_threshold=0.5",
                         "async_training.partial_rollout=true", "trainer.test_freq=0", "ray.num_cpus=2",
                         f"trainer.output_dir={output_dir}")
    config_path = tmp_path / "run.yaml"
    config_path.write_text(dump_config(config))
    for kill_after in (1, 5, 8):   # mid-cycle before any checkpoint, mid-cycle, just after a sync
        assert run_until(config_path, output_dir, kill_after) == -9
    assert run_until(config_path, output_dir, None) == 0
    summary = json.loads((output_dir / "summary.json").read_text())
    assert summary["last_step"] == 12
    trained = trained_prompts(output_dir, 12)
    assert set(trained) == {f"epoch.parquet:{row}" for row in range(96)}  # none lost
    assert set(trained.values()) == {1}, trained.most_common(3)            # none repeated
    # A sync every 2 steps, as uninterrupted: steps 1-2 at version 0, 3-4 at 1, ... (checkpointed inside the
    # sync, before the push), whichever segment trained the step.
    assert trained_versions(output_dir) == {step: (step - 1) // 2 for step in range(1, 13)}
    scores = [row["critic/score/mean"] for row in read_metrics(output_dir / "metrics.jsonl") if "critic/score/mean" in row]
    assert len(scores) == 12 and sum(scores[-3:]) / 3 > sum(scores[:3]) / 3 + 0.1, scores
    initial = next(row["val/score/mean"] for row in read_metrics(output_dir / "metrics.jsonl") if row["step"] == 0)
    assert summary["final_validation"]["val/score/mean"] >= initial + 0.2, (initial, summary["final_validation"])


def test_a_one_step_off_run_killed_mid_run_resumes_at_the_versions_of_an_uninterrupted_run(make_raw_config,
                                                                                          tmp_path, raw_policy):
    output_dir = tmp_path / "killed"
    epoch = tmp_path / "epoch.parquet"  # 8 steps of 8
    parquet.write_table(parquet.read_table(raw_policy["train"]).slice(0, 64), epoch)
    config = make_raw_config("trainer.mode=one_step_off", "rollout.n_gpus_per_node=1", f"data.train_files=[{epoch}]",
                             "data.train_batch_size=8", "actor.ppo_mini_batch_size=8", "trainer.save_freq=1",
                             "trainer.dump_rollouts=true", "trainer.val_before_train=false", "data.val_files=[]",
                             "ray.num_cpus=2", f"trainer.output_dir={output_dir}")
    config_path = tmp_path / "run.yaml"
    config_path.write_text(dump_config(config))
    assert run_until(config_path, output_dir, 3) == -9
    resumed_from = max(int(folder.name.removeprefix("step_")) for folder in (output_dir / "checkpoints").glob("step_*")
                       if folder.name.removeprefix("step_").isdigit())
    assert 2 <= resumed_from < 8
    assert run_until(config_path, output_dir, None) == 0
    # Step s pushes the weights of step s - 1 first, so it trains at version s, as uninterrupted.
    assert trained_versions(output_dir) == {step: step for step in range(1, 9)}
    # The batch in flight at the kill was regenerated by the checkpoint's weights, which it then trained:
    # staleness 0 there, and 1 at every other step, as at every step of an uninterrupted run.
    staleness = {row["step"]: row["staleness/mean"] for row in read_metrics(output_dir / "metrics.jsonl")
                 if "critic/score/mean" in row}
    assert staleness == {step: 0.0 if step == resumed_from + 1 else 1.0 for step in range(1, 9)}, staleness
    # Every prompt of the epoch trained once: none lost with the batch in flight at the kill, none repeated.
    assert trained_prompts(output_dir, 8) == Counter({f"epoch.parquet:{row}": 1 for row in range(64)})
