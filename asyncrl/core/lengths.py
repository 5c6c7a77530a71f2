"""Response-length distributions of benchmark workloads, as per-request token budgets.

    "256" (fixed), "64:512" (uniform), "lognormal:256:4096[:1.0]" (median 256, capped at 4096, sigma 1.0:
    the long tail of reasoning-model response lengths)

With `rollout.ignore_eos=true` a request then generates exactly its budget, so a random-weight model
produces realistic length tails (`rollout.length_distribution` in the config).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LengthDistribution:
    """Per-request lengths: "fixed" (= low), "uniform" in [low, high], or "lognormal" with median low,
    shape sigma, capped at high."""

    kind: str
    low: int
    high: int
    sigma: float = 1.0

    @classmethod
    def parse(cls, text: str | int) -> LengthDistribution:
        parts = str(text).split(":")
        if parts[0] == "lognormal" and len(parts) in (3, 4):
            return cls("lognormal", int(parts[1]), int(parts[2]), float(parts[3]) if len(parts) == 4 else 1.0)
        if len(parts) == 1 and parts[0].isdigit():
            return cls("fixed", int(parts[0]), int(parts[0]))
        if len(parts) == 2 and all(part.isdigit() for part in parts):
            return cls("uniform", int(parts[0]), int(parts[1]))
        raise ValueError(f"lengths must be 'N', 'LOW:HIGH' or 'lognormal:MEDIAN:CAP[:SIGMA]', got {text!r}")

    def sample(self, count: int, generator: np.random.Generator) -> np.ndarray:
        if self.kind == "fixed":
            lengths = np.full(count, self.low)
        elif self.kind == "uniform":
            lengths = generator.integers(self.low, self.high + 1, size=count)
        else:
            lengths = np.minimum(np.round(generator.lognormal(np.log(self.low), self.sigma, size=count)), self.high)
        return np.maximum(lengths, 1).astype(np.int64)

    def for_seed(self, seed: int) -> int:
        """One length drawn from `seed` alone (a request's budget does not depend on its batch)."""
        return int(self.sample(1, np.random.default_rng(seed))[0])
