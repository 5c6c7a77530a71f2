"""Every algorithm the config names is selectable by name, reaches the code that runs it, and an unknown name fails
with the closest registered one: estimators, policy losses (sapo's temperatures), rejection levels (k2 / k3
bounded from above only), rollout-correction presets (explicit keys win) and dynamic sampling's settings."""

import pytest
import torch

from asyncrl.algos import ADVANTAGE_ESTIMATORS, POLICY_LOSSES, REJECTION_LEVELS, ROLLOUT_CORRECTION_PRESETS
from asyncrl.config import ConfigError, load_config
from asyncrl.rollout import resolve_backend
from asyncrl.train import PolicyUpdateSpec, TrainBatch
from asyncrl.train.policy_loss import policy_loss_terms


def test_every_estimator_and_loss_loads_by_name():
    for name in ADVANTAGE_ESTIMATORS:
        assert load_config(None, [f"algorithm.adv_estimator={name}"]).algorithm.adv_estimator == name
    for name in POLICY_LOSSES:
        assert load_config(None, [f"actor.policy_loss.loss_mode={name}"]).actor.policy_loss.loss_mode == name


@pytest.mark.parametrize("key, typo, closest", [
    ("algorithm.adv_estimator", "grpo_pass", "grpo_passk"),
    ("algorithm.adv_estimator", "remox", "remax"),
    ("actor.policy_loss.loss_mode", "sap", "sapo"),
    ("actor.policy_loss.loss_mode", "geo_means", "geo_mean"),
    ("algorithm.rollout_correction.rollout_rs", "seq_mean_k4", "seq_mean_k3"),
    ("algorithm.rollout_correction.rollout_is", "tokens", "token"),
    ("algorithm.rollout_correction.preset", "decoupled_k3_rs_seq_is", "decoupled_k3_rs_seq_tis"),
])
def test_an_unknown_algorithm_name_fails_with_the_closest_registered_one(key, typo, closest):
    with pytest.raises(ConfigError, match=rf"{key}: unknown .*'{typo}'; did you mean '{closest}'\?"):
        load_config(None, [f"{key}={typo}"])


def test_a_filter_metric_outside_its_choices_names_them():
    with pytest.raises(ConfigError, match=r"algorithm\.filter_groups\.metric: 'accuracy' is not one of 'acc', "
                                          r"'score', 'seq_reward'"):
        load_config(None, ["algorithm.filter_groups.metric=accuracy"])


def test_sapo_temperatures_reach_the_loss_the_worker_computes():
    """At ratio 1 sapo's per-token loss is -A x 2 / tau: A = +1 with tau_pos, A = -1 with tau_neg, token-mean."""
    config = load_config(None, ["actor.policy_loss.loss_mode=sapo", "actor.policy_loss.tau_pos=2.0",
                                "actor.policy_loss.tau_neg=4.0"])
    spec = PolicyUpdateSpec.from_config(config, num_rows=1, step=1)
    assert (spec.loss_mode, spec.policy_loss.tau_pos, spec.policy_loss.tau_neg) == ("sapo", 2.0, 4.0)
    batch = TrainBatch.from_sequences([[1]], [[2, 3]], [0])
    log_probs = torch.tensor([[-0.5, -1.5]])
    micro = batch.replace(old_log_probs=log_probs.clone(), advantages=torch.tensor([[1.0, -1.0]]))
    terms = policy_loss_terms(log_probs, torch.zeros(1, 2), micro, spec, num_tokens=2.0, num_seqs=1.0)
    assert float(terms.loss) == pytest.approx((-2 / 2.0 + 2 / 4.0) / 2, rel=1e-5)
    default = PolicyUpdateSpec.from_config(load_config(None, ["actor.policy_loss.loss_mode=sapo"]), 1, 1)
    terms = policy_loss_terms(log_probs, torch.zeros(1, 2), micro, default, num_tokens=2.0, num_seqs=1.0)
    assert float(terms.loss) == pytest.approx((-2 / 1.0 + 2 / 1.05) / 2, rel=1e-5)


def test_sapo_temperatures_must_be_positive():
    with pytest.raises(ConfigError, match=r"actor\.policy_loss\.tau_neg: 0\.0 is out of range, must be > 0\.0"):
        load_config(None, ["actor.policy_loss.tau_neg=0"])


def rejection(level: str, *thresholds: str):
    return load_config(None, [f"algorithm.rollout_correction.rollout_rs={level}", *thresholds]) \
        .algorithm.rollout_correction


