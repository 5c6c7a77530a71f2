"""Scoring faults in a real sync run (Ray actors, the driver's RewardExecutor and its two scoring processes),
both in one run, as each leaves its own trace:

- a scoring process killed while idle, between two steps, is replaced and the run finishes, losing no sample:
  every sample is scored and none is counted as an error or a timeout beyond the non-finite ones;
- NaN and inf rewards score 0 and are counted, exactly: reward/num_nonfinite (and reward/num_errors) equal the
  number of trained samples whose reward was not finite.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from pathlib import Path

import pyarrow.parquet as parquet

from asyncrl.launch import build_runtime
from asyncrl.recipes.sync import SyncRecipe
from asyncrl.telemetry import read_metrics

NUM_STEPS = 3


def wait_until_dead(pid: int, timeout_s: float = 30) -> None:
    """Until `pid` is gone or a zombie (killed, not reaped yet)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.05)
    raise AssertionError(f"scoring process {pid} still alive {timeout_s}s after SIGKILL")


NONFINITE_REWARD = (  # NaN when the sum ends in 0, inf when it ends in 1
    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
    "    if ground_truth.endswith('0'):\n"
    "        return float('nan')\n"
    "    if ground_truth.endswith('1'):\n"
    "        return float('inf')\n"
    "    return float(solution_str.strip() == ground_truth)\n")


def test_an_idle_scorer_killed_is_replaced_losing_no_sample_and_nonfinite_rewards_score_zero_counted(
        make_raw_config, raw_policy, ray_session, tmp_path):
    reward_file = tmp_path / "nonfinite.py"
    reward_file.write_text(NONFINITE_REWARD)
    config = make_raw_config(f"reward.custom_function={reward_file}:compute_score", "reward.num_workers=2",
                             f"trainer.total_steps={NUM_STEPS}", "data.train_batch_size=8",
                             "actor.ppo_mini_batch_size=8", "trainer.val_before_train=false", "data.val_files=[]",
                             "trainer.dump_rollouts=true")
    runtime = build_runtime(config)
    recipe = SyncRecipe(runtime)
    killed: list[int] = []
    original_step = recipe.step

    def step_then_kill_an_idle_scorer(number: int):
        result = original_step(number)   # the step's scoring is over: every scorer waits for the next batch
        if number == 1:
            pid = runtime.reward.executor.pids()[0]
            os.kill(pid, signal.SIGKILL)
            wait_until_dead(pid)
            killed.append(pid)
        return result

    recipe.step = step_then_kill_an_idle_scorer
    try:
        summary = recipe.fit()
        pids_after = runtime.reward.executor.pids()
    finally:
        runtime.close()
    assert summary["steps"] == NUM_STEPS and len(killed) == 1
    assert killed[0] not in pids_after and len(pids_after) == 2   # replaced
    output = Path(config.trainer.output_dir)
    truths = [row["reward_model"]["ground_truth"] for row in parquet.read_table(raw_policy["train"]).to_pylist()]
    trained = [json.loads(line) for step in range(1, NUM_STEPS + 1)
               for line in (output / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()]
    nonfinite = [sample for sample in trained if truths[int(sample["prompt_id"].rsplit(":", 1)[1])][-1] in "01"]
    assert len(trained) == NUM_STEPS * 8 * config.rollout.n and 0 < len(nonfinite) < len(trained)
    assert all(sample["score"] == 0.0 for sample in nonfinite)   # scored 0, never NaN in the batch
    rows = [row for row in read_metrics(output / "metrics.jsonl") if "reward/num_scored" in row]
    assert [row["step"] for row in rows] == list(range(1, NUM_STEPS + 1))
    assert rows[0]["reward/num_restarts"] == 0 and rows[-1]["reward/num_restarts"] >= 1
    # An idle death costs no sample: the batch after it was scored in full, and the only errors counted are the
    # non-finite rewards, each counted once.
    assert rows[-1]["reward/num_scored"] == len(trained)
    assert rows[-1]["reward/num_nonfinite"] == len(nonfinite)
    assert rows[-1]["reward/num_errors"] == len(nonfinite) and rows[-1]["reward/num_timeouts"] == 0
    assert all(math.isfinite(row["actor/pg_loss"]) and math.isfinite(row["critic/score/mean"]) for row in rows)
