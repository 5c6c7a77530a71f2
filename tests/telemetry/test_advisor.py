"""The advisor on recorded runs: a starved trainer gets devices moved to it, a starved rollout the opposite."""

import json

import yaml

from asyncrl.config import dump_config, load_config
from asyncrl.telemetry.advisor import advise


def record_run(folder, mode, overrides, rows):
    folder.mkdir()
    config = load_config(None, [f"trainer.mode={mode}", *overrides])
    (folder / "config.yaml").write_text(dump_config(config))
    with open(folder / "metrics.jsonl", "w") as handle:
        for step, row in enumerate(rows, start=1):
            handle.write(json.dumps({"step": step, **row}) + "\n")
    return folder


FULLY_ASYNC = ["trainer.n_gpus_per_node=2", "rollout.n_gpus_per_node=2"]


def test_starved_trainer_gets_devices(tmp_path):
    # The rollouter sits idle 60% of the time waiting for a slow trainer (3 s updates per step).
    rows = [{"timing_s/step": 3.2, "timing_s/gen": 0.05, "timing_s/update_actor": 3.0, "rollouter/idle_ratio": 0.6,
             "timing_s/sync_weights": 0.05}] * 5
    advice = advise(record_run(tmp_path / "run", "fully_async", FULLY_ASYNC, rows))
    assert advice.move == "to_trainer"
    assert advice.recommended_rollout_devices == 1
    assert "move devices to the trainer, 1 rollout : 3 trainer" in advice.text()


def test_starved_rollout_gets_devices(tmp_path):
    # The trainer waits 60% of every step for samples; the rollouter never rests.
    rows = [{"timing_s/step": 4.0, "timing_s/gen": 2.4, "timing_s/update_actor": 1.2, "rollouter/idle_ratio": 0.0,
             "timing_s/sync_weights": 0.05}] * 5
    advice = advise(record_run(tmp_path / "run", "fully_async", FULLY_ASYNC, rows))
    assert advice.move == "to_rollout"
    assert advice.recommended_rollout_devices == 3
    assert "raise async_training.staleness_threshold" in advice.text()


def test_sync_run_gets_a_balanced_split_and_slow_syncs_a_longer_interval(tmp_path):
    rows = [{"timing_s/step": 2.0, "timing_s/gen": 1.5, "timing_s/update_actor": 0.5}] * 3
    advice = advise(record_run(tmp_path / "sync", "sync", ["trainer.n_gpus_per_node=4"], rows))
    assert advice.move == "keep" and advice.recommended_rollout_devices == 3  # 75% of device time generates
    rows = [{"timing_s/step": 1.0, "timing_s/gen": 0.1, "timing_s/update_actor": 0.5, "rollouter/idle_ratio": 0.2,
             "timing_s/sync_weights": 0.3}] * 3
    text = advise(record_run(tmp_path / "slow_sync", "fully_async", FULLY_ASYNC, rows)).text()
    assert "raise async_training.trigger_parameter_sync_step to about 6" in text
