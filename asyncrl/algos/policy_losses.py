"""Policy-gradient losses of the PPO family.

Every loss has the same signature, so the trainer calls ``POLICY_LOSSES[name](...)`` with one knob record and the
batch's own values, and each entry reads what it needs:

    fn(log_probs,            # (B, T) log-probs of the current policy, with gradient
       old_log_probs,        # (B, T) log-probs of the PPO anchor (proximal policy; rollout policy in bypass mode)
       advantages,           # (B, T)
       response_mask,        # (B, T) float or bool, 1 on valid response tokens
       knobs=PolicyLossKnobs(),               # the configuration: clip ratios, aggregation, each loss's own knobs
       *, rollout_is_weights=None,            # (B, T) importance weights rollout -> anchor, treated as constants
       num_tokens=None, num_seqs=None, norm_length=None,   # global counts, see aggregation.py
       generator=None,                        # torch.Generator for clip_cov's random choice
    ) -> (loss scalar, metrics)

rho = exp(clamp(log_probs - old_log_probs, -20, 20)) is the per-token ratio. When ``rollout_is_weights`` is given,
every loss multiplies its per-token loss by it before aggregation (geo_mean by each sequence's geometric mean of
them, since its ratio is one per sequence). The loss configuration (`PolicyLossKnobs`) is passed with each call,
never read from a shared config, so what the trainer asks for is what runs. Every knob has the reference system's
default.

Metrics (detached 0-dim tensors on the inputs' device, or Python floats for a term a loss does not have; a
trainer sums them on the device, and ``masked.metrics_to_floats`` turns them into floats with one copy, so a
loss call never makes the host wait for the GPU, except in the losses registered with a ``host_read``, which
says why): ``pg_loss``, ``pg_clipfrac`` (fraction of valid tokens where the ratio clip is active),
``pg_clipfrac_lower`` (dual clip active), ``ppo_kl`` (masked mean of old - new log-prob); clip_cov and kl_cov
add ``pg_covfrac`` (fraction of valid tokens selected by the covariance rule).

A new loss is a function of this signature plus ``@POLICY_LOSSES.register(name, summary=...)``; its record
(``PolicyLossSpec``) is what config validation reads (``actor.cuda_graphs`` takes only capturable losses).
"""

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from asyncrl.algos.aggregation import aggregate_loss
from asyncrl.algos.knobs import Knobs
from asyncrl.algos.masked import as_bool_mask, fill_invalid, masked_mean
from asyncrl.registry import Entry, Registry, column

_MAX_LOG_RATIO = 20.0  # exp(20) ~ 5e8: large enough never to matter, small enough never to overflow float32


@dataclass(frozen=True)
class PolicyLossSpec(Entry):
    """How a policy loss runs on the device."""

    # Why the loss reads a device value on the host (on a GPU, a wait for every queued kernel at each call);
    # None for a loss that never does, which `tests/algos` checks on the meta device.
    host_read: Optional[str] = column("reads the host (so no CUDA graph)", None)

    @property
    def capturable(self) -> bool:
        """Whether a CUDA graph can replay it: a graph replays fixed kernels on fixed shapes, and a host read (a
        synchronisation, or a shape taken from the data) is exactly what it cannot replay."""
        return self.host_read is None


POLICY_LOSSES: Registry[PolicyLossSpec] = Registry("policy loss", PolicyLossSpec, plural="policy losses")


@dataclass(frozen=True)
class PolicyLossKnobs(Knobs):
    """Every policy loss's configuration, one record (each loss reads the knobs it needs): the actor's clip
    ratios and aggregation, and `actor.policy_loss`'s knobs, under their config names. A new knob is a field here
    and a key of that name in the schema (`actor.policy_loss`): `from_sections` carries it from the config to
    every loss (`Knobs.from_sections`). The defaults are the reference system's (and the schema's: tests/algos
    checks they agree)."""

    loss_agg_mode: str = "token-mean"
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0          # the dual clip's bound for negative advantages
    clip_cov_ratio: float = 2e-4       # clip_cov: fraction of valid tokens whose loss is removed
    clip_cov_lb: float = 1.0           # clip_cov: the covariance window (lb, ub)
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 2e-4         # kl_cov: fraction of valid tokens penalised
    ppo_kl_coef: float = 0.1           # kl_cov: coefficient of the |log-ratio| penalty
    tau_pos: float = 1.0               # sapo: the gate's temperatures for A > 0 and A <= 0
    tau_neg: float = 1.05


