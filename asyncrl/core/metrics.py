"""Data metrics of a training batch, with verl's names.

critic/score, critic/reward_baseline (remax's greedy responses), critic/rewards, critic/advantages, critic/returns, critic/values (mean/max/min),
response_length (mean/max/min/clip_ratio), prompt_length, staleness (mean/max over trained tokens:
the trainer's version minus the version that sampled the token).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from asyncrl.algos import masked_mean
from asyncrl.engine import GenerationResult
from asyncrl.train.batch import TrainBatch


def summary(prefix: str, values: Tensor) -> dict[str, float]:
    if values.numel() == 0:
        return {}
    values = values.double()
    return {f"{prefix}/mean": float(values.mean()), f"{prefix}/max": float(values.max()),
            f"{prefix}/min": float(values.min())}


def masked_summary(prefix: str, values: Tensor, mask: Tensor) -> dict[str, float]:
    valid = mask > 0
    if not bool(valid.any()):
        return {}
    return {f"{prefix}/mean": float(masked_mean(values.double(), valid)), f"{prefix}/max": float(values[valid].max()),
            f"{prefix}/min": float(values[valid].min())}


def sample_metrics(batch: TrainBatch, finish_reasons: Sequence[str], current_version: int) -> dict[str, float]:
    """Scores, lengths and staleness of freshly generated samples."""
    metrics: dict[str, float] = {}
    if batch.token_level_scores is not None:
        metrics |= summary("critic/score", batch.token_level_scores.sum(-1))
    if batch.reward_baselines is not None:
        metrics |= summary("critic/reward_baseline", batch.reward_baselines)  # the greedy responses' (remax)
    metrics |= summary("response_length", batch.response_lengths.float())
    metrics["response_length/clip_ratio"] = sum(reason == "length" for reason in finish_reasons) / len(finish_reasons)
    metrics |= summary("prompt_length", batch.prompt_lengths.float())
    metrics |= staleness_metrics(batch.versions, batch.response_lengths, current_version)
    return metrics


def prefill_metrics(results: Sequence[GenerationResult]) -> dict[str, float]:
    """How much prefill the engines' prefix caches saved on these samples (every turn of a multi-turn one):
    `rollout/prefix_hit_rate` is the share of prefill tokens found cached, `rollout/prefill_tokens_computed` and
    `rollout/prefill_tokens_requested` the sums; `rollout/preempted_fraction` the samples preempted at least once
    (a KV cache too small for the batch: rollout/kv_budget.py). Empty where the backend does not count them."""
    requested = sum(result.num_prefill_tokens for result in results)
    if requested == 0:
        return {}
    cached = sum(result.num_cached_tokens for result in results)
    return {"rollout/prefix_hit_rate": cached / requested, "rollout/prefill_tokens_requested": float(requested),
            "rollout/prefill_tokens_computed": float(requested - cached),
            "rollout/preempted_fraction": sum(result.num_preemptions > 0 for result in results) / len(results)}


def advantage_metrics(batch: TrainBatch) -> dict[str, float]:
    metrics: dict[str, float] = {}
    if batch.token_level_rewards is not None:
        metrics |= summary("critic/rewards", batch.token_level_rewards.sum(-1))
    for name, tensor in (("advantages", batch.advantages), ("returns", batch.returns), ("values", batch.values)):
        if tensor is not None:
            metrics |= masked_summary(f"critic/{name}", tensor, batch.response_mask)
    return metrics


def staleness_metrics(versions: Optional[Tensor], response_lengths: Tensor, current_version: int) -> dict[str, float]:
    """Staleness over every generated token (not only unmasked ones: a rejected token was still stale)."""
    if versions is None:
        return {}
    valid = torch.arange(versions.shape[1])[None, :] < response_lengths[:, None]
    if not bool(valid.any()):
        return {}
    staleness = (current_version - versions)[valid].double()
    return {"staleness/mean": float(staleness.mean()), "staleness/max": float(staleness.max()),
            "staleness/min": float(staleness.min())}