def test_every_rejection_level_loads_with_the_thresholds_its_kind_takes():
    for spec in REJECTION_LEVELS.specs():
        if spec.is_divergence:
            correction = rejection(spec.name, "algorithm.rollout_correction.rollout_rs_threshold=0.01")
            assert (correction.rollout_rs, correction.rollout_rs_threshold_lower) == (spec.name, None)
        else:
            correction = rejection(spec.name, "algorithm.rollout_correction.rollout_rs_threshold=2.0",
                                   "algorithm.rollout_correction.rollout_rs_threshold_lower=0.5")
            assert correction.rollout_rs == spec.name
    assert {spec.name for spec in REJECTION_LEVELS.specs() if spec.is_divergence} >= {"token_k2", "seq_mean_k3"}


def test_a_kl_level_is_bounded_from_above_only():
    with pytest.raises(ConfigError, match=r"rollout_rs=seq_mean_k3 bounds a KL estimate from above only: set "
                                          r"rollout_rs_threshold and leave rollout_rs_threshold_lower null, got "
                                          r"rollout_rs_threshold=0\.01, rollout_rs_threshold_lower=0\.001"):
        rejection("seq_mean_k3", "algorithm.rollout_correction.rollout_rs_threshold=0.01",
                  "algorithm.rollout_correction.rollout_rs_threshold_lower=0.001")
    with pytest.raises(ConfigError, match=r"rollout_rs=token_k2 bounds a KL estimate from above only.*"
                                          r"rollout_rs_threshold=None"):
        rejection("token_k2")
    with pytest.raises(ConfigError, match=r"rollout_rs=geometric is set but neither rollout_rs_threshold nor "
                                          r"rollout_rs_threshold_lower is"):
        rejection("geometric")


def test_every_preset_loads_as_its_settings_and_explicit_keys_win(tmp_path):
    for spec in ROLLOUT_CORRECTION_PRESETS.specs():
        correction = load_config(None, [f"algorithm.rollout_correction.preset={spec.name}"]).algorithm \
            .rollout_correction
        assert correction.preset == spec.name
        assert {key: getattr(correction, key) for key in spec.settings()} == spec.settings(), spec.name
    path = tmp_path / "run.yaml"
    path.write_text("algorithm:\n  rollout_correction:\n    preset: decoupled_k3_rs\n    rollout_rs_threshold: 0.05\n")
    correction = load_config(path, ["algorithm.rollout_correction.rollout_is=token"]).algorithm.rollout_correction
    assert (correction.bypass_mode, correction.rollout_rs) == (False, "seq_mean_k3")  # from the preset
    assert (correction.rollout_rs_threshold, correction.rollout_is) == (0.05, "token")  # set explicitly


def test_dynamic_sampling_needs_a_group_estimator():
    load_config(None, ["algorithm.filter_groups.enable=true", "algorithm.adv_estimator=rloo"])
    with pytest.raises(ConfigError, match=r"algorithm\.filter_groups\.enable drops the groups whose rewards do not "
                                          r"vary, which only a group estimator ignores; "
                                          r"algorithm\.adv_estimator=reinforce_plus_plus is none"):
        load_config(None, ["algorithm.filter_groups.enable=true", "algorithm.adv_estimator=reinforce_plus_plus"])


def test_the_overlong_buffer_lies_within_the_token_budget():
    load_config(None, ["reward.overlong_buffer.enable=true", "reward.overlong_buffer.len=64",
                       "data.max_response_length=64"])
    for length in (0, 65):
        with pytest.raises(ConfigError, match=rf"reward\.overlong_buffer\.len must be within 1 \.\. "
                                              rf"data\.max_response_length \(64\) when "
                                              rf"reward\.overlong_buffer\.enable=true, got {length}"):
            load_config(None, ["reward.overlong_buffer.enable=true", f"reward.overlong_buffer.len={length}",
                               "data.max_response_length=64"])


def test_moe_keys_reach_the_update_and_vllm_refuses_routing_replay():
    spec = PolicyUpdateSpec.from_config(load_config(None, ["algorithm.routing_replay=true",
                                                           "actor.router_aux_loss_coef=0.01"]), 8, step=0)
    assert spec.routing_replay and spec.router_aux_loss_coef == 0.01
    assert PolicyUpdateSpec.from_config(load_config(None, []), 8, step=0).router_aux_loss_coef is None  # config.json's
    with pytest.raises(ConfigError, match=r"actor\.router_aux_loss_coef"):
        load_config(None, ["actor.router_aux_loss_coef=-1"])
    config = load_config(None, ["rollout.backend=vllm", "trainer.mode=fully_async", "algorithm.routing_replay=true"])
    with pytest.raises(ConfigError, match=r"rollout.backend=vllm with algorithm.routing_replay=true"):
        resolve_backend(config)
