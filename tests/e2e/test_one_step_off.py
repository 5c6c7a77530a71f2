"""One-step-off through real Ray actors (a trainer rank and a rollout replica on CPU slots): every token of
step s >= 2 was sampled by version s-1 and the run learns. A one_step_off run killed mid-epoch resumes without
losing or repeating a prompt: tests/e2e/test_kill_resume.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from asyncrl.launch import train
from asyncrl.telemetry import read_metrics

ONE_STEP_OFF = ("trainer.mode=one_step_off", "rollout.n_gpus_per_node=1", "trainer.dump_rollouts=true")


def dumped(output_dir: str) -> dict[int, list[dict]]:
    folder = Path(output_dir) / "rollouts"
    return {int(path.stem.split("_")[1]): [json.loads(line) for line in path.read_text().splitlines()]
            for path in folder.glob("step_*.jsonl")}


def test_tokens_are_one_version_stale_and_the_run_learns(make_config, ray_session):
    config = make_config(*ONE_STEP_OFF, "trainer.total_steps=16", "trainer.test_freq=8")
    summary = train(config)
    steps = dumped(config.trainer.output_dir)
    assert sorted(steps) == list(range(1, 17))
    for step, samples in steps.items():
        assert len(samples) == config.data.train_batch_size * config.rollout.n, step  # every sample dumped
        for sample in samples:
            assert sample["versions"] == [step - 1], (step, sample["versions"])
    metrics = read_metrics(f"{config.trainer.output_dir}/metrics.jsonl")
    trained = [row for row in metrics if "critic/score/mean" in row]  # one row per training step
    assert [row["step"] for row in trained] == list(range(1, 17))
    # Read from every training row: a metric that stopped being logged fails here (KeyError).
    assert [row["staleness/mean"] for row in trained] == [1.0] * 16
    # Step s pushes the weights of step s - 1 first and trains at version s (a killed and resumed run must train
    # at the same versions: tests/e2e/test_kill_resume.py)
    assert [row["param_version"] for row in trained] == list(range(1, 17))
    assert all("timing_s/wait_prev_gen" in row and "timing_s/generate_async" in row for row in trained)
    scores = [row["critic/score/mean"] for row in trained]
    assert np.mean(scores[-4:]) > np.mean(scores[:3]) + 0.3, scores
    assert summary["final_validation"]["val/score/mean"] >= summary["initial_validation"]["val/score/mean"] + 0.3
