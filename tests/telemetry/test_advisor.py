"""The advisor on recorded runs: a starved trainer gets devices moved to it, a starved rollout the opposite."""

import json

import pytest
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


# Steps 21-24 of `asyncrl demo` (sync, one trainer rank on 2 CPU cores), as its metrics.jsonl recorded them.
SYNC_DEMO_ROWS = [
    {"timing_s/adv": 0.0005, "timing_s/gen": 0.0618, "timing_s/generate_async": 0.05, "timing_s/reward": 0.0331,
     "timing_s/step": 0.2428, "timing_s/sync_weights": 0.0025, "timing_s/update_actor": 0.1217},
    {"timing_s/adv": 0.0005, "timing_s/gen": 0.0604, "timing_s/generate_async": 0.0512, "timing_s/reward": 0.0313,
     "timing_s/step": 0.2312, "timing_s/sync_weights": 0.0023, "timing_s/update_actor": 0.1138},
    {"timing_s/adv": 0.0005, "timing_s/gen": 0.0583, "timing_s/generate_async": 0.0447, "timing_s/reward": 0.0309,
     "timing_s/step": 0.2191, "timing_s/sync_weights": 0.0023, "timing_s/update_actor": 0.1065},
    {"timing_s/adv": 0.0004, "timing_s/gen": 0.0724, "timing_s/generate_async": 0.0591, "timing_s/reward": 0.0313,
     "timing_s/step": 0.2599, "timing_s/sync_weights": 0.0023, "timing_s/update_actor": 0.1353},
]


def assert_valid_split(advice):
    """A split names at least one device on each side and uses exactly the devices there are."""
    assert advice.recommended_rollout_devices is not None
    assert 1 <= advice.recommended_rollout_devices <= advice.total_devices - 1
    text = advice.text()
    assert " 0 rollout" not in text and " 0 trainer" not in text


def test_a_sync_run_on_one_device_is_told_why_it_cannot_be_split(tmp_path):
    advice = advise(record_run(tmp_path / "sync", "sync", [], SYNC_DEMO_ROWS))
    assert advice.recommended_rollout_devices is None and advice.move == "keep"
    text = advice.text()
    assert text.startswith("mode sync, 1 device (0 rollout)")
    assert "cannot be split: a separated mode needs at least one rollout and one trainer device" in text
    assert "0 rollout : 1 trainer" not in text
    # generation (gen 0.0632 s on average) against training (update_actor + adv, 0.1198 s): 35% of the time
    assert f"generation is {0.0632 / (0.0632 + 0.1198):.0%}" in text


def test_a_sync_run_on_two_devices_gets_a_split_of_one_and_one(tmp_path):
    advice = advise(record_run(tmp_path / "sync", "sync", ["trainer.n_gpus_per_node=2"], SYNC_DEMO_ROWS))
    assert_valid_split(advice)
    assert advice.recommended_rollout_devices == 1  # 35% of 2 devices rounds to 1, never to 0
    assert "trainer.mode=fully_async rollout.n_gpus_per_node=1 trainer.n_gpus_per_node=1" in advice.text()


def test_a_one_step_off_run_weighs_the_generation_it_hid(tmp_path):
    # Training waited 0.02 s per step for a generation of 0.3 s (generate_async) hidden behind 0.4 s of updates.
    rows = [{"timing_s/gen": 0.02, "timing_s/wait_prev_gen": 0.02, "timing_s/generate_async": 0.3,
             "timing_s/update_actor": 0.4, "timing_s/sync_weights": 0.01, "timing_s/step": 0.45}] * 4
    advice = advise(record_run(tmp_path / "osf", "one_step_off", [], rows))
    assert_valid_split(advice)
    assert advice.generation_device_s == pytest.approx(0.3) and advice.training_device_s == pytest.approx(0.4)
    assert advice.trainer_idle_ratio == pytest.approx(0.02 / 0.45)
    assert advice.rollouter_idle_ratio == pytest.approx(1 - 0.3 / 0.45)
    # 1 rollout : 1 trainer is as even as 2 devices get; the trainer side is the slower one
    assert "keep 1 rollout : 1 trainer: the trainer is the bottleneck" not in advice.text()
    assert "the split is balanced for this workload (generation is 43% of the device time)" in advice.text()


def test_two_devices_that_cannot_balance_say_which_side_needs_more(tmp_path):
    # The rollouter waits 80% of the time for a trainer that needs 4x the generation's device time.
    rows = [{"timing_s/gen": 0.01, "timing_s/update_actor": 1.0, "rollouter/idle_ratio": 0.8,
             "trainer/idle_ratio": 0.01, "timing_s/sync_weights": 0.01, "timing_s/step": 1.05}] * 4
    advice = advise(record_run(tmp_path / "fa", "fully_async", [], rows))
    assert_valid_split(advice)
    assert advice.move == "keep"
    assert ("keep 1 rollout : 1 trainer: the trainer is the bottleneck (generation is 17% of the device time), but "
            "with 2 devices neither side can give up another; add devices to the trainer") in advice.text()
