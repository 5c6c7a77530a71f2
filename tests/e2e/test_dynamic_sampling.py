"""Dynamic sampling and overlong shaping end to end through real Ray actors (trainer rank, rollout replica,
rollouter and queue): in fully_async only groups whose rewards vary are trained, and the rollouter's counters add
up (generated = trained + filtered); the trained reward is the score plus DAPO's overlong penalty; the
per-version records of metrics_by_version.jsonl aggregate the per-step ones."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from asyncrl.launch import train
from asyncrl.telemetry import read_metrics
from tests.e2e.tiny_runs import tiny_config_factory

FULLY_ASYNC = ("trainer.mode=fully_async", "rollout.n_gpus_per_node=1", "trainer.dump_rollouts=true",
               "trainer.val_before_train=false", "data.val_files=[]")
BUDGET, BUFFER, FACTOR = 6, 3, 0.5   # data.max_response_length, the overlong buffer
NUM_PROMPTS = 32


@pytest.fixture()
def tiny_config(tmp_path):
    return tiny_config_factory(tmp_path, NUM_PROMPTS, BUDGET)


def dumped_groups(output_dir: str) -> dict[int, dict[str, list[dict]]]:
    """{step: {prompt id: [sample, ...]}} from rollouts/step_N.jsonl."""
    steps: dict[int, dict[str, list[dict]]] = {}
    for path in (Path(output_dir) / "rollouts").glob("step_*.jsonl"):
        groups: dict[str, list[dict]] = defaultdict(list)
        for line in path.read_text().splitlines():
            sample = json.loads(line)
            groups[sample["prompt_id"]].append(sample)
        steps[int(path.stem.split("_")[1])] = groups
    return steps


def penalty(num_tokens: int) -> float:
    """By hand: 0 up to BUDGET - BUFFER = 3 tokens, then -(L - 3) / 3 x 0.5."""
    return min(0.0, -(num_tokens - (BUDGET - BUFFER)) / BUFFER * FACTOR)


def test_fully_async_trains_only_groups_with_signal_and_its_counters_add_up(tiny_config, ray_session):
    config = tiny_config(*FULLY_ASYNC, "actor.ppo_mini_batch_size=4",
                         "async_training.trigger_parameter_sync_step=2", "async_training.staleness_threshold=0.5",
                         "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc",
                         "reward.overlong_buffer.enable=true", f"reward.overlong_buffer.len={BUFFER}",
                         f"reward.overlong_buffer.penalty_factor={FACTOR}")
    summary = train(config)
    output = config.trainer.output_dir
    steps = dumped_groups(output)
    assert sorted(steps) == list(range(1, summary["steps"] + 1))
    trained_groups = [group for groups in steps.values() for group in groups.values()]
    # Only groups whose scores vary were trained (without an acc extra, acc is the score).
    assert all(len({sample["score"] for sample in group}) > 1 for group in trained_groups)
    assert all(len(group) == config.rollout.n for group in trained_groups)

    # The rollouter's counters at the end of the run: every prompt of the data was generated once, and
    # generated = trained + filtered, some groups being filtered (every even answer's).
    records = [json.loads(line) for line in (Path(output) / "metrics_by_version.jsonl").read_text().splitlines()]
    final = records[-1]
    generated, filtered = final["fully_async/count/generated_groups"], final["fully_async/count/filtered_groups"]
    assert generated == NUM_PROMPTS
    assert generated == len(trained_groups) + filtered
    assert filtered > 0 and len(trained_groups) > 0
    assert final["fully_async/count/queued_groups"] == len(trained_groups)
    # Per version, the filter/* metrics of the versions add up to the same totals.
    assert sum(record["filter/num_generated_groups"] for record in records) == generated
    assert sum(record["filter/num_filtered_groups"] for record in records) == filtered

    # The trained reward is the score plus the overlong penalty, computed by hand from each response's length.
    rows = {row["step"]: row for row in read_metrics(f"{output}/metrics.jsonl") if "critic/score/mean" in row}
    for step, groups in steps.items():
        rewards = [sample["score"] + penalty(sample["num_tokens"]) for group in groups.values() for sample in group]
        assert rows[step]["critic/score/mean"] == pytest.approx(sum(rewards) / len(rewards), abs=1e-5), step
    assert any(sample["num_tokens"] > BUDGET - BUFFER for group in trained_groups for sample in group)

    # Per-version records: K = 2 steps each (the last may be shorter), timings summed, counts the last value.
    assert sum(record["num_steps"] for record in records) == summary["steps"]
    assert [record["synced_version"] for record in records] == list(range(1, len(records) + 1))
    assert [record["param_version"] for record in records] == list(range(len(records)))
    assert all(record["num_steps"] == 2 for record in records[:-1])
    for record in records:
        first, last = record["first_step"], record["last_step"]
        assert record["timing_s/update_actor"] == pytest.approx(
            sum(rows[step]["timing_s/update_actor"] for step in range(first, last + 1)))
        assert record["staleness/max"] == max(rows[step]["staleness/max"] for step in range(first, last + 1))
        assert record["actor/pg_loss"] == pytest.approx(
            sum(rows[step]["actor/pg_loss"] for step in range(first, last + 1)) / record["num_steps"])


@pytest.mark.parametrize("mode", ["sync", "one_step_off"])
def test_sync_modes_fill_each_step_with_groups_with_signal(tiny_config, ray_session, mode):
    """Each step draws batches of 4 prompts until 4 groups have signal; per step generated = trained + filtered +
    surplus, and every trained group's scores vary."""
    config = tiny_config(f"trainer.mode={mode}", "rollout.n_gpus_per_node=1", "trainer.dump_rollouts=true",
                         "data.train_batch_size=4", "actor.ppo_mini_batch_size=4", "trainer.total_steps=2",
                         "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=score")
    summary = train(config)
    assert summary["steps"] == 2
    rows = {row["step"]: row for row in read_metrics(f"{config.trainer.output_dir}/metrics.jsonl")
            if "filter/num_generated_groups" in row}
    steps = dumped_groups(config.trainer.output_dir)
    for step in (1, 2):
        row, groups = rows[step], steps[step]
        assert len(groups) == row["filter/num_trained_groups"] == 4
        assert all(len({sample["score"] for sample in group}) > 1 for group in groups.values())
        assert row["filter/num_generated_groups"] == 4 * row["filter/num_gen_batches"]
        assert row["filter/num_generated_groups"] == row["filter/num_trained_groups"] + \
            row["filter/num_filtered_groups"] + row["filter/num_surplus_groups"]
    assert sum(row["filter/num_filtered_groups"] for row in rows.values()) > 0
