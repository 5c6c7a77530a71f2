"""One micro-batch's actor loss from its log-probs: the policy loss, entropy bonus and KL loss, and its metrics.

    terms = policy_loss_terms(log_probs, entropy, micro, spec, num_tokens, num_seqs)
    terms.loss.backward(); terms.metrics.record(sums)

`micro` is anything with the response fields of `TrainBatch` (a `TrainBatch`, or the fixed-capacity
`PackedMicroBatch` of a captured step). `num_tokens` / `num_seqs` are the mini-batch's global counts (floats,
or device scalars in a captured step). Metrics stay device tensors: nothing here waits for the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol

import torch
from torch import Tensor

from asyncrl.algos import POLICY_LOSSES, aggregate_loss, compute_bypass_correction, kl_penalty
from asyncrl.train.metric_sums import MetricSums
from asyncrl.train.update_spec import PolicyUpdateSpec

# Token-mean metrics of the policy losses and rollout correction, reduced over tokens of all ranks.
LOSS_TOKEN_METRICS = ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "pg_covfrac")
# Rollout-correction metrics that are extremes: the largest / smallest over the update, not a mean.
# Keyed by the names `compute_bypass_correction` returns (prefixed).
EXTREME_METRICS = {"rollout_corr/is_max": True, "rollout_corr/is_min": False, "rollout_corr/abs_log_ratio_max": True}


class ResponseFields(Protocol):
    response_mask: Tensor                 # (B, R)
    old_log_probs: Optional[Tensor]
    advantages: Optional[Tensor]
    rollout_is_weights: Optional[Tensor]

    def need(self, field_name: str, stage: str) -> Tensor: ...


@dataclass
class LossMetrics:
    additive: dict[str, Tensor]          # sum over micro-batches to the mini-batch value
    token_means: dict[str, Tensor | float]   # means over this micro-batch's valid tokens (a float: constant)
    num_tokens: Tensor                   # this micro-batch's valid tokens: the weight of its token means

    def detached(self) -> "LossMetrics":
        """The values without their autograd history (which would keep a step's activations alive)."""
        return LossMetrics({name: value.detach() for name, value in self.additive.items()},
                           {name: value.detach() if isinstance(value, Tensor) else value
                            for name, value in self.token_means.items()}, self.num_tokens.detach())

    def record(self, sums: MetricSums) -> None:
        for name, value in self.additive.items():
            sums.add(name, value)
        for name, value in self.token_means.items():
            if name in EXTREME_METRICS:
                largest = EXTREME_METRICS[name]
                # A micro-batch without valid tokens reports 0 for both: it must not win either extreme.
                empty = -torch.inf if largest else torch.inf
                sums.add_extreme(name, torch.where(torch.as_tensor(self.num_tokens) > 0,
                                                   torch.as_tensor(value, dtype=torch.float64), empty), largest)
            else:
                sums.add_token_mean(name, value, self.num_tokens)


@dataclass
class LossTerms:
    loss: Tensor
    metrics: LossMetrics


def policy_loss_terms(log_probs: Tensor, entropy: Tensor, micro: ResponseFields, spec: PolicyUpdateSpec,
                      num_tokens: float | Tensor, num_seqs: float | Tensor) -> LossTerms:
    mask = micro.response_mask
    is_weights = micro.rollout_is_weights
    metrics = LossMetrics({}, {}, mask.sum())
    if spec.bypass_is_level or spec.bypass_rs_level:
        is_weights, mask, correction_metrics = compute_bypass_correction(
            log_probs, micro.need("rollout_log_probs", "bypass correction"), mask,
            is_level=spec.bypass_is_level, is_threshold=spec.bypass_is_threshold,
            rs_level=spec.bypass_rs_level, rs_threshold=spec.bypass_rs_threshold,
            rs_threshold_lower=spec.bypass_rs_threshold_lower)
        metrics.token_means.update(correction_metrics)
    counts = dict(num_tokens=num_tokens, num_seqs=num_seqs, norm_length=spec.norm_length)
    pg_loss, pg_metrics = POLICY_LOSSES[spec.loss_mode](
        log_probs, micro.need("old_log_probs", "update_actor"), micro.need("advantages", "update_actor"), mask,
        spec.policy_loss, rollout_is_weights=is_weights, **counts)
    metrics.additive["pg_loss"] = pg_loss
    metrics.token_means.update({name: pg_metrics[name] for name in LOSS_TOKEN_METRICS if name in pg_metrics})
    loss = pg_loss
    entropy_loss = aggregate_loss(entropy, mask, spec.policy_loss.loss_agg_mode, **counts)
    metrics.additive["entropy"] = entropy_loss
    if spec.entropy_coeff:
        loss = loss - spec.entropy_coeff * entropy_loss
    if spec.use_kl_loss:
        kl = kl_penalty(spec.kl_loss_type, log_probs, micro.need("ref_log_probs", "update_actor (KL loss)"))
        kl_loss = aggregate_loss(kl, mask, spec.policy_loss.loss_agg_mode, **counts)
        metrics.additive["kl_loss"] = kl_loss
        loss = loss + spec.kl_loss_coef * kl_loss
    return LossTerms(loss, metrics)
