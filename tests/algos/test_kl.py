"""KL estimators, straight-through variants, KL in the reward and the KL controllers."""

import inspect
import math

import pytest
import torch

from asyncrl.algos import KL_ESTIMATORS, AdaptiveKLController, FixedKLController, apply_kl_penalty, kl_penalty

from .helpers import append_padding, fill_padding

LOG_PROBS = torch.tensor([[-0.5, -1.0, -2.0, -30.0], [-0.1, -3.0, -0.7, -1.0]], dtype=torch.float64)
REF_LOG_PROBS = torch.tensor([[-0.7, -1.0, -0.5, -1.0], [-0.4, -2.0, -40.0, -1.5]], dtype=torch.float64)


def k3_reference(delta: float) -> float:
    negative = min(max(-delta, -20.0), 20.0)
    return min(max(math.exp(negative) - negative - 1.0, -10.0), 10.0)


BASE_REFERENCES = {
    "k1": lambda d: d, "kl": lambda d: d,
    "abs": abs,
    "k2": lambda d: 0.5 * d * d, "mse": lambda d: 0.5 * d * d,
    "k3": k3_reference, "low_var_kl": k3_reference,
}


@pytest.mark.parametrize("name", sorted(KL_ESTIMATORS))
def test_forward_values_match_formulas(name):
    reference = BASE_REFERENCES[name.rstrip("+")]
    deltas = (LOG_PROBS - REF_LOG_PROBS).tolist()
    expected = torch.tensor([[reference(d) for d in row] for row in deltas], dtype=torch.float64)
    torch.testing.assert_close(KL_ESTIMATORS[name](LOG_PROBS, REF_LOG_PROBS), expected)
    torch.testing.assert_close(kl_penalty(name, LOG_PROBS, REF_LOG_PROBS), expected)


def test_k3_clamps():
    # delta = -29 -> exp(29) would explode; -delta is clamped to 20 and the result to 10
    assert float(KL_ESTIMATORS["k3"](LOG_PROBS, REF_LOG_PROBS)[0, 3]) == 10.0
    # delta = 39.3 -> -delta clamped to -20: exp(-20) + 20 - 1 ~ 19 -> clamped to 10
    assert float(KL_ESTIMATORS["k3"](LOG_PROBS, REF_LOG_PROBS)[1, 2]) == 10.0
    assert float(KL_ESTIMATORS["k3"](LOG_PROBS, REF_LOG_PROBS)[0, 1]) == 0.0


@pytest.mark.parametrize("name", ["k1+", "kl+", "abs+", "k2+", "mse+", "k3+", "low_var_kl+"])
def test_straight_through_has_base_value_and_k2_gradient(name):
    log_probs = LOG_PROBS[:, :2].clone().requires_grad_(True)  # unclamped region
    value = kl_penalty(name, log_probs, REF_LOG_PROBS[:, :2])
    base = kl_penalty(name[:-1], log_probs.detach(), REF_LOG_PROBS[:, :2])
    torch.testing.assert_close(value.detach(), base)
    (gradient,) = torch.autograd.grad(value.sum(), log_probs)
    torch.testing.assert_close(gradient, (log_probs - REF_LOG_PROBS[:, :2]).detach())  # d(delta^2/2) = delta


def test_k3_gradient_differs_from_k3_plus():
    log_probs = LOG_PROBS[:, :2].clone().requires_grad_(True)
    (gradient,) = torch.autograd.grad(kl_penalty("k3", log_probs, REF_LOG_PROBS[:, :2]).sum(), log_probs)
    delta = (log_probs - REF_LOG_PROBS[:, :2]).detach()
    torch.testing.assert_close(gradient, 1.0 - torch.exp(-delta))


def test_unknown_names_and_shared_signature():
    with pytest.raises(ValueError, match="valid names: .*k3\\+"):
        kl_penalty("full", LOG_PROBS, REF_LOG_PROBS)
    with pytest.raises(ValueError, match=r"unknown KL estimator 'k3\+\+'"):
        kl_penalty("k3++", LOG_PROBS, REF_LOG_PROBS)
    parameters = {tuple(inspect.signature(fn).parameters) for fn in KL_ESTIMATORS.values()}
    assert parameters == {("log_probs", "ref_log_probs")}


