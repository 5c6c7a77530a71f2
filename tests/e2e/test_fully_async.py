"""Fully-async mode through real Ray actors (a trainer rank, a rollout replica, the rollouter and the
queue), asserting on version stamps and counters: the on-policy pipeline equals sync mode, staleness
stays within the budget's bound, partial rollout resumes samples across versions at full length, and
runs end cleanly when the data runs out mid-cycle."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from asyncrl.launch import train
from asyncrl.telemetry import read_metrics

FULLY_ASYNC = ("trainer.mode=fully_async", "rollout.n_gpus_per_node=1", "trainer.dump_rollouts=true",
               "trainer.val_before_train=false", "data.val_files=[]")


def dumped(output_dir: str) -> dict[int, list[dict]]:
    folder = Path(output_dir) / "rollouts"
    return {int(path.stem.split("_")[1]): [json.loads(line) for line in path.read_text().splitlines()]
            for path in folder.glob("step_*.jsonl")}


def training_rows(output_dir: str) -> dict[int, dict]:
    return {row["step"]: row for row in read_metrics(f"{output_dir}/metrics.jsonl") if "critic/score/mean" in row}


def assert_each_version_starts_at_most_its_budget(rows: dict[int, dict], sync_steps: list[int], budget: int) -> None:
    """Work outstanding at a sync (charged to the new version) plus the prompts that version admitted never
    exceed M; a fresh run's first version starts with nothing outstanding. A sync's metrics are logged with
    the step after it (`sync_steps`), so the run's last sync is not seen."""
    outstanding = "fully_async/rollouter/outstanding_at_sync"
    assert sorted(step for step, row in rows.items() if outstanding in row) == sync_steps
    syncs = [rows[step] for step in sync_steps]
    assert all(row["fully_async/rollouter/budget_per_version"] == budget for row in syncs)
    charged = [0.0] + [row[outstanding] for row in syncs]
    for version, row in enumerate(syncs):
        assert charged[version] + row["fully_async/rollouter/admitted_in_version"] <= budget, version
    assert max(charged) > 0  # some work was outstanding at a sync


def test_on_policy_pipeline_has_staleness_zero_and_matches_sync_mode(make_config, ray_session):
    common = ("trainer.total_steps=3", "trainer.val_before_train=false", "data.val_files=[]",
              "data.train_batch_size=8", "actor.ppo_mini_batch_size=8")
    sync = make_config(*common, output="sync")
    train(sync)
    pipeline = make_config(*common, *FULLY_ASYNC, "async_training.trigger_parameter_sync_step=1",
                           "async_training.staleness_threshold=0", output="pipeline")
    train(pipeline)
    rows_sync, rows_pipeline = training_rows(sync.trainer.output_dir), training_rows(pipeline.trainer.output_dir)
    assert sorted(rows_pipeline) == [1, 2, 3]
    for step in (1, 2, 3):
        assert rows_pipeline[step]["staleness/max"] == 0
        for key in ("critic/score/mean", "response_length/mean"):
            assert rows_pipeline[step][key] == rows_sync[step][key], (step, key)
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy"):
            assert rows_pipeline[step][key] == pytest.approx(rows_sync[step][key], rel=1e-4, abs=1e-6), (step, key)


def test_stale_samples_stay_within_the_staleness_bound(make_config, ray_session):
    config = make_config(*FULLY_ASYNC, "trainer.total_steps=8", "data.train_batch_size=8",
                         "actor.ppo_mini_batch_size=8", "async_training.trigger_parameter_sync_step=2",
                         "async_training.staleness_threshold=0.5")
    train(config)
    rows = training_rows(config.trainer.output_dir)
    assert sorted(rows) == list(range(1, 9))
    assert max(row["staleness/max"] for row in rows.values()) <= 1  # ceil(s) = 1
    assert max(row["staleness/max"] for row in rows.values()) == 1  # and the run really was asynchronous
    assert rows[8]["fully_async/count/stale_samples_processed"] > 0
    # A sync every 2 steps: steps 1-2 train at version 0, 3-4 at 1, ... (a killed and resumed run must train at
    # the same versions: tests/e2e/test_kill_resume.py)
    assert [rows[step]["param_version"] for step in range(1, 9)] == [(step - 1) // 2 for step in range(1, 9)]
    assert_each_version_starts_at_most_its_budget(rows, sync_steps=[3, 5, 7], budget=24)  # M = 8 x 1.5 x 2
    for step, samples in dumped(config.trainer.output_dir).items():
        version = int(rows[step]["param_version"])
        assert all(min(sample["versions"]) >= version - 1 for sample in samples), step


def test_partial_rollout_resumes_samples_across_versions_at_full_length(make_config, ray_session):
    config = make_config(*FULLY_ASYNC, "trainer.total_steps=6", "data.train_batch_size=8",
                         "actor.ppo_mini_batch_size=8", "async_training.trigger_parameter_sync_step=1",
                         "async_training.staleness_threshold=1.0", "async_training.partial_rollout=true",
                         "rollout.ignore_eos=true", "data.max_response_length=40", "data.max_prompt_length=24",
                         # Four sequences at a time: generating a batch takes longer than training on one, so
                         # every sync finds responses in flight, however fast the machine.
                         "rollout.max_num_seqs=4")
    train(config)
    samples = [sample for samples in dumped(config.trainer.output_dir).values() for sample in samples]
    spanning = [sample for sample in samples if len(sample["versions"]) > 1]
    assert spanning, "no sample was interrupted by a sync"
    assert all(sample["num_tokens"] == 40 for sample in samples)  # a resumed sample keeps its whole budget
    assert all(sample["versions"][-1] - sample["versions"][0] == 1 for sample in spanning)
    rows = training_rows(config.trainer.output_dir)
    assert max(row["fully_async/partial/partial_ratio"] for row in rows.values()) > 0
    assert max(row["fully_async/partial/max_partial_span"] for row in rows.values()) == 1


def test_runs_end_cleanly_when_data_runs_out_mid_cycle_and_with_test_freq_zero(make_config, ray_session, warm_policy):
    # 64 prompts, 8 per step, a sync every 3 steps: the 8th (last) step ends a cycle early (pitfall P1).
    config = make_config(*FULLY_ASYNC, f"data.train_files=[{warm_policy['val']}]", "data.train_batch_size=8",
                         "actor.ppo_mini_batch_size=8", "async_training.trigger_parameter_sync_step=3",
                         "trainer.test_freq=0", f"data.val_files=[{warm_policy['val']}]")
    summary = train(config)
    assert summary["steps"] == 8
    assert "val/score/mean" in summary["final_validation"]
    prompt_ids = Counter(sample["prompt_id"] for samples in dumped(config.trainer.output_dir).values()
                         for sample in samples if sample["sample_index"] == 0)
    assert len(prompt_ids) == 64 and set(prompt_ids.values()) == {1}
