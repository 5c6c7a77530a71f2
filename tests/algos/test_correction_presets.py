"""The named rollout-correction presets: the reference system's names and values in our keys, each a setting the
correction accepts, and each doing on a batch what its name says."""

import dataclasses
import math

import pytest
import torch

from asyncrl.algos import CORRECTION_LEVELS, REJECTION_LEVELS, ROLLOUT_CORRECTION_PRESETS, compute_rollout_correction
from asyncrl.config.schema import RolloutCorrectionConfig

# The reference system's preset class methods (its IcePop ones excepted, see the module docstring).
REFERENCE_NAMES = {
    "disabled", "decoupled_token_is", "decoupled_seq_is", "decoupled_seq_is_rs", "decoupled_geo_rs",
    "decoupled_geo_rs_seq_tis", "decoupled_geo_rs_token_tis", "decoupled_k3_rs", "decoupled_k3_rs_seq_tis",
    "decoupled_k3_rs_token_tis", "bypass_ppo_clip", "bypass_ppo_clip_geo_rs", "bypass_ppo_clip_k3_rs",
    "bypass_pg_is", "bypass_pg_geo_rs", "bypass_pg_geo_rs_seq_tis", "bypass_pg_geo_rs_token_tis",
}


def test_the_presets_are_the_reference_systems():
    assert set(ROLLOUT_CORRECTION_PRESETS) == REFERENCE_NAMES
    with pytest.raises(ValueError, match=r"unknown rollout-correction preset 'decoupled_k3'; did you mean "
                                         r"'decoupled_k3_rs'\?"):
        ROLLOUT_CORRECTION_PRESETS.spec("decoupled_k3")


@pytest.mark.parametrize(("name", "expected"), [
    # seq_sum_k1 with "0.5_2.0" and is_threshold 2.0
    ("decoupled_seq_is_rs", dict(bypass_mode=False, loss_type="ppo_clip", rollout_is="sequence",
                                 rollout_is_threshold=2.0, rollout_is_batch_normalize=False, rollout_rs="sequence",
                                 rollout_rs_threshold=2.0, rollout_rs_threshold_lower=0.5)),
    # seq_mean_k3 with 0.01, bypass with PPO clip, no weights
    ("bypass_ppo_clip_k3_rs", dict(bypass_mode=True, loss_type="ppo_clip", rollout_is=None, rollout_is_threshold=2.0,
                                   rollout_is_batch_normalize=False, rollout_rs="seq_mean_k3",
                                   rollout_rs_threshold=0.01, rollout_rs_threshold_lower=None)),
    # seq_mean_k1 with "0.999_1.001", token weights, bypass REINFORCE
    ("bypass_pg_geo_rs_token_tis", dict(bypass_mode=True, loss_type="reinforce", rollout_is="token",
                                        rollout_is_threshold=2.0, rollout_is_batch_normalize=False,
                                        rollout_rs="geometric", rollout_rs_threshold=1.001,
                                        rollout_rs_threshold_lower=0.999)),
    # the reference system's class default is decoupled
    ("disabled", dict(bypass_mode=False, loss_type="ppo_clip", rollout_is=None, rollout_is_threshold=2.0,
                      rollout_is_batch_normalize=False, rollout_rs=None, rollout_rs_threshold=None,
                      rollout_rs_threshold_lower=None)),
])
def test_a_preset_sets_every_key_to_the_reference_systems_value(name, expected):
    assert ROLLOUT_CORRECTION_PRESETS.spec(name).settings() == expected
    assert ROLLOUT_CORRECTION_PRESETS[name]() == expected  # the registered function returns the same


