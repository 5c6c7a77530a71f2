"""Where a run starts, decided before Ray: the checkpoint found, compared with the config by meaning (critic.enable
as the estimator resolves it, so checkpoints written when the loader left it null stay resumable), and a finished
run recognised from its last checkpoint and its summary.json. Real checkpoint folders (CheckpointManager, JSON
driver state); the trainer's files are stand-ins, since nothing here loads them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from asyncrl.config import load_config
from asyncrl.core.checkpoint import CheckpointManager
from asyncrl.launch.demo import demo_config_path
from asyncrl.launch.resume_check import ResumePoint, check_resume
from asyncrl.recipes.errors import IncompatibleCheckpointError, RunAlreadyFinished
from asyncrl.recipes.training_loop import check_compatible

NUM_PROMPTS = 64   # 2 steps of 32 prompts per epoch (the demo's data.train_batch_size)


def make_config(output_dir: Path, *overrides: str):
    return load_config(demo_config_path(), [f"trainer.output_dir={output_dir}", *overrides])


def write_checkpoint(config, step: int, position: int, epoch: int = 0) -> Path:
    """A checkpoint as the training loop writes it after `step` steps, its data cursor at `position`."""
    manager = CheckpointManager(Path(config.trainer.output_dir) / "checkpoints", max_checkpoints=3)
    state = {"step": step, "sampler": {"epoch": epoch, "position": position, "seed": config.data.seed,
                                       "num_prompts": NUM_PROMPTS},
             "core": {"version": step, "kl_controller": {}}, "num_samples": 0, "num_tokens": 0, "recipe": {},
             "config": dataclasses.asdict(config)}

    def save_trainer(folder: str) -> None:
        Path(folder).mkdir()
        (Path(folder) / "rank_0.json").write_text("{}")
    return manager.save(step, state, save_trainer)


def test_a_fresh_folder_and_resume_disable_start_at_step_zero(tmp_path):
    assert check_resume(make_config(tmp_path), tmp_path, NUM_PROMPTS) == ResumePoint(None, 0)
    config = make_config(tmp_path)
    write_checkpoint(config, 1, 32)
    assert check_resume(config, tmp_path, NUM_PROMPTS) == ResumePoint(tmp_path / "checkpoints" / "step_1", 1)
    assert check_resume(make_config(tmp_path, "trainer.resume=disable", "rollout.n=4"), tmp_path,
                        NUM_PROMPTS) == ResumePoint(None, 0)


def test_a_changed_mode_is_refused_naming_both_values(tmp_path):
    write_checkpoint(make_config(tmp_path), 1, 32)
    changed = make_config(tmp_path, "trainer.mode=one_step_off", "rollout.n_gpus_per_node=1", "rollout.n=4")
    with pytest.raises(IncompatibleCheckpointError) as raised:
        check_resume(changed, tmp_path, NUM_PROMPTS)
    message = str(raised.value)
    assert f"cannot resume from {tmp_path / 'checkpoints' / 'step_1'}" in message
    assert "trainer.mode: 'sync' in the checkpoint, 'one_step_off' now" in message
    assert "rollout.n: 8 in the checkpoint, 4 now" in message
    assert "another trainer.output_dir, or trainer.resume=disable" in message


def test_critic_enable_is_compared_by_its_meaning(tmp_path):
    """A checkpoint written before the loader resolved critic.enable holds null: with grpo that meant no critic,
    with gae a critic."""
    grpo = dataclasses.asdict(make_config(tmp_path))
    gae = dataclasses.asdict(make_config(tmp_path, "algorithm.adv_estimator=gae"))
    assert grpo["critic"]["enable"] is False and gae["critic"]["enable"] is True
    for current in (grpo, gae):
        written_before = json.loads(json.dumps(current))
        written_before["critic"]["enable"] = None
        check_compatible(written_before, current, tmp_path)   # same meaning: resumable
    grpo_with_critic = json.loads(json.dumps(grpo))
    grpo_with_critic["critic"]["enable"] = True
    with pytest.raises(IncompatibleCheckpointError, match=r"critic\.enable: True in the checkpoint, False now"):
        check_compatible(grpo_with_critic, grpo, tmp_path)
    legacy_gae = json.loads(json.dumps(gae))
    legacy_gae["critic"]["enable"] = None
    legacy_gae["algorithm"]["adv_estimator"] = "grpo"   # null under grpo meant no critic; the run now has one
    with pytest.raises(IncompatibleCheckpointError, match=r"critic\.enable: False in the checkpoint, True now"):
        check_compatible(legacy_gae, gae, tmp_path)


def test_a_finished_run_is_recognised_only_with_its_summary_and_while_nothing_is_left(tmp_path):
    config = make_config(tmp_path)
    folder = write_checkpoint(config, 2, NUM_PROMPTS)
    # Killed (or stopped) after its last checkpoint, before the final validation: resuming finishes it.
    assert check_resume(config, tmp_path, NUM_PROMPTS) == ResumePoint(folder, 2)
    (tmp_path / "summary.json").write_text(json.dumps({"last_step": 1, "output_dir": str(tmp_path)}))
    assert check_resume(config, tmp_path, NUM_PROMPTS) == ResumePoint(folder, 2)   # an earlier segment's summary
    (tmp_path / "summary.json").write_text(json.dumps({"last_step": 2, "output_dir": str(tmp_path)}))
    with pytest.raises(RunAlreadyFinished) as raised:
        check_resume(config, tmp_path, NUM_PROMPTS)
    message = str(raised.value)
    assert f"trainer.output_dir={tmp_path} holds a finished run (2 steps; last checkpoint {folder})" in message
    assert "another trainer.output_dir" in message and "trainer.resume=disable" in message
    assert message.endswith("to train this run further, raise trainer.total_epochs (now 1).")  # the data ended it
    assert raised.value.summary["last_step"] == 2
    # More steps cannot train a run whose data is used up; another epoch does, from the same checkpoint.
    with pytest.raises(RunAlreadyFinished):
        check_resume(make_config(tmp_path, "trainer.total_steps=3"), tmp_path, NUM_PROMPTS)
    more_epochs = make_config(tmp_path, "trainer.total_epochs=2")
    assert check_resume(more_epochs, tmp_path, NUM_PROMPTS) == ResumePoint(folder, 2)


def test_a_step_budget_reached_before_the_data_ends_is_finished_too(tmp_path):
    config = make_config(tmp_path, "trainer.total_steps=1")
    write_checkpoint(config, 1, 32)
    (tmp_path / "summary.json").write_text(json.dumps({"last_step": 1}))
    with pytest.raises(RunAlreadyFinished, match=r"\(1 steps; .*raise trainer\.total_steps \(now 1\)\.$"):
        check_resume(config, tmp_path, NUM_PROMPTS)
    assert check_resume(make_config(tmp_path, "trainer.total_steps=2"), tmp_path,
                        NUM_PROMPTS) == ResumePoint(tmp_path / "checkpoints" / "step_1", 1)


def test_a_data_cursor_that_does_not_fit_the_data_is_refused_before_ray(tmp_path):
    config = make_config(tmp_path)
    write_checkpoint(config, 1, 32)
    with pytest.raises(IncompatibleCheckpointError, match=r"its data cursor does not fit the training data "
                                                          r"\(sampler state is for 64 prompts.*this sampler has 50"):
        check_resume(config, tmp_path, 50)


def test_a_named_checkpoint_whose_file_was_altered_is_refused_before_ray(tmp_path):
    """trainer.resume=PATH is verified as `auto` verifies each checkpoint; a named one is refused, not skipped."""
    config = make_config(tmp_path)
    folder = write_checkpoint(config, 1, 32)
    named = make_config(tmp_path, f"trainer.resume={folder}")
    assert check_resume(named, tmp_path, NUM_PROMPTS) == ResumePoint(folder, 1)
    (folder / "trainer" / "rank_0.json").write_text("[]")   # the same size (2 bytes), other content
    with pytest.raises(IncompatibleCheckpointError) as raised:
        check_resume(named, tmp_path, NUM_PROMPTS)
    assert str(raised.value).startswith(f"cannot resume from {folder} (trainer.resume): trainer/rank_0.json does not "
                                        f"match its SHA-256")
