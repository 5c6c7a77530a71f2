"""Version metrics: of trained samples (how many were stale, how many span several versions), and the
per-version records of `metrics_by_version.jsonl` (`VersionMetrics`).

A sample is stale when any of its tokens was sampled by a version older than the trainer's; a sample
spans several versions when partial rollout resumed it after a sync (`fully_async/partial/*`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

from asyncrl.core.records import Sample

# Cumulative values: a version's record keeps the last step's.
LAST_VALUE = frozenset({"param_version", "training/epoch"})


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


class VersionMetrics:
    """Per-parameter-version records beside the per-step ones: the K local steps of a sync cycle aggregated as the
    reference system aggregates them, one JSON line per version in `metrics_by_version.jsonl`.

    Rules, by metric name: the sum of `timing_s/*` and `perf/time_per_step`; the last value of the cumulative
    counts (`fully_async/count/*`, `training/epoch`, `param_version`); else max for a name ending in `max`, min
    for `min`, sum for `sum` / `total`, and the mean otherwise. Recomputed over the cycle: `perf/throughput`
    (tokens / seconds), `perf/samples_per_s` and `trainer/idle_ratio` (time waiting for samples / step time).

    A record holds `param_version` (the version the cycle's steps trained with, which the rollouter served; the
    reference system logs the same record at step = this + 1, the version the cycle's updates became),
    `synced_version`, `first_step`, `last_step`, `num_steps`, then the metrics of the sync that closed it (the
    rollouter's for the version: idle ratio, admitted prompts, its cumulative counts, and dynamic sampling's
    `filter/*` over the groups it scored). What the rollouter scored after the last sync with no step left to
    train (groups filtered at the end of the data) is added to the last record, so the records' `filter/*` add
    up to the run's counts.

    Step dicts are kept by reference and read when the version closes, so what the training loop adds to a
    step's metrics after the recipe's step (timings, throughput) is included.
    """

    def __init__(self, path: Path):
        self.path = path
        self.steps: list[tuple[int, dict[str, float]]] = []
        self.records: list[dict[str, float]] = []

    def add(self, step: int, metrics: dict[str, float]) -> None:
        self.steps.append((step, metrics))

    def close(self, version: int, sync_metrics: dict[str, float]) -> Optional[dict[str, float]]:
        """Record the steps since the last close, `version` being the version after the sync that ends them, and
        rewrite the file. Without steps, `sync_metrics` complete the last record (none yet: nothing is written)."""
        if self.steps:
            trained_with = int(self.steps[-1][1]["param_version"])
            self.records.append({"param_version": trained_with, "synced_version": version,
                                 "first_step": self.steps[0][0], "last_step": self.steps[-1][0],
                                 "num_steps": len(self.steps), **aggregate([metrics for _, metrics in self.steps]),
                                 **sync_metrics})
        elif self.records:
            self.records[-1] = merge_trailing(self.records[-1], sync_metrics)
        else:
            return None
        self.steps = []
        self.path.write_text("".join(json.dumps(record, sort_keys=True) + "\n" for record in self.records))
        return self.records[-1]


def merge_trailing(record: dict[str, float], sync_metrics: dict[str, float]) -> dict[str, float]:
    """`record` with the metrics of a sync that closed no step: dynamic sampling's group counts add up, the kept
    ratio is recomputed, every other value is the later one."""
    merged = {**record, **sync_metrics}
    for name in ("filter/num_generated_groups", "filter/num_filtered_groups"):
        merged[name] = record.get(name, 0.0) + sync_metrics.get(name, 0.0)
    if "filter/kept_ratio" in merged:
        generated = merged["filter/num_generated_groups"]
        merged["filter/kept_ratio"] = (generated - merged["filter/num_filtered_groups"]) / max(generated, 1.0)
    return merged


def aggregate(steps: Sequence[dict[str, float]]) -> dict[str, float]:
    """The reference system's per-version aggregation of step metrics (see `VersionMetrics`)."""
    names = sorted({name for metrics in steps for name in metrics})
    record = {}
    for name in names:
        values = [metrics[name] for metrics in steps if name in metrics]
        if name.startswith("timing_s/") or name == "perf/time_per_step":
            record[name] = sum(values)
        elif name.startswith("fully_async/count/") or name in LAST_VALUE:
            record[name] = values[-1]
        elif name.endswith("max"):
            record[name] = max(values)
        elif name.endswith("min"):
            record[name] = min(values)
        elif name.endswith(("sum", "total")):
            record[name] = sum(values)
        else:
            record[name] = sum(values) / len(values)
    seconds = sum(metrics.get("perf/time_per_step", 0.0) for metrics in steps)
    if seconds > 0:
        tokens = sum(metrics.get("perf/throughput", 0.0) * metrics.get("perf/time_per_step", 0.0) for metrics in steps)
        samples = sum(metrics.get("perf/samples_per_s", 0.0) * metrics.get("perf/time_per_step", 0.0)
                      for metrics in steps)
        record["perf/throughput"] = tokens / seconds
        record["perf/samples_per_s"] = samples / seconds
        record["trainer/idle_ratio"] = sum(metrics.get("timing_s/gen", 0.0) for metrics in steps) / seconds
    return record
