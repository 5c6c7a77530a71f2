"""Accumulate update metrics over micro-batches and ranks into exact global values.

Three kinds: additive quantities (a loss computed with the global normaliser: micro-batch parts sum to
the mini-batch value), token means (a fraction over a micro-batch's valid tokens, weighted by its
token count) and extremes (a largest or smallest value, kept over micro-batches and ranks). `finish`
reduces over ranks once per update call.

Values may be device tensors: they are summed on the device and copied to the host once, in `finish`, so
that recording a micro-batch's loss does not make the host wait for that micro-batch's forward before it
can queue the backward (a GPU sync per metric per micro-batch).
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch
import torch.distributed as dist
from torch import Tensor

Number = float | Tensor  # a Python float or a 0-dim tensor on any device


class MetricSums:
    def __init__(self) -> None:
        self.additive: dict[str, Number] = defaultdict(float)
        self.weighted: dict[str, Number] = defaultdict(float)
        self.weights: dict[str, Number] = defaultdict(float)
        self.per_step: dict[str, list[float]] = defaultdict(list)
        self.maxima: dict[str, Number] = {}
        self.minima: dict[str, Number] = {}

    def add(self, name: str, value: Number) -> None:
        self.additive[name] = self.additive[name] + _detached(value)

    def add_token_mean(self, name: str, value: Number, num_tokens: Number) -> None:
        self.weighted[name] = self.weighted[name] + _detached(value) * _detached(num_tokens)
        self.weights[name] = self.weights[name] + _detached(num_tokens)

    def add_extreme(self, name: str, value: Number, largest: bool) -> None:
        """A largest (or smallest) value: the extreme over every call, never averaged."""
        kept, pick = (self.maxima, torch.maximum) if largest else (self.minima, torch.minimum)
        value = torch.as_tensor(_detached(value), dtype=torch.float64)
        kept[name] = value if name not in kept else pick(kept[name], value.to(kept[name].device))

    def add_step_value(self, name: str, value: float) -> None:
        """A value that is the same on every rank (grad norm, lr): averaged over optimizer steps."""
        self.per_step[name].append(value)

    def finish(self, num_steps: int) -> dict[str, float]:
        """Global metrics: additive sums divided by `num_steps`, token means over all ranks' tokens."""
        local = (_to_floats(self.additive), _to_floats(self.weighted), _to_floats(self.weights),
                 _to_floats(self.maxima), _to_floats(self.minima))
        parts = [local]
        if dist.is_initialized() and dist.get_world_size() > 1:
            parts = [None] * dist.get_world_size()
            dist.all_gather_object(parts, local)
        metrics: dict[str, float] = {}
        for name in sorted({name for additive, *_ in parts for name in additive}):
            metrics[name] = sum(additive.get(name, 0.0) for additive, *_ in parts) / max(1, num_steps)
        for name in sorted({name for _, weighted, *_ in parts for name in weighted}):
            total = sum(weights.get(name, 0.0) for _, _, weights, *_ in parts)
            metrics[name] = sum(weighted.get(name, 0.0) for _, weighted, *_ in parts) / max(total, 1e-12)
        # A rank (or micro-batch) with nothing to measure holds -inf / +inf, which the others' values replace.
        for index, pick in ((3, max), (4, min)):
            for name in sorted({name for part in parts for name in part[index]}):
                value = pick(part[index][name] for part in parts if name in part[index])
                metrics[name] = value if math.isfinite(value) else 0.0  # nothing measured anywhere
        for name, values in self.per_step.items():
            metrics[name] = sum(values) / len(values)
        return metrics


def _detached(value: Number) -> Number:
    return value.detach().to(torch.float64) if isinstance(value, Tensor) else float(value)


def _to_floats(values: dict[str, Number]) -> dict[str, float]:
    """Plain floats, with one device-to-host copy for all tensor values (one sync, not one per metric)."""
    names = [name for name, value in values.items() if isinstance(value, Tensor)]
    floats = {name: float(value) for name, value in values.items() if not isinstance(value, Tensor)}
    if names:
        stacked = torch.stack([values[name].to(torch.float64).reshape(()) for name in names]).cpu().tolist()
        floats.update(zip(names, stacked))
    return floats
