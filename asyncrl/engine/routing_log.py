"""The experts a mixture-of-experts model used for each position of one sequence, as the engine computed them.

    log = RoutingLog(request.routed_experts)        # a resumed request keeps its record
    log.record(start, ids)                          # ids (n, L, k) of positions start .. start + n - 1
    log.as_array(num_tokens)                        # (num_tokens, L, k), later positions marked not recorded

Append-only: a position keeps the experts of the first forward that computed it. A sequence recomputed after a
preemption, or resumed after a weight sync (partial rollout), recomputes its earlier positions, possibly with other
weights; the experts that shaped the tokens sampled back then are the record, so that replay reproduces them.
Ids are `asyncrl.models.routing.routing_dtype` (uint8 up to 254 experts); that dtype's largest value marks a
position without a record (the last token, which no forward has read yet).
"""

from __future__ import annotations

import numpy as np


class RoutingLog:
    def __init__(self, initial: np.ndarray | None = None) -> None:
        self.chunks: list[np.ndarray] = []
        self.num_positions = 0
        if initial is not None and initial.size:
            mark = np.iinfo(initial.dtype).max
            recorded = (initial < mark).all(axis=(1, 2))  # (n,)
            num_recorded = int(recorded.size if recorded.all() else np.argmin(recorded))
            if num_recorded:
                self.chunks.append(initial[:num_recorded])
                self.num_positions = num_recorded

    def record(self, start: int, ids: np.ndarray) -> None:
        """Experts (n, L, k) of positions [start, start + n); only positions not recorded yet are kept."""
        if start > self.num_positions:
            raise ValueError(f"routing of position {start} recorded before position {self.num_positions}")
        new = ids[self.num_positions - start:]
        if new.shape[0]:
            self.chunks.append(new)
            self.num_positions += new.shape[0]

    def as_array(self, num_tokens: int) -> np.ndarray | None:
        """(num_tokens, L, k): the record, then the not-recorded mark; None when nothing was ever recorded."""
        if not self.chunks:
            return None
        recorded = np.concatenate(self.chunks) if len(self.chunks) > 1 else self.chunks[0]
        self.chunks = [recorded]
        mark = np.iinfo(recorded.dtype).max
        padding = np.full((max(num_tokens - recorded.shape[0], 0), *recorded.shape[1:]), mark, dtype=recorded.dtype)
        return np.concatenate([recorded[:num_tokens], padding])
