"""Config loading: every error class names its key; overrides, YAML and invariants behave."""

import dataclasses
import typing

import pytest

from asyncrl.algos import (ADVANTAGE_ESTIMATORS, CORRECTION_LEVELS, KL_ESTIMATORS, LOSS_AGG_MODES, POLICY_LOSSES,
                           REJECTION_LEVELS, ROLLOUT_CORRECTION_PRESETS)
from asyncrl.config import AsyncRLConfig, ConfigError, dump_config, load_config, needs_critic
from asyncrl.config.schema import ActorConfig, AlgorithmConfig, CriticConfig, PolicyLossConfig, RolloutCorrectionConfig


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
    ("rollout.top_p=1.5", r"rollout\.top_p: 1\.5 is out of range, must be > 0\.0, <= 1\.0"),
    ("async_training.staleness_threshold=-0.1", r"async_training\.staleness_threshold: -0\.1 is out of range"),
    ("actor.clip_ratio_c=1.0", r"actor\.clip_ratio_c: 1\.0 is out of range, must be > 1"),
    ("data.train_files=[1]", r"data\.train_files\[0\]: expected str"),
    ("rollout.length_distribution=512", r"expected str, got 512 \(int\); YAML reads a bare number as a number: "
                                        r"quote it, rollout\.length_distribution='\"512\"'"),
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
    (["algorithm.adv_estimator=grpp"],
     r"algorithm\.adv_estimator: unknown advantage estimator 'grpp'; did you mean 'grpo'\? valid names: gae, grpo"),
    (["algorithm.adv_estimator=ppo2"], r"algorithm\.adv_estimator: unknown advantage estimator 'ppo2'; did you mean "),
    (["actor.kl_loss_type=k7"], r"actor\.kl_loss_type: unknown KL estimator 'k7'; did you mean 'kl'\?"),
    (["algorithm.kl_penalty=low_var_kl++"], r"algorithm\.kl_penalty: unknown KL estimator 'low_var_kl\+\+'; "
                                            r"did you mean 'low_var_kl\+'\?"),
    (["actor.policy_loss.loss_mode=clip-cov"],
     r"loss_mode: unknown policy loss 'clip-cov'; did you mean 'clip_cov'\?"),
    (["critic.loss_agg_mode=token_mean"], r"critic\.loss_agg_mode: unknown loss aggregation mode 'token_mean'"),
    (["algorithm.rollout_correction.rollout_is=seq"], r"rollout_is: unknown rollout-correction level 'seq'"),
    (["trainer.n_gpus_per_node=3"], r"must be divisible by the trainer world size"),
    (["async_training.partial_rollout=true"], r"only apply to trainer\.mode=fully_async"),
    (["algorithm.rollout_correction.rollout_rs=token"], r"rollout_rs=token is set but neither"),
    (["trainer.logger=[console,slack]"], r"unknown tracker"),
    (["rollout.decode_attention=cuda", "rollout.block_size=48"],
     r"rollout\.decode_attention=cuda reads KV blocks whose size is a power of two from 16, got rollout\.block_size=48"),
])
def test_cross_field_invariants(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_group_estimators_need_two_responses_but_others_do_not():
    load_config(None, ["rollout.n=1", "algorithm.adv_estimator=reinforce_plus_plus"])
    group_estimators = [spec.name for spec in ADVANTAGE_ESTIMATORS.specs() if spec.needs_groups]
    assert "grpo" in group_estimators and "reinforce_plus_plus" not in group_estimators
    for estimator in group_estimators:
        with pytest.raises(ConfigError, match=rf"adv_estimator={estimator} compares responses within a group and "
                                              r"needs rollout\.n >= 2, got rollout\.n=1"):
            load_config(None, ["rollout.n=1", f"algorithm.adv_estimator={estimator}"])


def test_every_registered_name_loads_where_its_metadata_allows():
    for spec in ADVANTAGE_ESTIMATORS.specs():
        if not spec.needs_greedy_baseline:
            assert load_config(None, [f"algorithm.adv_estimator={spec.name}"]).algorithm.adv_estimator == spec.name
    for name in KL_ESTIMATORS:
        config = load_config(None, [f"actor.kl_loss_type={name}", f"algorithm.kl_penalty={name}"])
        assert (config.actor.kl_loss_type, config.algorithm.kl_penalty) == (name, name)
    for name in POLICY_LOSSES:
        assert load_config(None, [f"actor.policy_loss.loss_mode={name}"]).actor.policy_loss.loss_mode == name
    for name in LOSS_AGG_MODES:
        assert load_config(None, [f"critic.loss_agg_mode={name}"]).critic.loss_agg_mode == name
    for name in CORRECTION_LEVELS:
        assert load_config(None, [f"algorithm.rollout_correction.rollout_is={name}"]).algorithm.rollout_correction \
            .rollout_is == name
    assert load_config(None, ["algorithm.rollout_correction.rollout_is=null"]).algorithm.rollout_correction \
        .rollout_is is None


def test_algorithm_keys_choose_from_the_registries_themselves():
    """No list of names in the config: a key's valid names are its registry, read when a config is built."""
    def choices(cls, name):
        return next(field for field in dataclasses.fields(cls) if field.name == name).metadata["choices"]
    assert choices(AlgorithmConfig, "adv_estimator") is ADVANTAGE_ESTIMATORS
    assert choices(AlgorithmConfig, "kl_penalty") is choices(ActorConfig, "kl_loss_type") is KL_ESTIMATORS
    assert choices(PolicyLossConfig, "loss_mode") is POLICY_LOSSES
    assert choices(ActorConfig, "loss_agg_mode") is choices(CriticConfig, "loss_agg_mode") is LOSS_AGG_MODES
    assert choices(RolloutCorrectionConfig, "rollout_is") is CORRECTION_LEVELS
    assert choices(RolloutCorrectionConfig, "rollout_rs") is REJECTION_LEVELS  # the ratio levels and the k2 / k3 ones
    assert choices(RolloutCorrectionConfig, "preset") is ROLLOUT_CORRECTION_PRESETS


def test_an_unset_critic_enable_is_decided_by_the_estimator_when_the_config_loads():
    assert load_config().critic.enable is False
    assert load_config(None, ["algorithm.adv_estimator=gae"]).critic.enable is True
    assert load_config(None, ["critic.enable=true"]).critic.enable is True  # an explicit choice stays
    unresolved = AsyncRLConfig()  # built without the loader: needs_critic reads the metadata itself
    assert unresolved.critic.enable is None and needs_critic(unresolved) is False
    unresolved.algorithm.adv_estimator = "gae"
    assert needs_critic(unresolved) is True


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


def test_a_colon_range_stays_a_string_in_overrides_and_files(tmp_path):
    """YAML 1.1 reads `2:6` as the base-60 number 126; a length range must arrive as written."""
    assert load_config(None, ["rollout.length_distribution=2:6"]).rollout.length_distribution == "2:6"
    path = tmp_path / "run.yaml"
    path.write_text("rollout:\n  length_distribution: 1:30\n  temperature: 0.7\n  n: 4\n")
    config = load_config(path)
    assert (config.rollout.length_distribution, config.rollout.temperature, config.rollout.n) == ("1:30", 0.7, 4)