DEFAULT_KNOBS = PolicyLossKnobs()


def _prepare(log_probs, old_log_probs, advantages, response_mask):
    """Zeroes padding (it may hold nan) and detaches the constants; returns (valid, log_probs, advantages, log_ratio)."""
    valid = as_bool_mask(response_mask)  # (B, T)
    log_probs = fill_invalid(log_probs, valid)  # keeps the gradient on valid tokens, 0 gradient on padding
    old_log_probs = fill_invalid(old_log_probs.detach(), valid)
    advantages = fill_invalid(advantages.detach(), valid)
    return valid, log_probs, advantages, log_probs - old_log_probs


def _ratio(log_ratio: Tensor) -> Tensor:
    return torch.exp(log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))


def _clipped_surrogate(ratio, advantages, clip_ratio_low, clip_ratio_high):
    """PPO's max(-A rho, -A clip(rho, 1 - low, 1 + high)) per token, and where the clipped term won."""
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def _finish(per_token_loss, valid, rollout_is_weights, loss_agg_mode, num_tokens, num_seqs, norm_length, metrics):
    """Applies the rollout IS weights and aggregates; the metrics stay tensors (see the module docstring)."""
    if rollout_is_weights is not None:
        per_token_loss = per_token_loss * fill_invalid(rollout_is_weights.detach(), valid)
    loss = aggregate_loss(
        per_token_loss, valid, loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs, norm_length=norm_length
    )
    return loss, {"pg_loss": loss.detach(), **metrics}


def _base_metrics(valid, log_ratio, is_clipped=None, is_dual_clipped=None) -> dict[str, Tensor | float]:
    with torch.no_grad():
        return {
            "pg_clipfrac": 0.0 if is_clipped is None else masked_mean(is_clipped.float(), valid),
            "pg_clipfrac_lower": 0.0 if is_dual_clipped is None else masked_mean(is_dual_clipped.float(), valid),
            "ppo_kl": masked_mean(-log_ratio.detach(), valid),
        }


def _covariance(advantages, log_probs, valid) -> Tensor:
    """Centred per-token covariance (A - mean A)(logp - mean logp) over valid tokens; -inf on padding. (B, T)"""
    with torch.no_grad():
        log_probs = log_probs.detach()
        centred = (advantages - masked_mean(advantages, valid)) * (log_probs - masked_mean(log_probs, valid))
        return torch.where(valid, centred, -torch.inf)


@POLICY_LOSSES.register("vanilla", summary="PPO clip with asymmetric bounds and dual clip")
def vanilla(log_probs, old_log_probs, advantages, response_mask, knobs=DEFAULT_KNOBS, *,
            rollout_is_weights=None, num_tokens=None, num_seqs=None, norm_length=None, generator=None):
    """PPO clip with asymmetric bounds [1 - low, 1 + high] and dual clip (Ye et al.).

    L = max(-A rho, -A clip(rho)); for A < 0 the loss is further capped: L = min(L, -A clip_ratio_c).
    """
    if knobs.clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for the dual clip, got {knobs.clip_ratio_c}")
    valid, log_probs, advantages, log_ratio = _prepare(log_probs, old_log_probs, advantages, response_mask)
    surrogate, is_clipped = _clipped_surrogate(_ratio(log_ratio), advantages, knobs.clip_ratio_low,
                                               knobs.clip_ratio_high)
    dual_bound = -advantages * knobs.clip_ratio_c
    is_dual_clipped = (advantages < 0) & (surrogate > dual_bound)
    per_token_loss = torch.where(is_dual_clipped, dual_bound, surrogate)
    metrics = _base_metrics(valid, log_ratio, is_clipped & valid, is_dual_clipped)
    return _finish(per_token_loss, valid, rollout_is_weights, knobs.loss_agg_mode, num_tokens, num_seqs, norm_length,
                   metrics)


