"""Validation and evaluation scores: the mean score, per data source, and pass@k when several samples per prompt.

pass@k is the chance that at least one of k samples drawn (without replacement) from a prompt's n samples solves
it (scores at least `solved_score`; 1.0: full credit), averaged over prompts: the unbiased estimator of Chen et
al. (2021), 1 - C(n - c, k) / C(n, k) with c solved samples. pass@n is the share of prompts any sample solved. With
greedy sampling (the default `rollout.val_kwargs`), n = 1 and pass@1 = accuracy. `trainer.test_freq`'s validation
and the evaluation stage (`core/evaluation.py`) report through this one function, under the same `val/` keys.
"""

from __future__ import annotations

from collections import defaultdict
from math import comb
from typing import Optional, Sequence

from asyncrl.core.records import Sample


def pass_at_k(num_samples: int, num_solved: int, k: int) -> float:
    """1 - C(n - c, k) / C(n, k): the chance that k of the n samples include a solved one (k <= n)."""
    if k > num_samples:
        raise ValueError(f"pass@{k} needs at least {k} samples per prompt, got {num_samples}")
    return 1.0 - comb(num_samples - num_solved, k) / comb(num_samples, k)


def validation_metrics(samples: Sequence[Sample], num_samples: int, solved_score: float = 1.0,
                       pass_k: Optional[Sequence[int]] = None) -> dict[str, float]:
    """val/score/mean, val/num_prompts, val/<data_source>/score/mean and, for each k of `pass_k` (default: [n] when
    n > 1), val/pass@k and val/<data_source>/pass@k."""
    scores_by_source: dict[str, list[float]] = defaultdict(list)
    solved_by_prompt: dict[str, list[bool]] = defaultdict(list)
    source_of_prompt: dict[str, str] = {}
    for sample in samples:
        source = sample.prompt.record.data_source
        scores_by_source[source].append(sample.score)
        solved_by_prompt[sample.prompt_id].append(sample.score >= solved_score)
        source_of_prompt[sample.prompt_id] = source
    scores = [sample.score for sample in samples]
    metrics = {"val/score/mean": sum(scores) / len(scores), "val/num_prompts": float(len(solved_by_prompt))}
    for source, source_scores in sorted(scores_by_source.items()):
        metrics[f"val/{source}/score/mean"] = sum(source_scores) / len(source_scores)
    for k in (pass_k if pass_k is not None else [num_samples] if num_samples > 1 else []):
        by_source: dict[str, list[float]] = defaultdict(list)
        for prompt_id, solved in solved_by_prompt.items():
            by_source[source_of_prompt[prompt_id]].append(pass_at_k(len(solved), sum(solved), k))
        values = [value for source_values in by_source.values() for value in source_values]
        metrics[f"val/pass@{k}"] = sum(values) / len(values)
        for source, source_values in sorted(by_source.items()):
            metrics[f"val/{source}/pass@{k}"] = sum(source_values) / len(source_values)
    return metrics
