"""Version metrics of trained samples: how many were stale, and how many span several versions.

A sample is stale when any of its tokens was sampled by a version older than the trainer's; a sample
spans several versions when partial rollout resumed it after a sync (`fully_async/partial/*`).
"""

from __future__ import annotations

from typing import Sequence

from asyncrl.core.records import Sample


def sample_version_metrics(samples: Sequence[Sample], trainer_version: int) -> tuple[dict[str, float], int]:
    spans, num_stale = [], 0
    for sample in samples:
        versions = sample.result.response_versions
        if versions.size == 0:
            continue
        spans.append(int(versions.max() - versions.min()))
        num_stale += int(versions.min() < trainer_version)
    num_partial = sum(span > 0 for span in spans)
    metrics = {"fully_async/partial/total_partial_num": float(num_partial),
               "fully_async/partial/partial_ratio": num_partial / max(len(spans), 1),
               "fully_async/partial/max_partial_span": float(max(spans, default=0)),
               "fully_async/count/current_param_version": float(trainer_version)}
    return metrics, num_stale