@POLICY_LOSSES.register("gspo", summary="GSPO: PPO clip on the sequence ratio exp(mean_t log rho)")
def gspo(log_probs, old_log_probs, advantages, response_mask, knobs=DEFAULT_KNOBS, *,
         rollout_is_weights=None, num_tokens=None, num_seqs=None, norm_length=None, generator=None):
    """GSPO (Zheng et al.): PPO clip (no dual clip) on the sequence ratio s_i = exp(mean_t log rho_it).

    Straight-through construction: log s_it = logp_it - sg(logp_it) + sg(mean_t log rho_it), so the forward
    value is the sequence ratio while each token gets the gradient of its own log-prob. Clamped at 10 in log
    space. Its paper aggregates with seq-mean-token-mean.
    """
    valid, log_probs, advantages, log_ratio = _prepare(log_probs, old_log_probs, advantages, response_mask)
    sequence_log_ratio = masked_mean(log_ratio, valid, dim=-1).detach()  # (B,)
    log_sequence_ratio = log_probs - log_probs.detach() + sequence_log_ratio[:, None]  # (B, T)
    ratio = torch.exp(log_sequence_ratio.clamp(max=10.0))
    per_token_loss, is_clipped = _clipped_surrogate(ratio, advantages, knobs.clip_ratio_low, knobs.clip_ratio_high)
    metrics = _base_metrics(valid, log_ratio, is_clipped & valid)
    return _finish(per_token_loss, valid, rollout_is_weights, knobs.loss_agg_mode, num_tokens, num_seqs, norm_length,
                   metrics)


@POLICY_LOSSES.register("cispo", summary="CISPO: -clip(rho) A logp, the clipped ratio as a constant weight")
def cispo(log_probs, old_log_probs, advantages, response_mask, knobs=DEFAULT_KNOBS, *,
          rollout_is_weights=None, num_tokens=None, num_seqs=None, norm_length=None, generator=None):
    """CISPO (MiniMax-M1): L = -sg(clip(rho, 1 - low, 1 + high)) A logp.

    The clip bounds the importance weight instead of removing the gradient, so every token keeps a gradient.
    """
    valid, log_probs, advantages, log_ratio = _prepare(log_probs, old_log_probs, advantages, response_mask)
    ratio = _ratio(log_ratio).detach()
    weight = ratio.clamp(1.0 - knobs.clip_ratio_low, 1.0 + knobs.clip_ratio_high)
    per_token_loss = -weight * advantages * log_probs
    metrics = _base_metrics(valid, log_ratio, (weight != ratio) & valid)
    return _finish(per_token_loss, valid, rollout_is_weights, knobs.loss_agg_mode, num_tokens, num_seqs, norm_length,
                   metrics)


@POLICY_LOSSES.register(
    "clip_cov", summary="Clip-Cov: PPO clip, minus the loss of a few random high-covariance tokens",
    host_read="how many tokens to pick is a Python int from the valid-token count, and the candidates are the "
              "eligible tokens' indices (a data-dependent shape)")
def clip_cov(log_probs, old_log_probs, advantages, response_mask, knobs=DEFAULT_KNOBS, *,
             rollout_is_weights=None, num_tokens=None, num_seqs=None, norm_length=None, generator=None):
    """Clip-Cov (Cui et al.): PPO clip, plus the loss of a few high-covariance tokens is removed.

    Among valid tokens not already clipped whose covariance (A - mean A)(logp - mean logp) lies strictly in
    (clip_cov_lb, clip_cov_ub), max(1, int(clip_cov_ratio * valid tokens)) are chosen at random (``generator``)
    and their per-token loss is set to 0, which removes their gradient and so slows entropy collapse.
    """
    valid, log_probs, advantages, log_ratio = _prepare(log_probs, old_log_probs, advantages, response_mask)
    surrogate, is_clipped = _clipped_surrogate(_ratio(log_ratio), advantages, knobs.clip_ratio_low,
                                               knobs.clip_ratio_high)
    covariance = _covariance(advantages, log_probs, valid)
    eligible = valid & ~is_clipped & (covariance > knobs.clip_cov_lb) & (covariance < knobs.clip_cov_ub)
    candidates = torch.nonzero(eligible.flatten()).squeeze(1)  # flat indices, row-major
    num_selected = max(int(knobs.clip_cov_ratio * int(valid.sum())), 1)
    device = "cpu" if generator is None else generator.device
    order = torch.randperm(candidates.numel(), generator=generator, device=device)
    selected = torch.zeros(valid.numel(), dtype=torch.bool, device=valid.device)
    selected[candidates[order[:num_selected].to(candidates.device)]] = True
    selected = selected.view_as(valid)
    per_token_loss = torch.where(selected, 0.0, surrogate)
    metrics = _base_metrics(valid, log_ratio, is_clipped & valid)
    metrics["pg_covfrac"] = masked_mean(selected.float(), valid)
    return _finish(per_token_loss, valid, rollout_is_weights, knobs.loss_agg_mode, num_tokens, num_seqs, norm_length,
                   metrics)


