"""Wall-time measurement of training stages.

    metrics = {}
    with timed(metrics, "generate"):
        batch = core.generate(prompts)
    # metrics == {"timing_s/generate": 1.23}

`timed` accumulates, so a stage entered twice in one step (e.g. two mini-batches) reports its total.
Pass a `Timeline` to also record the stage as a span on the trace row `row`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from asyncrl.telemetry.timeline import Timeline


@contextmanager
def timed(metrics: dict, name: str, timeline: Timeline | None = None, row: str = "driver") -> Iterator[None]:
    """Add the seconds spent inside the block to `metrics[f"timing_s/{name}"]`.

    The time is added even when the block raises, so a failing stage still shows what it cost.
    """
    key = f"timing_s/{name}"
    wall_start_s = time.time()
    start_s = time.perf_counter()
    try:
        yield
    finally:
        elapsed_s = time.perf_counter() - start_s
        metrics[key] = metrics.get(key, 0.0) + elapsed_s
        if timeline is not None:
            # The span is placed by wall clock (shared across processes) but sized by the monotonic
            # clock, so a wall-clock adjustment mid-stage cannot give it a negative length.
            timeline.add_span(row, name, wall_start_s, wall_start_s + elapsed_s)


class Stopwatch:
    """A monotonic stopwatch that starts when created.

        stopwatch = Stopwatch()
        ...
        stopwatch.elapsed_s()   # seconds since creation (or the last restart)
        stopwatch.lap_s()       # seconds since the previous lap (or the start)
    """

    def __init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        """Set both the start and the last lap to now."""
        self.start_s = time.perf_counter()
        self.last_lap_s = self.start_s

    def elapsed_s(self) -> float:
        """Seconds since the start."""
        return time.perf_counter() - self.start_s

    def lap_s(self) -> float:
        """Seconds since the previous call of `lap_s` (or the start), and begin a new lap."""
        now_s = time.perf_counter()
        lap_s = now_s - self.last_lap_s
        self.last_lap_s = now_s
        return lap_s
