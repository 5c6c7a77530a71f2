"""Config loading: every error class names its key; overrides, YAML and invariants behave."""

import dataclasses
import typing

import pytest

from asyncrl.config import AsyncRLConfig, ConfigError, dump_config, load_config
from asyncrl.config.invariants import ADVANTAGE_ESTIMATORS, GROUP_ESTIMATORS


def test_defaults_build_and_dump_round_trip(tmp_path):
    config = load_config()
    path = tmp_path / "resolved.yaml"
    path.write_text(dump_config(config))
    assert load_config(path) == config


def test_yaml_then_overrides_take_precedence(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("actor:\n  optim:\n    lr: 0.5\ntrainer:\n  mode: one_step_off\n")
    config = load_config(path, ["actor.optim.lr=1e-5", "rollout.n=8"])
    assert config.actor.optim.lr == 1e-5  # YAML 1.1 reads '1e-5' as a string: must still become a float
    assert config.trainer.mode == "one_step_off"
    assert config.rollout.n == 8
    assert config.critic.optim.lr == 1e-5  # critic has its own default


def test_unknown_key_names_closest_valid_key():
    with pytest.raises(ConfigError, match=r"actor\.ppo_mini_batchsize.*did you mean actor\.ppo_mini_batch_size"):
        load_config(None, ["actor.ppo_mini_batchsize=4"])


def test_unknown_section_names_closest_section(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("rollot:\n  n: 2\n")
    with pytest.raises(ConfigError, match="did you mean rollout"):
        load_config(path)


@pytest.mark.parametrize("override, message", [
    ("rollout.n=abc", r"rollout\.n: expected int, got 'abc'"),
    ("rollout.n=2.5", r"rollout\.n: expected int"),
    ("trainer.val_before_train=3", r"trainer\.val_before_train: expected bool"),
    ("trainer.mode=fast", r"trainer\.mode: 'fast' is not one of"),
    ("actor.optim.lr=-1", r"actor\.optim\.lr: -1\.0 is out of range, must be >= 0"),
    ("rollout.top_p=1.5", r"rollout\.top_p: 1\.5 is out of range, must be <= 1"),
    ("async_training.staleness_threshold=-0.1", r"async_training\.staleness_threshold: -0\.1 is out of range"),
    ("actor.clip_ratio_c=1.0", r"actor\.clip_ratio_c: 1\.0 is out of range, must be > 1"),
    ("data.train_files=[1]", r"data\.train_files\[0\]: expected str"),
    ("actor=3", r"actor must be a mapping"),
])
def test_wrong_type_or_range_names_key_and_value(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


@pytest.mark.parametrize("overrides, message", [
    (["data.train_batch_size=10", "actor.ppo_mini_batch_size=4"],
     r"actor\.ppo_mini_batch_size must divide data\.train_batch_size, got 4 and 10"),
    (["rollout.n=1"], r"needs rollout\.n >= 2, got rollout\.n=1"),
    (["algorithm.adv_estimator=gae", "critic.enable=false"], r"gae needs a critic"),
    (["algorithm.adv_estimator=ppo2"], r"algorithm\.adv_estimator: 'ppo2' is not one of"),
    (["actor.kl_loss_type=k7"], r"actor\.kl_loss_type: 'k7'"),
    (["trainer.n_gpus_per_node=3"], r"must be divisible by the trainer world size"),
    (["async_training.partial_rollout=true"], r"only apply to trainer\.mode=fully_async"),
    (["algorithm.rollout_correction.rollout_rs=token"], r"rollout_rs is set but neither"),
    (["trainer.logger=[console,slack]"], r"unknown tracker"),
    (["rollout.decode_attention=cuda", "rollout.block_size=48"],
     r"rollout\.decode_attention=cuda reads KV blocks whose size is a power of two from 16, got rollout\.block_size=48"),
])
def test_cross_field_invariants(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_group_estimators_need_two_responses_but_others_do_not():
    load_config(None, ["rollout.n=1", "algorithm.adv_estimator=reinforce_plus_plus"])
    for estimator in sorted(GROUP_ESTIMATORS):
        with pytest.raises(ConfigError, match=rf"adv_estimator={estimator} compares responses within a group and "
                                              r"needs rollout\.n >= 2, got rollout\.n=1"):
            load_config(None, ["rollout.n=1", f"algorithm.adv_estimator={estimator}"])


def test_malformed_yaml_and_missing_file_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    path = tmp_path / "broken.yaml"
    path.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="broken.yaml is not valid YAML"):
        load_config(path)
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(path)


def test_override_syntax_error():
    with pytest.raises(ConfigError, match="must look like key.path=value"):
        load_config(None, ["rollout.n"])


def test_every_field_has_help_text():
    def walk(cls, prefix):
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            assert field.metadata.get("help"), f"{prefix}{field.name} has no help text"
            if dataclasses.is_dataclass(hints[field.name]):
                walk(hints[field.name], prefix + field.name + ".")
                checked.append(field.name)
    checked = []
    walk(AsyncRLConfig, "")
    assert "val_kwargs" in checked and "rollout_correction" in checked


def test_group_estimators_agree_with_algos():
    algos = pytest.importorskip("asyncrl.algos")
    assert set(GROUP_ESTIMATORS) == set(algos.GROUP_ESTIMATORS)
    assert set(ADVANTAGE_ESTIMATORS) == set(algos.ADVANTAGE_ESTIMATORS)


def test_a_colon_range_stays_a_string_in_overrides_and_files(tmp_path):
    """YAML 1.1 reads `2:6` as the base-60 number 126; a length range must arrive as written."""
    assert load_config(None, ["rollout.length_distribution=2:6"]).rollout.length_distribution == "2:6"
    path = tmp_path / "run.yaml"
    path.write_text("rollout:\n  length_distribution: 1:30\n  temperature: 0.7\n  n: 4\n")
    config = load_config(path)
    assert (config.rollout.length_distribution, config.rollout.temperature, config.rollout.n) == ("1:30", 0.7, 4)
