"""The synchronous recipe end to end through real Ray actors: it learns, PPO's critic learns, an
interrupted run resumes exactly, and a run leaves the output contract behind."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import ray

from asyncrl.launch import train
from asyncrl.telemetry import read_metrics


def test_grpo_learns_the_task_and_writes_the_run_outputs(make_config, ray_session):
    config = make_config("trainer.total_steps=20", "trainer.test_freq=10")
    summary = train(config)
    output = config.trainer.output_dir
    metrics = read_metrics(f"{output}/metrics.jsonl")
    trained = [row for row in metrics if "critic/score/mean" in row]  # one row per training step
    assert [row["step"] for row in trained] == list(range(1, 21))
    scores = [row["critic/score/mean"] for row in trained]
    assert np.mean(scores[-5:]) > np.mean(scores[:3]) + 0.3, scores
    assert summary["final_validation"]["val/score/mean"] >= summary["initial_validation"]["val/score/mean"] + 0.3
    assert all("step" in row for row in metrics)
    # Read from every training row: a metric that stopped being logged fails here (KeyError).
    assert [row["staleness/mean"] for row in trained] == [0] * 20
    for name in ("config.yaml", "summary.json", "timeline.json", "policy/config.json", "policy/model.safetensors",
                 "plots/score_vs_step.png", "checkpoints/latest"):
        assert os.path.exists(f"{output}/{name}"), name
    trace = json.load(open(f"{output}/timeline.json"))
    assert {"gen", "update_actor", "sync_weights"} <= {event["name"] for event in trace["traceEvents"]}


def test_ppo_with_a_critic_reduces_its_value_loss(make_config, ray_session):
    config = make_config("algorithm.adv_estimator=gae", "algorithm.lam=0.95", "critic.optim.lr=3e-3",
                         "trainer.total_steps=12", "trainer.val_before_train=false", "data.val_files=[]")
    train(config)
    metrics = read_metrics(f"{config.trainer.output_dir}/metrics.jsonl")
    trained = [row for row in metrics if "critic/vf_loss" in row]  # one row per training step
    assert [row["step"] for row in trained] == list(range(1, 13))
    value_losses = [row["critic/vf_loss"] for row in trained]
    assert np.mean(value_losses[-3:]) < 0.6 * np.mean(value_losses[:3]), value_losses
    assert all(np.isfinite(row["critic/values/mean"]) for row in trained)


def test_interrupted_run_resumes_to_the_same_metrics_and_weights(make_config, ray_session):
    keys = ("critic/score/mean", "actor/pg_loss", "response_length/mean", "actor/grad_norm")
    straight = make_config("trainer.total_steps=6", "trainer.val_before_train=false", "data.val_files=[]",
                           output="straight")
    train(straight)
    first = make_config("trainer.total_steps=3", "trainer.val_before_train=false", "data.val_files=[]",
                        output="resumed")
    train(first)
    resumed = make_config("trainer.total_steps=6", "trainer.val_before_train=false", "data.val_files=[]",
                          output="resumed")
    train(resumed)
    rows_straight = {row["step"]: row for row in read_metrics(f"{straight.trainer.output_dir}/metrics.jsonl")}
    rows_resumed = {row["step"]: row for row in read_metrics(f"{resumed.trainer.output_dir}/metrics.jsonl")}
    assert sorted(rows_resumed) == sorted(rows_straight) == [1, 2, 3, 4, 5, 6]
    for step in range(1, 7):
        for key in keys:
            assert rows_resumed[step][key] == pytest.approx(rows_straight[step][key], rel=1e-5, abs=1e-7), (step, key)
    from safetensors.numpy import load_file
    weights_straight = load_file(f"{straight.trainer.output_dir}/policy/model.safetensors")
    weights_resumed = load_file(f"{resumed.trainer.output_dir}/policy/model.safetensors")
    for name, array in weights_straight.items():
        assert np.array_equal(array, weights_resumed[name]), name
