"""The learning-rate schedule spans the run as each mode really trains it: warmup then cosine decay that
reaches its floor exactly at the last step, whose count the test derives from the data, not from the code.

Each mode trains a short epoch of prompts through real Ray actors; `actor/lr` (logged after each update's
scheduler step) must equal the hand-computed schedule for the number of steps the run took."""

from __future__ import annotations

import math

import pyarrow.parquet as pq
import pytest

from asyncrl.launch import train
from asyncrl.telemetry import read_metrics

PEAK_LR = 1e-4
NUM_PROMPTS = 40


def expected_lr(updates_done: int, total: int, warmup: int, floor: float) -> float:
    """Linear warmup over `warmup` updates, then cosine from the peak to `floor` x peak at `total`."""
    if updates_done < warmup:
        return PEAK_LR * (updates_done + 1) / (warmup + 1)
    progress = min(1.0, (updates_done - warmup) / (total - warmup))
    return PEAK_LR * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


@pytest.mark.parametrize("mode, overrides, prompts_per_step", [
    ("sync", ("data.train_batch_size=16", "actor.ppo_mini_batch_size=16"), 16),
    ("one_step_off", ("data.train_batch_size=16", "actor.ppo_mini_batch_size=16", "rollout.n_gpus_per_node=1"), 16),
    # fully_async trains R = ppo_mini_batch_size x require_batches prompts per step, whatever train_batch_size says
    ("fully_async", ("data.train_batch_size=32", "actor.ppo_mini_batch_size=4", "async_training.require_batches=2",
                     "rollout.n_gpus_per_node=1"), 8),
])
def test_the_lr_schedule_ends_at_its_floor_on_the_runs_last_step(mode, overrides, prompts_per_step, make_config,
                                                                  warm_policy, tmp_path, ray_session):
    train_file = tmp_path / "train.parquet"
    pq.write_table(pq.read_table(warm_policy["train"]).slice(0, NUM_PROMPTS), train_file)
    warmup, floor = 1, 0.1
    config = make_config(f"trainer.mode={mode}", f"data.train_files=[{train_file}]", "trainer.total_epochs=2",
                         "trainer.test_freq=-1", "trainer.val_before_train=false", f"actor.optim.lr={PEAK_LR}",
                         "actor.optim.lr_scheduler_type=cosine", f"actor.optim.lr_warmup_steps={warmup}",
                         f"actor.optim.min_lr_ratio={floor}", "rollout.n=2", *overrides, output=mode)
    train(config)
    rows = [row for row in read_metrics(f"{config.trainer.output_dir}/metrics.jsonl") if "actor/lr" in row]
    total = math.ceil(NUM_PROMPTS * 2 / prompts_per_step)   # 2 epochs; batches cross the epoch boundary
    assert [row["step"] for row in rows] == list(range(1, total + 1))
    for row in rows:
        assert row["actor/lr"] == pytest.approx(expected_lr(row["step"], total, warmup, floor), rel=1e-6), row["step"]
    assert rows[-1]["actor/lr"] == pytest.approx(floor * PEAK_LR, rel=1e-6)
