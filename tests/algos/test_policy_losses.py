"""Policy losses against float64 loops, plus the PPO properties, padding invariance and the shared signature."""

import inspect
import math

import pytest
import torch

from asyncrl.algos import LOSS_AGG_MODES, POLICY_LOSSES, PolicyLossKnobs
from asyncrl.algos.masked import metrics_to_floats

from .helpers import append_padding, fill_padding, reference_aggregate, valid_positions

MASK = torch.tensor(
    [[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0], [1, 0, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0]],
    dtype=torch.float32,
)
LOW, HIGH, DUAL = 0.2, 0.28, 3.0
TAU_POS, TAU_NEG = 1.5, 2.5  # not the defaults, so a loss that ignored them would fail


def make_inputs(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    old_log_probs = -torch.rand(MASK.shape, generator=generator, dtype=torch.float64) * 3
    # log-ratios in [-1.5, 1.5]: many tokens clipped on each side, some dual-clipped
    log_probs = old_log_probs + (torch.rand(MASK.shape, generator=generator, dtype=torch.float64) - 0.5) * 3
    advantages = torch.randn(MASK.shape, generator=generator, dtype=torch.float64)
    weights = torch.rand(MASK.shape, generator=generator, dtype=torch.float64) + 0.5
    return (
        fill_padding(log_probs, MASK, math.nan).requires_grad_(True),
        fill_padding(old_log_probs, MASK, -math.inf),
        fill_padding(advantages, MASK, math.nan),
        fill_padding(weights, MASK, math.nan),
    )


def per_token_reference(fn, log_probs, old_log_probs, advantages) -> list[list[float]]:
    """Applies fn(logp, old, advantage) -> loss to each valid token; 0 elsewhere."""
    result = [[0.0] * MASK.shape[1] for _ in range(MASK.shape[0])]
    for i, row in enumerate(valid_positions(MASK)):
        for t in row:
            result[i][t] = fn(float(log_probs[i, t].detach()), float(old_log_probs[i, t]), float(advantages[i, t]))
    return result


def vanilla_token(logp, old, advantage):
    ratio = math.exp(min(max(logp - old, -20), 20))
    loss = max(-advantage * ratio, -advantage * min(max(ratio, 1 - LOW), 1 + HIGH))
    return min(loss, -advantage * DUAL) if advantage < 0 else loss


def full_keywords(**overrides):
    """A call's keywords: the knob record (overrides of a knob land in it) and the batch's own values."""
    knobs = dict(loss_agg_mode="token-mean", clip_ratio_low=LOW, clip_ratio_high=HIGH, clip_ratio_c=DUAL,
                 clip_cov_ratio=0.3, clip_cov_lb=-10.0, clip_cov_ub=10.0, kl_cov_ratio=0.3, ppo_kl_coef=0.5,
                 tau_pos=TAU_POS, tau_neg=TAU_NEG)
    keywords = dict(rollout_is_weights=None, num_tokens=None, num_seqs=None, norm_length=None,
                    generator=torch.Generator().manual_seed(5))
    for name, value in overrides.items():
        (knobs if name in knobs else keywords)[name] = value
    return {"knobs": PolicyLossKnobs(**knobs), **keywords}


def ppo_kl_reference(log_probs, old_log_probs) -> float:
    return reference_aggregate(per_token_reference(lambda lp, old, a: old - lp, log_probs, old_log_probs,
                                                   old_log_probs), MASK, "token-mean", 6)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_vanilla_matches_loop(mode):
    log_probs, old_log_probs, advantages, _ = make_inputs()
    loss, metrics = POLICY_LOSSES["vanilla"](log_probs, old_log_probs, advantages, MASK, **full_keywords(loss_agg_mode=mode))
    per_token = per_token_reference(vanilla_token, log_probs, old_log_probs, advantages)
    assert loss.item() == pytest.approx(reference_aggregate(per_token, MASK, mode, norm_length=6))
    assert metrics["pg_loss"] == pytest.approx(loss.item())
    assert metrics["ppo_kl"] == pytest.approx(ppo_kl_reference(log_probs, old_log_probs))

    def clipped(logp, old, advantage):
        ratio = math.exp(logp - old)
        return float(-advantage * min(max(ratio, 1 - LOW), 1 + HIGH) > -advantage * ratio)

    def dual_clipped(logp, old, advantage):
        ratio = math.exp(logp - old)
        return float(advantage < 0 and vanilla_token(logp, old, advantage) == -advantage * DUAL)

    for name, fn in (("pg_clipfrac", clipped), ("pg_clipfrac_lower", dual_clipped)):
        expected = reference_aggregate(per_token_reference(fn, log_probs, old_log_probs, advantages), MASK,
                                       "token-mean", 6)
        assert metrics[name] == pytest.approx(expected)
    assert 0 < metrics["pg_clipfrac"] < 1 and metrics["pg_clipfrac_lower"] > 0  # the data exercises both clips


def test_vanilla_equals_reinforce_at_ratio_one():
    log_probs, _, advantages, _ = make_inputs()
    old_log_probs = log_probs.detach().clone()
    loss, metrics = POLICY_LOSSES["vanilla"](log_probs, old_log_probs, advantages, MASK)
    (gradient,) = torch.autograd.grad(loss, log_probs)
    valid = MASK.bool()
    assert loss.item() == pytest.approx(-float(advantages[valid].mean()))
    assert metrics["pg_clipfrac"] == 0.0 and metrics["ppo_kl"] == 0.0
    reinforce_loss, _ = POLICY_LOSSES["reinforce"](log_probs, old_log_probs, advantages, MASK)
    (reinforce_gradient,) = torch.autograd.grad(reinforce_loss, log_probs)
    torch.testing.assert_close(gradient, reinforce_gradient)
    expected = torch.where(valid, -advantages / valid.sum(), 0.0)
    torch.testing.assert_close(gradient, expected)


def test_dual_clip_bounds_negative_advantages():
    log_probs = torch.full((1, 4), 3.0, dtype=torch.float64, requires_grad=True)  # ratio e^3 ~ 20
    old_log_probs = torch.zeros(1, 4, dtype=torch.float64)
    advantages = torch.tensor([[-1.0, -2.0, 0.5, -0.1]], dtype=torch.float64)
    mask = torch.ones(1, 4)
    loss, metrics = POLICY_LOSSES["vanilla"](log_probs, old_log_probs, advantages, mask, PolicyLossKnobs(clip_ratio_c=DUAL))
    # negative advantages are capped at -A * c; the positive one is clipped at 1 + eps_high
    expected = (1.0 * DUAL + 2.0 * DUAL - 0.5 * 1.2 + 0.1 * DUAL) / 4
    assert loss.item() == pytest.approx(expected)
    assert metrics["pg_clipfrac_lower"] == pytest.approx(0.75)
    (gradient,) = torch.autograd.grad(loss, log_probs)
    assert gradient.abs().max() == 0.0  # every token is clipped one way or the other
    with pytest.raises(ValueError, match="clip_ratio_c"):
        POLICY_LOSSES["vanilla"](log_probs, old_log_probs, advantages, mask, PolicyLossKnobs(clip_ratio_c=1.0))


def test_gspo_uses_sequence_ratio_with_per_token_gradient():
    log_probs, old_log_probs, advantages, _ = make_inputs()
    loss, metrics = POLICY_LOSSES["gspo"](log_probs, old_log_probs, advantages, MASK,
                                          **full_keywords(loss_agg_mode="seq-mean-token-mean"))
    (gradient,) = torch.autograd.grad(loss, log_probs)
    rows = valid_positions(MASK)
    num_seqs = sum(1 for row in rows if row)
    expected_loss = 0.0
    for i, row in enumerate(rows):
        if not row:
            continue
        ratio = math.exp(sum(float(log_probs[i, t].detach() - old_log_probs[i, t]) for t in row) / len(row))
        for t in row:
            advantage = float(advantages[i, t])
            unclipped, clipped = -advantage * ratio, -advantage * min(max(ratio, 1 - LOW), 1 + HIGH)
            expected_loss += max(unclipped, clipped) / len(row) / num_seqs
            # d/dlogp_it of -A s_i (straight-through: d s_i / d logp_it = s_i) unless the clip is active
            expected_gradient = 0.0 if clipped > unclipped else -advantage * ratio / len(row) / num_seqs
            assert float(gradient[i, t]) == pytest.approx(expected_gradient)
    assert loss.item() == pytest.approx(expected_loss)
    assert metrics["ppo_kl"] == pytest.approx(ppo_kl_reference(log_probs, old_log_probs))


def test_cispo_clips_the_weight_not_the_gradient():
    log_probs, old_log_probs, advantages, _ = make_inputs()
    loss, metrics = POLICY_LOSSES["cispo"](log_probs, old_log_probs, advantages, MASK, **full_keywords())
    (gradient,) = torch.autograd.grad(loss, log_probs)
    num_tokens = int(MASK.sum())
    weights = per_token_reference(lambda lp, old, a: min(max(math.exp(lp - old), 1 - LOW), 1 + HIGH),
                                  log_probs, old_log_probs, advantages)
    per_token = per_token_reference(lambda lp, old, a: -min(max(math.exp(lp - old), 1 - LOW), 1 + HIGH) * a * lp,
                                    log_probs, old_log_probs, advantages)
    assert loss.item() == pytest.approx(reference_aggregate(per_token, MASK, "token-mean", 6))
    for i, row in enumerate(valid_positions(MASK)):
        for t in row:  # every token keeps a gradient, scaled by its clipped weight
            assert float(gradient[i, t]) == pytest.approx(-weights[i][t] * float(advantages[i, t]) / num_tokens)
    assert 0 < metrics["pg_clipfrac"] < 1


def test_reinforce_is_weighted_policy_gradient():
    log_probs, old_log_probs, advantages, weights = make_inputs()
    loss, metrics = POLICY_LOSSES["reinforce"](log_probs, old_log_probs, advantages, MASK,
                                               **full_keywords(rollout_is_weights=weights))
    per_token = [[0.0] * 6 for _ in range(5)]
    for i, row in enumerate(valid_positions(MASK)):
        for t in row:
            per_token[i][t] = -float(weights[i, t]) * float(advantages[i, t]) * float(log_probs[i, t].detach())
    assert loss.item() == pytest.approx(reference_aggregate(per_token, MASK, "token-mean", 6))
    assert metrics["pg_clipfrac"] == 0.0
    assert metrics["ppo_kl"] == pytest.approx(ppo_kl_reference(log_probs, old_log_probs))


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_gpg_is_the_plain_policy_gradient(mode):
    log_probs, old_log_probs, advantages, weights = make_inputs()
    loss, metrics = POLICY_LOSSES["gpg"](log_probs, old_log_probs, advantages, MASK,
                                         **full_keywords(loss_agg_mode=mode, rollout_is_weights=weights))
    (gradient,) = torch.autograd.grad(loss, log_probs)
    per_token = [[0.0] * 6 for _ in range(5)]
    for i, row in enumerate(valid_positions(MASK)):
        for t in row:  # no ratio, no clip: -w A logp, whatever old_log_probs are
            per_token[i][t] = -float(weights[i, t]) * float(advantages[i, t]) * float(log_probs[i, t].detach())
    assert loss.item() == pytest.approx(reference_aggregate(per_token, MASK, mode, norm_length=6))
    assert metrics["pg_clipfrac"] == 0.0 and metrics["pg_clipfrac_lower"] == 0.0
    assert metrics["ppo_kl"] == pytest.approx(ppo_kl_reference(log_probs, old_log_probs))
    if mode == "token-mean":
        num_tokens = int(MASK.sum())
        expected = torch.where(MASK.bool(), -weights * advantages / num_tokens, 0.0)
        torch.testing.assert_close(gradient, expected)


def sapo_gate(logp: float, old: float, advantage: float) -> float:
    tau = TAU_POS if advantage > 0 else TAU_NEG
    ratio = math.exp(logp - old)
    return 1.0 / (1.0 + math.exp(-tau * (ratio - 1.0))) * 4.0 / tau


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_sapo_matches_loop(mode):
    log_probs, old_log_probs, advantages, _ = make_inputs()
    loss, metrics = POLICY_LOSSES["sapo"](log_probs, old_log_probs, advantages, MASK,
                                          **full_keywords(loss_agg_mode=mode))
    (gradient,) = torch.autograd.grad(loss, log_probs)
    per_token = per_token_reference(lambda lp, old, a: -a * sapo_gate(lp, old, a), log_probs, old_log_probs,
                                    advantages)
    assert loss.item() == pytest.approx(reference_aggregate(per_token, MASK, mode, norm_length=6))
    assert metrics["pg_clipfrac"] == 0.0 and metrics["pg_clipfrac_lower"] == 0.0  # a soft gate never clips
    assert metrics["ppo_kl"] == pytest.approx(ppo_kl_reference(log_probs, old_log_probs))
    if mode == "token-mean":
        num_tokens = int(MASK.sum())
        for i, row in enumerate(valid_positions(MASK)):
            for t in row:  # d/dlogp of -A f(rho) = -A 4 s (1 - s) rho, s the gate's sigmoid
                logp, old = float(log_probs[i, t].detach()), float(old_log_probs[i, t])
                advantage = float(advantages[i, t])
                ratio = math.exp(logp - old)
                sigmoid = sapo_gate(logp, old, advantage) * (TAU_POS if advantage > 0 else TAU_NEG) / 4.0
                expected = -advantage * 4.0 * sigmoid * (1.0 - sigmoid) * ratio / num_tokens
                assert float(gradient[i, t]) == pytest.approx(expected)


def test_sapo_by_hand_and_its_slope_at_the_anchor_is_ppo():
    """Token 0: rho = 1, A = 1 -> loss -sigmoid(0) 4 / 1 = -2. Token 1: rho = 2, A = -1, tau_neg = 1.05 ->
    loss +sigmoid(1.05) 4 / 1.05. At rho = 1 the gradient is -A, the unclipped PPO gradient."""
    old_log_probs = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
    log_probs = (old_log_probs + torch.tensor([[0.0, math.log(2.0)]], dtype=torch.float64)).requires_grad_(True)
    advantages = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    loss, _ = POLICY_LOSSES["sapo"](log_probs, old_log_probs, advantages, torch.ones(1, 2),
                                    PolicyLossKnobs(loss_agg_mode="seq-mean-token-mean"))  # tau 1.0 and 1.05
    sigmoid = 1.0 / (1.0 + math.exp(-1.05))  # 0.7408
    assert loss.item() == pytest.approx((-2.0 + sigmoid * 4.0 / 1.05) / 2)
    (gradient,) = torch.autograd.grad(loss, log_probs)
    assert float(gradient[0, 0]) == pytest.approx(-1.0 / 2)
    assert float(gradient[0, 1]) == pytest.approx(4.0 * sigmoid * (1.0 - sigmoid) * 2.0 / 2)
    with pytest.raises(ValueError, match="tau_pos=0.0 and tau_neg=1.05"):
        POLICY_LOSSES["sapo"](log_probs, old_log_probs, advantages, torch.ones(1, 2), PolicyLossKnobs(tau_pos=0.0))


def geo_mean_reference(log_probs, old_log_probs, advantages, weights=None):
    """Per sequence: the clipped log-ratios, s_i, and the per-token loss -A s_i (x the geometric mean weight)."""
    per_token, ratios, clipped = [[0.0] * 6 for _ in range(5)], [1.0] * 5, [[False] * 6 for _ in range(5)]
    for i, row in enumerate(valid_positions(MASK)):
        log_ratios = []
        for t in row:
            log_ratio, advantage = float(log_probs[i, t].detach() - old_log_probs[i, t]), float(advantages[i, t])
            if advantage > 0:
                log_ratios.append(min(log_ratio, HIGH))
            elif advantage < 0:
                log_ratios.append(max(log_ratio, -LOW))
            else:
                log_ratios.append(0.0)
            clipped[i][t] = (advantage > 0 and log_ratio > HIGH) or (advantage < 0 and log_ratio < -LOW)
        ratios[i] = math.exp(sum(log_ratios) / len(log_ratios)) if row else 1.0
        factor = math.exp(sum(math.log(float(weights[i, t])) for t in row) / len(row)) if weights is not None \
            and row else 1.0
        for t in row:
            per_token[i][t] = -float(advantages[i, t]) * ratios[i] * factor
    return per_token, ratios, clipped


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_geo_mean_matches_loop(mode):
    log_probs, old_log_probs, advantages, weights = make_inputs()
    loss, metrics = POLICY_LOSSES["geo_mean"](log_probs, old_log_probs, advantages, MASK,
                                              **full_keywords(loss_agg_mode=mode, rollout_is_weights=weights))
    (gradient,) = torch.autograd.grad(loss, log_probs)
    per_token, ratios, clipped = geo_mean_reference(log_probs, old_log_probs, advantages, weights)
    assert loss.item() == pytest.approx(reference_aggregate(per_token, MASK, mode, norm_length=6))
    num_clipped = sum(clipped[i][t] for i, row in enumerate(valid_positions(MASK)) for t in row)
    assert 0 < num_clipped and metrics["pg_clipfrac"] == pytest.approx(num_clipped / int(MASK.sum()))
    assert metrics["pg_clipfrac_lower"] == 0.0  # no dual clip
    assert metrics["ppo_kl"] == pytest.approx(ppo_kl_reference(log_probs, old_log_probs))
    if mode == "seq-mean-token-mean":
        rows = valid_positions(MASK)
        num_seqs = sum(1 for row in rows if row)
        for i, row in enumerate(rows):
            for t in row:  # d/dlogp_it of mean_t(-A_it s_i w_i) = -mean(A_i) w_i s_i / n_i, 0 when clipped
                mean_advantage = sum(float(advantages[i, j]) for j in row) / len(row)
                factor = -per_token[i][t] / float(advantages[i, t]) / ratios[i]  # the sequence's weight
                expected = 0.0 if clipped[i][t] else -mean_advantage * factor * ratios[i] / len(row) / num_seqs
                assert float(gradient[i, t]) == pytest.approx(expected)


@pytest.mark.parametrize(("sign", "log_ratios", "kept"), [(1.0, [0.5, -0.1], [0.2, -0.1]),
                                                           (-1.0, [0.5, -0.3], [0.5, -0.2])])
def test_geo_mean_by_hand(sign, log_ratios, kept):
    """One sequence of two tokens, clip 0.2 on each side: A > 0 clips only the rising log-ratio 0.5 to 0.2;
    A < 0 clips only the falling -0.3 to -0.2. s = exp(mean of what is kept); loss = -A s."""
    old_log_probs = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
    log_probs = (old_log_probs + torch.tensor([log_ratios], dtype=torch.float64)).requires_grad_(True)
    advantages = torch.full((1, 2), sign, dtype=torch.float64)
    loss, metrics = POLICY_LOSSES["geo_mean"](log_probs, old_log_probs, advantages, torch.ones(1, 2),
                                              PolicyLossKnobs(loss_agg_mode="seq-mean-token-mean"))
    ratio = math.exp(sum(kept) / 2)
    assert loss.item() == pytest.approx(-sign * ratio)
    assert metrics["pg_clipfrac"] == pytest.approx(0.5)
    (gradient,) = torch.autograd.grad(loss, log_probs)
    clipped_token = 0 if sign > 0 else 1
    assert float(gradient[0, clipped_token]) == 0.0
    assert float(gradient[0, 1 - clipped_token]) == pytest.approx(-sign * ratio / 2)


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_rollout_is_weights_multiply_every_loss(name):
    log_probs, old_log_probs, advantages, weights = make_inputs()
    keywords = full_keywords(loss_agg_mode="seq-mean-token-sum")
    base, _ = POLICY_LOSSES[name](log_probs, old_log_probs, advantages, MASK, **keywords)
    keywords["generator"] = torch.Generator().manual_seed(5)
    doubled, _ = POLICY_LOSSES[name](log_probs, old_log_probs, advantages, MASK,
                                     **{**keywords, "rollout_is_weights": torch.full_like(weights, 2.0)})
    assert doubled.item() == pytest.approx(2 * base.item())
    keywords["generator"] = torch.Generator().manual_seed(5)
    weighted, _ = POLICY_LOSSES[name](log_probs, old_log_probs, advantages, MASK,
                                      **{**keywords, "rollout_is_weights": weights.requires_grad_(True)})
    gradients = torch.autograd.grad(weighted, [log_probs, weights], allow_unused=True)
    assert torch.isfinite(gradients[0]).all()
    assert gradients[1] is None  # the weights are constants of the loss


def _clip_cov_reference(log_probs, old_log_probs, advantages):
    valid = MASK.bool()
    lp = log_probs.detach()
    centred = (advantages - advantages[valid].mean()) * (lp - lp[valid].mean())
    ratio = torch.exp(lp - old_log_probs)
    unclipped, clipped = -advantages * ratio, -advantages * ratio.clamp(1 - LOW, 1 + HIGH)
    return centred, unclipped, clipped, valid


def test_clip_cov_removes_a_random_fraction_of_eligible_tokens():
    log_probs, old_log_probs, advantages, _ = make_inputs()
    centred, unclipped, clipped, valid = _clip_cov_reference(log_probs, old_log_probs, advantages)
    lower, upper = -1.0, 1.0
    eligible = valid & ~(clipped > unclipped) & (centred > lower) & (centred < upper)
    num_selected = min(max(int(0.3 * int(valid.sum())), 1), int(eligible.sum()))
    # the data makes the choice and the bounds matter
    assert 0 < num_selected < int(eligible.sum()) < int((valid & ~(clipped > unclipped)).sum())

    keywords = full_keywords(clip_cov_lb=lower, clip_cov_ub=upper)
    loss, metrics = POLICY_LOSSES["clip_cov"](log_probs, old_log_probs, advantages, MASK, **keywords)
    (gradient,) = torch.autograd.grad(loss, log_probs)
    removed = valid & (gradient == 0) & ~(clipped > unclipped)
    assert int(removed.sum()) == num_selected and bool((removed <= eligible).all())
    surrogate = torch.maximum(unclipped, clipped)
    expected = float(torch.where(valid & ~removed, surrogate, 0.0).sum() / valid.sum())
    assert loss.item() == pytest.approx(expected)
    assert metrics["pg_covfrac"] == pytest.approx(num_selected / int(valid.sum()))

    again, _ = POLICY_LOSSES["clip_cov"](log_probs, old_log_probs, advantages, MASK,
                                         **full_keywords(clip_cov_lb=lower, clip_cov_ub=upper))
    assert again.item() == loss.item()  # same seed, same choice


def test_kl_cov_penalises_top_covariance_tokens():
    log_probs, old_log_probs, advantages, _ = make_inputs()
    centred, _, _, valid = _clip_cov_reference(log_probs, old_log_probs, advantages)
    num_valid = int(valid.sum())
    num_selected = max(int(0.3 * num_valid), 1)
    threshold = sorted(centred[valid].tolist(), reverse=True)[num_selected - 1]
    selected = valid & (centred >= threshold)
    log_ratio = log_probs.detach() - old_log_probs
    per_token = -advantages * torch.exp(log_ratio) + torch.where(selected, 0.5 * log_ratio.abs(), 0.0)
    loss, metrics = POLICY_LOSSES["kl_cov"](log_probs, old_log_probs, advantages, MASK, **full_keywords())
    assert loss.item() == pytest.approx(float(torch.where(valid, per_token, 0.0).sum() / num_valid))
    assert metrics["pg_covfrac"] == pytest.approx(num_selected / num_valid)
    assert metrics["ppo_kl"] == pytest.approx(ppo_kl_reference(log_probs, old_log_probs))


def test_the_knob_record_is_read_from_the_config_by_name_and_its_defaults_are_the_schema_s():
    """A knob is a field of PolicyLossKnobs and a key of that name in actor.policy_loss (or actor): nothing else
    carries it from the config to the losses, and the record's defaults are the config's."""
    from dataclasses import dataclass, fields, make_dataclass

    from asyncrl.config import load_config
    from asyncrl.config.schema import AsyncRLConfig
    actor = AsyncRLConfig().actor
    assert PolicyLossKnobs.from_sections(actor.policy_loss, actor) == PolicyLossKnobs()
    config = load_config(None, ["actor.policy_loss.clip_cov_ub=7.5", "actor.clip_ratio_high=0.28",
                                "actor.loss_agg_mode=seq-mean-token-mean"])
    knobs = PolicyLossKnobs.from_sections(config.actor.policy_loss, config.actor)
    assert (knobs.clip_cov_ub, knobs.clip_ratio_high, knobs.loss_agg_mode) == (7.5, 0.28, "seq-mean-token-mean")
    # A new knob: one field in the record, one key in the schema's section.
    Knobs = make_dataclass("Knobs", [("new_knob", float, 0.5)], bases=(PolicyLossKnobs,), frozen=True)
    Section = make_dataclass("Section", [(field.name, field.type, field.default) for field in
                                         fields(type(actor.policy_loss))] + [("new_knob", float, 0.25)])
    assert Knobs.from_sections(Section(), actor).new_knob == 0.25
    with pytest.raises(TypeError, match="no config section holds new_knob"):
        Knobs.from_sections(actor.policy_loss, actor)


def test_every_loss_has_the_same_signature():
    signatures = {name: str(inspect.signature(fn)) for name, fn in POLICY_LOSSES.items()}
    assert len(set(signatures.values())) == 1, signatures
    with pytest.raises(ValueError, match="valid names: .*vanilla"):
        POLICY_LOSSES["ppo"]


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_padding_never_changes_a_result(name, mode):
    log_probs, old_log_probs, advantages, weights = make_inputs()
    keywords = full_keywords(loss_agg_mode=mode, rollout_is_weights=weights, norm_length=12)
    loss, metrics = POLICY_LOSSES[name](log_probs, old_log_probs, advantages, MASK, **keywords)
    (gradient,) = torch.autograd.grad(loss, log_probs)

    padded_log_probs = append_padding(log_probs.detach(), 3, math.nan).requires_grad_(True)
    keywords.update(rollout_is_weights=append_padding(weights, 3, math.inf),
                    generator=torch.Generator().manual_seed(5))
    padded_loss, padded_metrics = POLICY_LOSSES[name](
        padded_log_probs, append_padding(old_log_probs, 3, math.inf), append_padding(advantages, 3, math.nan),
        append_padding(MASK, 3, 0.0), **keywords,
    )
    (padded_gradient,) = torch.autograd.grad(padded_loss, padded_log_probs)
    assert math.isfinite(loss.item()) and torch.isfinite(gradient).all()
    torch.testing.assert_close(padded_loss, loss)
    assert metrics_to_floats(padded_metrics) == pytest.approx(metrics_to_floats(metrics))
    torch.testing.assert_close(padded_gradient[:, :6], gradient)
    assert (padded_gradient[:, 6:] == 0).all() and (gradient[MASK == 0] == 0).all()
    assert gradient.abs().sum() > 0


def meta_call(name: str, mode: str, counts: str):
    """The loss on meta tensors, which have shapes but no values: every op runs, and any read of a value on the
    host (`.item()`, `int(t)`, `.tolist()`, a data-dependent shape) raises. The global counts are meta tensors
    too, as the captured step passes them, or left to the loss."""
    log_probs, old_log_probs, advantages, weights = (torch.empty(MASK.shape, dtype=torch.float64, device="meta")
                                                     for _ in range(4))
    log_probs.requires_grad_(True)
    count = torch.empty((), device="meta") if counts == "given" else None
    keywords = full_keywords(loss_agg_mode=mode, rollout_is_weights=weights, num_tokens=count, num_seqs=count,
                             norm_length=12, generator=None)
    loss, metrics = POLICY_LOSSES[name](log_probs, old_log_probs, advantages, torch.empty(MASK.shape, device="meta"),
                                        **keywords)
    return log_probs, loss, metrics


@pytest.mark.parametrize("counts", ["given", "local"])
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("name", [spec.name for spec in POLICY_LOSSES.specs() if spec.host_read is None])
def test_a_loss_call_never_waits_for_the_device(name, mode, counts):
    log_probs, loss, metrics = meta_call(name, mode, counts)
    (gradient,) = torch.autograd.grad(loss, log_probs)
    assert loss.shape == () and gradient.shape == MASK.shape
    tensors = {key: value for key, value in metrics.items() if isinstance(value, torch.Tensor)}
    assert {"pg_loss", "ppo_kl"} <= set(tensors)
    assert all(value.is_meta and value.shape == () and not value.requires_grad for value in tensors.values())
    assert all(value == 0.0 for key, value in metrics.items() if key not in tensors)  # terms it does not have


@pytest.mark.parametrize("name", [spec.name for spec in POLICY_LOSSES.specs() if spec.host_read is not None])
def test_the_losses_that_declare_a_host_read_do_read_the_host(name):
    """The exemption stays true: a loss that stopped reading the host would drop its `host_read`."""
    with pytest.raises((RuntimeError, NotImplementedError), match="meta"):
        meta_call(name, "token-mean", "local")


def test_what_a_cuda_graph_may_capture_is_what_never_reads_the_host():
    capturable = {spec.name for spec in POLICY_LOSSES.builtin_specs() if spec.capturable}
    host_readers = {spec.name for spec in POLICY_LOSSES.builtin_specs() if spec.host_read is not None}
    assert capturable == {"vanilla", "gspo", "cispo", "reinforce", "gpg", "sapo", "geo_mean"}
    assert host_readers == {"clip_cov", "kl_cov"}
