"""Validation scores: the mean score, per data source, and pass@n when several samples per prompt.

pass@n counts a prompt as solved when any of its n samples scores at least `solved_score` (1.0: full
credit). With greedy sampling (the default `rollout.val_kwargs`), n = 1 and pass@1 = accuracy.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from asyncrl.core.records import Sample


def validation_metrics(samples: Sequence[Sample], num_samples: int, solved_score: float = 1.0) -> dict[str, float]:
    by_source: dict[str, list[float]] = defaultdict(list)
    best_by_prompt: dict[str, float] = {}
    for sample in samples:
        by_source[sample.prompt.record.data_source].append(sample.score)
        best_by_prompt[sample.prompt_id] = max(best_by_prompt.get(sample.prompt_id, float("-inf")), sample.score)
    scores = [sample.score for sample in samples]
    metrics = {"val/score/mean": sum(scores) / len(scores), "val/num_prompts": float(len(best_by_prompt))}
    for source, source_scores in sorted(by_source.items()):
        metrics[f"val/{source}/score/mean"] = sum(source_scores) / len(source_scores)
    if num_samples > 1:
        solved = sum(best >= solved_score for best in best_by_prompt.values())
        metrics[f"val/pass@{num_samples}"] = solved / len(best_by_prompt)
    return metrics
