"""The reward that trains, computed the same way in every mode (the core's `compute_reward`, the fully-async
rollouter): the reward function's score, the greedy baseline's score when the estimator needs one, then reward
shaping (DAPO's overlong penalty, `reward.overlong_buffer`). Validation scores are the reward function's alone.

    samples, metrics = score_for_training(samples, executor, tokenizer, config)
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

import torch

from asyncrl.algos import overlong_penalty
from asyncrl.config import AsyncRLConfig
from asyncrl.core.greedy_baseline import baseline_samples, with_baseline_scores
from asyncrl.core.records import Sample
from asyncrl.core.scoring import score_samples
from asyncrl.rewards import RewardExecutor, Scorer


def score_for_training(samples: Sequence[Sample], executor: Scorer | RewardExecutor, tokenizer: Any,
                       config: AsyncRLConfig) -> tuple[list[Sample], dict[str, float]]:
    """Scored and shaped samples (greedy baselines in `baseline_score`), and the scoring and shaping metrics."""
    baselines = baseline_samples(samples)
    # One scoring call for the samples and their baselines; the extras' means are the trained samples' only.
    scored, metrics = score_samples([*samples, *baselines], executor, tokenizer)
    scored = shape_rewards(scored, config)
    trained, baselines = scored[:len(samples)], scored[len(samples):]
    metrics = {name: value for name, value in metrics.items() if not is_extra_mean(name)}
    metrics |= extra_means(trained) | shaping_metrics(trained, config)
    return with_baseline_scores(trained, baselines), metrics


def shape_rewards(samples: Sequence[Sample], config: AsyncRLConfig) -> list[Sample]:
    """Samples with their overlong penalty (unchanged when reward.overlong_buffer is off)."""
    overlong = config.reward.overlong_buffer
    if not overlong.enable or not samples:
        return list(samples)
    lengths = torch.tensor([sample.num_response_tokens for sample in samples])
    penalties = overlong_penalty(lengths, max_response_length=config.data.max_response_length,
                                 buffer_length=overlong.len, penalty_factor=overlong.penalty_factor)
    return [replace(sample, overlong_penalty=float(penalty)) for sample, penalty in zip(samples, penalties)]


def shaping_metrics(samples: Sequence[Sample], config: AsyncRLConfig) -> dict[str, float]:
    """reward/overlong_penalty/mean and reward/overlong_fraction (samples with a penalty), over trained samples."""
    if not config.reward.overlong_buffer.enable or not samples:
        return {}
    penalties = [sample.overlong_penalty for sample in samples]
    return {"reward/overlong_penalty/mean": sum(penalties) / len(penalties),
            "reward/overlong_fraction": sum(penalty < 0 for penalty in penalties) / len(penalties)}


def is_extra_mean(name: str) -> bool:
    return name.startswith("reward/") and name.endswith("/mean")


def extra_means(samples: Sequence[Sample]) -> dict[str, float]:
    """`reward/<name>/mean` of every extra value a dict-returning reward function reported."""
    metrics = {}
    for name in sorted({name for sample in samples for name in sample.reward_extra}):
        values = [sample.reward_extra[name] for sample in samples if name in sample.reward_extra]
        metrics[f"reward/{name}/mean"] = sum(values) / len(values)
    return metrics