@POLICY_LOSSES.register(
    "kl_cov", summary="KL-Cov: -A rho plus a |log-ratio| penalty on the highest-covariance tokens",
    host_read="how many tokens to pick (topk's k) is a Python int from the valid-token count")
def kl_cov(log_probs, old_log_probs, advantages, response_mask, knobs=DEFAULT_KNOBS, *,
           rollout_is_weights=None, num_tokens=None, num_seqs=None, norm_length=None, generator=None):
    """KL-Cov (Cui et al.): L = -A rho (no clip), plus ppo_kl_coef |logp - old_logp| on the tokens with the
    largest covariance (A - mean A)(logp - mean logp): max(1, int(kl_cov_ratio * valid tokens)) of them.
    """
    valid, log_probs, advantages, log_ratio = _prepare(log_probs, old_log_probs, advantages, response_mask)
    per_token_loss = -advantages * _ratio(log_ratio)
    covariance = _covariance(advantages, log_probs, valid).flatten()
    num_valid = int(valid.sum())
    num_selected = min(max(int(knobs.kl_cov_ratio * num_valid), 1), num_valid)
    selected = torch.zeros(valid.numel(), dtype=torch.bool, device=valid.device)
    selected[torch.topk(covariance, num_selected).indices] = True
    selected = selected.view_as(valid)
    per_token_loss = per_token_loss + torch.where(selected, knobs.ppo_kl_coef * log_ratio.abs(), 0.0)
    metrics = _base_metrics(valid, log_ratio)
    metrics["pg_covfrac"] = masked_mean(selected.float(), valid)
    return _finish(per_token_loss, valid, rollout_is_weights, knobs.loss_agg_mode, num_tokens, num_seqs, norm_length,
                   metrics)


@POLICY_LOSSES.register("reinforce", summary="importance-weighted policy gradient without clip, for bypass mode")
def reinforce(log_probs, old_log_probs, advantages, response_mask, knobs=DEFAULT_KNOBS, *,
              rollout_is_weights=None, num_tokens=None, num_seqs=None, norm_length=None, generator=None):
    """Importance-weighted policy gradient without clip, for bypass mode: L = -w A logp.

    w = ``rollout_is_weights`` (detached; 1 when None), typically computed per micro-batch by
    ``rollout_correction.compute_bypass_correction``. ``ppo_kl`` measures old (= rollout) vs current.
    """
    valid, log_probs, advantages, log_ratio = _prepare(log_probs, old_log_probs, advantages, response_mask)
    per_token_loss = -advantages * log_probs
    metrics = _base_metrics(valid, log_ratio)
    return _finish(per_token_loss, valid, rollout_is_weights, knobs.loss_agg_mode, num_tokens, num_seqs, norm_length,
                   metrics)



@POLICY_LOSSES.register("gpg", summary="GPG: -A logp, no ratio and no clip (paired with the gpg estimator)")
def gpg(log_probs, old_log_probs, advantages, response_mask, knobs=DEFAULT_KNOBS, *,
        rollout_is_weights=None, num_tokens=None, num_seqs=None, norm_length=None, generator=None):
    """GPG (Chu et al., arXiv 2504.02546): the plain policy gradient L = -A logp, with neither ratio nor clip.

    The same per-token loss as ``reinforce``; a name of its own so that a GPG recipe from the reference system
    (``adv_estimator=gpg`` with ``loss_mode=gpg``) reads the same here. Its stability comes from the gpg
    estimator's scaling, not from a trust region, so it is meant for (nearly) on-policy data: ``ppo_kl`` shows
    how far the batch has drifted from the anchor.
    """
    valid, log_probs, advantages, log_ratio = _prepare(log_probs, old_log_probs, advantages, response_mask)
    per_token_loss = -advantages * log_probs
    metrics = _base_metrics(valid, log_ratio)
    return _finish(per_token_loss, valid, rollout_is_weights, knobs.loss_agg_mode, num_tokens, num_seqs, norm_length,
                   metrics)


@POLICY_LOSSES.register(
    "sapo", summary="SAPO: -A sigmoid(tau (rho - 1)) 4 / tau, a soft gate in place of the clip (tau_pos, tau_neg)")
