"""The evaluation stage end to end in fully_async: every 2 versions the trainer's weights go to an evaluator actor
of its own, which generates 4 samples per validation prompt with that version pinned while training goes on; the
results come back as rows of metrics.jsonl under the version they measured, in a plot, and in summary.json (the
best and the last)."""

from __future__ import annotations

import os

from asyncrl.launch import train
from asyncrl.telemetry import read_metrics


def test_fully_async_evaluates_pinned_versions_while_training_goes_on(make_config, ray_session):
    config = make_config("trainer.mode=fully_async", "trainer.total_steps=8", "async_training.staleness_threshold=0.5",
                         "evaluation.enable=true", "evaluation.freq=2", "evaluation.n=4", "evaluation.temperature=1.0",
                         "evaluation.pass_k=[1,4]", "trainer.val_before_train=false")
    summary = train(config)
    rows = read_metrics(f"{config.trainer.output_dir}/metrics.jsonl")
    evaluations = [row for row in rows if "val/param_version" in row]
    versions = [row["val/param_version"] for row in evaluations]
    final_version = summary["param_version"]
    # Version 0 before training, every second version after, and the last one; each once, in order.
    assert versions[0] == 0 and versions[-1] == final_version and versions == sorted(set(versions)), versions
    assert all(later - earlier >= 2 for earlier, later in zip(versions, versions[1:-1])), versions
    for row in evaluations:
        assert row["val/off_version_tokens"] == 0            # every token sampled by the version measured
        assert row["val/num_prompts"] == 64 and row["val/num_timeouts"] == 0
        assert 0 <= row["val/pass@1"] <= row["val/pass@4"] <= 1
        assert row["val/pass@1"] == row["val/score/mean"]    # 0/1 scores: pass@1 is the mean
        assert row["step"] == row["val/finished_step"] >= row["val/started_step"]
        assert row["val/trainer_blocked_s"] > 0 and row["val/generation_s"] > 0
    # Training went on while evaluations ran: dispatching one cost the trainer only a gather of its weights, and
    # every step is in the log.
    trained = [row for row in rows if "actor/pg_loss" in row]
    assert [row["step"] for row in trained] == list(range(1, 9))
    assert sum("timing_s/evaluation_dispatch" in row for row in trained) >= len(evaluations) - 2
    assert evaluations[-1]["val/score/mean"] > evaluations[0]["val/score/mean"]   # the policy learned meanwhile
    report = summary["evaluation"]
    assert report["num_evaluations"] == len(evaluations) and report["last"] == {
        key: value for key, value in evaluations[-1].items() if key.startswith("val/")}
    assert report["best"]["val/score/mean"] == max(row["val/score/mean"] for row in evaluations)
    assert os.path.exists(f"{config.trainer.output_dir}/plots/evaluation_vs_version.png")
