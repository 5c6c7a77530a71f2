"""Simulated tool latency for benchmarks: a delay drawn per call, before the tool runs.

    "0.5" (fixed seconds), "0.1:2.0" (uniform), "lognormal:0.5:10[:1.0]" (median 0.5 s, capped at 10 s, sigma
    1.0: the long tail of real tools, where asynchronous rollout should pay off most)

The draw depends only on (trajectory id, call index), so a resumed or repeated run waits the same.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LatencyDistribution:
    kind: str          # fixed | uniform | lognormal
    low: float         # fixed: the delay; uniform: the lower end; lognormal: the median
    high: float        # uniform: the upper end; lognormal: the cap
    sigma: float = 1.0

    @classmethod
    def parse(cls, text: str) -> LatencyDistribution:
        parts = str(text).split(":")
        try:
            if parts[0] == "lognormal" and len(parts) in (3, 4):
                distribution = cls("lognormal", float(parts[1]), float(parts[2]),
                                   float(parts[3]) if len(parts) == 4 else 1.0)
            elif len(parts) == 1:
                distribution = cls("fixed", float(parts[0]), float(parts[0]))
            elif len(parts) == 2:
                distribution = cls("uniform", float(parts[0]), float(parts[1]))
            else:
                raise ValueError
        except ValueError:
            raise ValueError(f"latency must be 'SECONDS', 'LOW:HIGH' or 'lognormal:MEDIAN:CAP[:SIGMA]', "
                             f"got {text!r}") from None
        if distribution.low < 0 or distribution.high < distribution.low or distribution.sigma <= 0:
            raise ValueError(f"latency {text!r}: seconds must be >= 0, the upper end >= the lower, sigma > 0")
        return distribution

    def delay_s(self, trajectory_id: str, call_index: int) -> float:
        digest = hashlib.blake2b(f"{trajectory_id}|{call_index}".encode(), digest_size=8).digest()
        generator = np.random.default_rng(int.from_bytes(digest, "little"))
        if self.kind == "fixed":
            return self.low
        if self.kind == "uniform":
            return float(generator.uniform(self.low, self.high))
        return float(min(generator.lognormal(np.log(max(self.low, 1e-6)), self.sigma), self.high))