def sapo(log_probs, old_log_probs, advantages, response_mask, knobs=DEFAULT_KNOBS, *,
         rollout_is_weights=None, num_tokens=None, num_seqs=None, norm_length=None, generator=None):
    """SAPO (Gao et al., arXiv 2511.20347): L = -A f(rho) with the soft gate f(x) = sigmoid(tau (x - 1)) 4 / tau,
    tau = ``tau_pos`` where A > 0 and ``tau_neg`` where A <= 0.

    At rho = 1 the gate has value 2 / tau and slope 1, so near the anchor the gradient is PPO's; away from it the
    slope 4 s (1 - s), s the sigmoid, decays smoothly instead of dropping to 0 at a clip edge, the faster the larger
    tau. tau_neg > tau_pos damps negative-advantage tokens sooner, which the paper finds stabilises training.
    The paper aggregates with seq-mean-token-mean (the reference system forces it; here ``loss_agg_mode`` runs).
    No clip, so ``pg_clipfrac`` is 0.
    """
    if knobs.tau_pos <= 0 or knobs.tau_neg <= 0:
        raise ValueError(f"sapo's temperatures must be positive, got tau_pos={knobs.tau_pos} and "
                         f"tau_neg={knobs.tau_neg}")
    valid, log_probs, advantages, log_ratio = _prepare(log_probs, old_log_probs, advantages, response_mask)
    taus = torch.where(advantages > 0, knobs.tau_pos, knobs.tau_neg).to(log_ratio.dtype)  # (B, T)
    gates = torch.sigmoid(taus * (_ratio(log_ratio) - 1.0)) * (4.0 / taus)
    per_token_loss = -advantages * gates
    metrics = _base_metrics(valid, log_ratio)
    return _finish(per_token_loss, valid, rollout_is_weights, knobs.loss_agg_mode, num_tokens, num_seqs, norm_length,
                   metrics)


@POLICY_LOSSES.register(
    "geo_mean", summary="GMPO: -A times the sequence's geometric-mean ratio, each token's log-ratio clipped to "
                        "[-clip_ratio_low, clip_ratio_high] on the side its advantage pushes")
def geo_mean(log_probs, old_log_probs, advantages, response_mask, knobs=DEFAULT_KNOBS, *,
             rollout_is_weights=None, num_tokens=None, num_seqs=None, norm_length=None, generator=None):
    """GMPO (Zhao et al., arXiv 2507.20673): the sequence ratio is the geometric mean of its token ratios,
    s_i = exp(mean_t c_it), and the per-token loss is -A_it s_i.

    Each log-ratio l_t is clipped in log space, on the side where its advantage would push it: c_t = min(l_t,
    clip_ratio_high) where A > 0, max(l_t, -clip_ratio_low) where A < 0, 0 where A = 0 (that is,
    sign(A) min(sign(A) l, sign(A) clamp(l, -low, high)), the reference system's form). The bounds are log-ratios:
    the paper's range (e^-0.4, e^0.4) is clip_ratio_low = clip_ratio_high = 0.4. A clipped token gets no gradient;
    the others get d s_i / d logp_it = s_i / n_i. A geometric mean is far less sensitive to one outlier token
    than GRPO's arithmetic mean of token ratios.

    With sequence-level advantages and seq-mean-token-mean this is the paper's mean over sequences of -A_i s_i
    (the reference system always takes that mean; here ``loss_agg_mode`` runs). ``rollout_is_weights`` enter as
    each sequence's geometric mean over its valid tokens, as the reference system does: the same as the weights
    themselves for sequence- or geometric-level weights. ``pg_clipfrac``: fraction of valid tokens clipped.
    """
    valid, log_probs, advantages, log_ratio = _prepare(log_probs, old_log_probs, advantages, response_mask)
    sign = torch.sign(advantages)  # (B, T), 0 on padding
    clamped = log_ratio.clamp(-knobs.clip_ratio_low, knobs.clip_ratio_high)
    clipped_log_ratio = sign * torch.minimum(sign * log_ratio, sign * clamped)
    sequence_ratio = _ratio(masked_mean(clipped_log_ratio, valid, dim=-1))  # (B,)
    per_token_loss = -advantages * sequence_ratio[:, None]
    if rollout_is_weights is not None:
        # Padding holds anything (even 0 or inf): 1 there, a log of 0 never reaches the mean.
        weights = torch.where(valid, rollout_is_weights.detach(), 1.0).clamp_min(1e-30)
        per_token_loss = per_token_loss * torch.exp(masked_mean(torch.log(weights), valid, dim=-1))[:, None]
    metrics = _base_metrics(valid, log_ratio, valid & (sign * log_ratio > sign * clamped))
    return _finish(per_token_loss, valid, None, knobs.loss_agg_mode, num_tokens, num_seqs, norm_length, metrics)