@pytest.mark.parametrize("name", sorted(REFERENCE_NAMES))
def test_every_preset_is_a_setting_the_correction_and_the_config_take(name):
    settings = ROLLOUT_CORRECTION_PRESETS.spec(name).settings()
    config_keys = {field.name for field in dataclasses.fields(RolloutCorrectionConfig)}
    assert set(settings) <= config_keys  # a preset names config keys only...
    assert {"bypass_mode", "loss_type", "rollout_is", "rollout_rs"} <= set(settings)  # ...and always the modes
    assert settings["loss_type"] in {"ppo_clip", "reinforce"}
    assert (name.startswith("bypass")) == settings["bypass_mode"]
    assert ("_pg_" in name) == (settings["loss_type"] == "reinforce")
    # the name says which weights and which rejection
    expected_is = "token" if "token" in name else "sequence" if ("seq_is" in name or "seq_tis" in name
                                                                 or name == "bypass_pg_is") else None
    expected_rs = ("geometric" if "geo_rs" in name else "seq_mean_k3" if "k3_rs" in name
                   else "sequence" if name.endswith("seq_is_rs") else None)
    assert (settings["rollout_is"], settings["rollout_rs"]) == (expected_is, expected_rs)
    # and the correction runs with them on a batch (a divergence level must come without a lower bound)
    weights, mask, _ = compute_rollout_correction(
        torch.zeros(2, 3), torch.full((2, 3), -0.1), torch.ones(2, 3), is_level=settings["rollout_is"],
        is_threshold=settings["rollout_is_threshold"], is_batch_normalize=settings["rollout_is_batch_normalize"],
        rs_level=settings["rollout_rs"], rs_threshold=settings["rollout_rs_threshold"],
        rs_threshold_lower=settings["rollout_rs_threshold_lower"])
    assert (weights is None) == (settings["rollout_is"] is None)


def test_the_presets_reject_and_weigh_a_batch_as_named():
    """Log-ratios 0.0005 per token on row 0 (inside the 0.1% band) and 0.1 on row 1: the geometric band rejects
    only row 1; k3 of row 1 is exp(0.1) - 1.1 = 0.00517 per token, under the 0.01 bound, so k3 keeps both; the
    sequence weights are exp(3 x 0.0005) and exp(0.3)."""
    rollout_log_probs = torch.full((2, 3), -1.0, dtype=torch.float64)
    old_log_probs = rollout_log_probs + torch.tensor([[0.0005] * 3, [0.1] * 3], dtype=torch.float64)
    mask = torch.ones(2, 3, dtype=torch.float64)

    def apply(name):
        settings = ROLLOUT_CORRECTION_PRESETS.spec(name).settings()
        return compute_rollout_correction(
            old_log_probs, rollout_log_probs, mask, is_level=settings["rollout_is"],
            is_threshold=settings["rollout_is_threshold"], rs_level=settings["rollout_rs"],
            rs_threshold=settings["rollout_rs_threshold"], rs_threshold_lower=settings["rollout_rs_threshold_lower"])

    weights, new_mask, _ = apply("decoupled_geo_rs_seq_tis")
    torch.testing.assert_close(new_mask, torch.tensor([[1.0] * 3, [0.0] * 3], dtype=torch.float64))
    torch.testing.assert_close(weights, torch.tensor([[math.exp(0.0015)] * 3, [math.exp(0.3)] * 3],
                                                     dtype=torch.float64))
    assert math.exp(0.1) - 1.1 < 0.01
    _, new_mask, _ = apply("decoupled_k3_rs")
    torch.testing.assert_close(new_mask, mask)
    weights, new_mask, _ = apply("disabled")
    assert weights is None and new_mask is mask


def test_every_level_a_preset_names_is_registered_with_the_right_kind():
    for spec in ROLLOUT_CORRECTION_PRESETS.specs():
        if spec.rollout_is is not None:
            assert spec.rollout_is in CORRECTION_LEVELS, spec.name
        if spec.rollout_rs is not None:
            is_divergence = REJECTION_LEVELS.spec(spec.rollout_rs).is_divergence
            assert (spec.rollout_rs_threshold_lower is None) == is_divergence, spec.name
