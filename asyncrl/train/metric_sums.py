"""Accumulate update metrics over micro-batches and ranks into exact global values.

Two kinds: additive quantities (a loss computed with the global normaliser: micro-batch parts sum to
the mini-batch value) and token means (a fraction over a micro-batch's valid tokens, weighted by its
token count). `finish` reduces over ranks once per update call.
"""

from __future__ import annotations

from collections import defaultdict

import torch.distributed as dist


class MetricSums:
    def __init__(self) -> None:
        self.additive: dict[str, float] = defaultdict(float)
        self.weighted: dict[str, float] = defaultdict(float)
        self.weights: dict[str, float] = defaultdict(float)
        self.per_step: dict[str, list[float]] = defaultdict(list)

    def add(self, name: str, value: float) -> None:
        self.additive[name] += value

    def add_token_mean(self, name: str, value: float, num_tokens: float) -> None:
        self.weighted[name] += value * num_tokens
        self.weights[name] += num_tokens

    def add_step_value(self, name: str, value: float) -> None:
        """A value that is the same on every rank (grad norm, lr): averaged over optimizer steps."""
        self.per_step[name].append(value)

    def finish(self, num_steps: int) -> dict[str, float]:
        """Global metrics: additive sums divided by `num_steps`, token means over all ranks' tokens."""
        parts = [(dict(self.additive), dict(self.weighted), dict(self.weights))]
        if dist.is_initialized() and dist.get_world_size() > 1:
            parts = [None] * dist.get_world_size()
            dist.all_gather_object(parts, (dict(self.additive), dict(self.weighted), dict(self.weights)))
        metrics: dict[str, float] = {}
        for name in sorted({name for additive, _, _ in parts for name in additive}):
            metrics[name] = sum(additive.get(name, 0.0) for additive, _, _ in parts) / max(1, num_steps)
        for name in sorted({name for _, weighted, _ in parts for name in weighted}):
            total = sum(weights.get(name, 0.0) for _, _, weights in parts)
            metrics[name] = sum(weighted.get(name, 0.0) for _, weighted, _ in parts) / max(total, 1e-12)
        for name, values in self.per_step.items():
            metrics[name] = sum(values) / len(values)
        return metrics