def test_apply_kl_penalty_numbers_and_metrics():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.float64)
    old_log_probs = fill_padding(LOG_PROBS, mask, math.nan)
    scores = fill_padding(torch.tensor([[0.0, 1.0, 0, 0], [0, 0, 2.0, 0]], dtype=torch.float64), mask, math.inf)
    rewards, metrics = apply_kl_penalty(scores, old_log_probs, REF_LOG_PROBS, mask, kl_coef=0.1, kl_type="k1")
    # k1 per token: row 0: [0.2, 0.0]; row 1: [0.3, -1.0, 39.3]
    expected = torch.tensor([[-0.02, 1.0, 0, 0], [-0.03, 0.1, 2.0 - 3.93, 0]], dtype=torch.float64)
    torch.testing.assert_close(rewards, expected)
    current_kl = ((0.2 + 0.0) / 2 + (0.3 - 1.0 + 39.3) / 3) / 2
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(current_kl)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.1
    assert all(isinstance(value, float) for value in metrics.values())


@pytest.mark.parametrize("name", sorted(KL_ESTIMATORS))
def test_apply_kl_penalty_ignores_padding(name):
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.float64)
    old_log_probs = fill_padding(LOG_PROBS, mask, math.nan)
    scores = fill_padding(torch.tensor([[0.0, 1.0, 0, 0], [0, 0, 2.0, 0]], dtype=torch.float64), mask, math.inf)
    rewards, metrics = apply_kl_penalty(scores, old_log_probs, REF_LOG_PROBS, mask, kl_coef=0.1, kl_type=name)
    padded_rewards, padded_metrics = apply_kl_penalty(
        append_padding(scores, 2, math.nan), append_padding(old_log_probs, 2, math.nan),
        append_padding(REF_LOG_PROBS, 2, math.inf), append_padding(mask, 2, 0.0), kl_coef=0.1, kl_type=name,
    )
    assert torch.isfinite(rewards).all() and (rewards[mask == 0] == 0).all()
    torch.testing.assert_close(padded_rewards[:, :4], rewards)
    assert (padded_rewards[:, 4:] == 0).all() and padded_metrics == metrics
    kl = KL_ESTIMATORS[name](LOG_PROBS, REF_LOG_PROBS)
    torch.testing.assert_close(rewards, torch.where(mask.bool(), scores - 0.1 * kl, 0.0))


def test_empty_sequence_is_not_counted_in_current_kl():
    mask = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0]])
    _, metrics = apply_kl_penalty(torch.zeros(2, 4, dtype=torch.float64), LOG_PROBS, REF_LOG_PROBS, mask, 1.0, "k1")
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(0.1)


def test_fixed_controller():
    controller = FixedKLController(kl_coef=0.05)
    controller.update(current_kl=10.0, num_steps=256)
    assert controller.kl_coef == 0.05
    restored = FixedKLController(kl_coef=1.0)
    restored.load_state_dict(controller.state_dict())
    assert restored.kl_coef == 0.05


def test_adaptive_controller_follows_ziegler():
    controller = AdaptiveKLController(kl_coef=0.2, target_kl=0.1, horizon=1000)
    controller.update(current_kl=0.11, num_steps=100)  # error 0.1
    assert controller.kl_coef == pytest.approx(0.2 * (1 + 0.1 * 100 / 1000))
    controller.update(current_kl=5.0, num_steps=100)  # error clipped to 0.2
    assert controller.kl_coef == pytest.approx(0.2 * 1.01 * 1.02)
    controller.update(current_kl=0.0, num_steps=500)  # error clipped to -0.2
    assert controller.kl_coef == pytest.approx(0.2 * 1.01 * 1.02 * 0.9)
    restored = AdaptiveKLController(kl_coef=1.0, target_kl=1.0, horizon=1)
    restored.load_state_dict(controller.state_dict())
    assert restored == controller
    with pytest.raises(ValueError, match="target_kl"):
        AdaptiveKLController(kl_coef=0.1, target_kl=0.0, horizon=10)
    with pytest.raises(ValueError, match="non-finite"):
        controller.update(current_kl=math.nan, num_steps=1)
