"""A timeline of who did what when, saved as a Chrome trace (open it in chrome://tracing or ui.perfetto.dev).

One row per worker or component ("driver", "trainer/rank0", "rollout/replica0"), spans on each row, and
counter tracks (e.g. queue size):

    timeline = Timeline()
    with timeline.span("driver", "update_actor", step=3):
        ...
    timeline.add_span("rollout/replica0", "generate", start_s, end_s)   # measured in another process
    timeline.add_counter("queue_size", 12)
    timeline.save(output_dir / "timeline.json")

Times are wall-clock seconds from `time.time()`, the one clock that processes on one host share; the saved
trace shows microseconds relative to the timeline's creation. Memory is bounded: past `max_events` the
oldest events are dropped and counted in `num_dropped_events` (and in the saved trace's `otherData`).

`busy_seconds` and `overlap_seconds` turn rows into numbers: how long rollout and training ran at once,
and, divided by the run's length, each component's idle ratio.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_MAX_EVENTS = 200_000
TRACE_PROCESS_ID = 1
MICROSECONDS_PER_SECOND = 1_000_000


@dataclass(frozen=True)
class Span:
    """One interval of work on a row; times are wall-clock seconds (`time.time()`)."""

    row: str
    name: str
    start_s: float
    end_s: float
    args: dict = field(default_factory=dict)


@dataclass(frozen=True)
class CounterSample:
    """One value of a counter track at a wall-clock time."""

    name: str
    value: float
    time_s: float


@dataclass
class Trace:
    """A saved trace read back: spans per row and samples per counter, times in seconds from the start."""

    spans_by_row: dict[str, list[Span]]
    counters: dict[str, list[CounterSample]]


class Timeline:
    """Thread-safe, bounded recorder of spans and counters; see the module docstring for use."""

    def __init__(self, max_events: int = DEFAULT_MAX_EVENTS) -> None:
        if max_events <= 0:
            raise ValueError(f"max_events must be positive, got {max_events}")
        self.start_s = time.time()
        self.max_events = max_events
        self.num_dropped_events = 0
        self._events: deque[Span | CounterSample] = deque()
        self._row_ids: dict[str, int] = {}
        self._lock = threading.Lock()

    @contextmanager
    def span(self, row: str, name: str, **args) -> Iterator[None]:
        """Record the block as a span `name` on `row`; `args` show up when the span is clicked."""
        start_s = time.time()
        try:
            yield
        finally:
            self.add_span(row, name, start_s, time.time(), **args)

    def add_span(self, row: str, name: str, start_s: float, end_s: float, **args) -> None:
        """Record a span measured elsewhere, from wall-clock `time.time()` values."""
        if end_s < start_s:
            raise ValueError(f"span {row}/{name} ends before it starts: start_s={start_s}, end_s={end_s}")
        with self._lock:
            self._row_ids.setdefault(row, len(self._row_ids))
            self._append(Span(row, name, float(start_s), float(end_s), dict(args)))

    def add_counter(self, name: str, value: float, time_s: float | None = None) -> None:
        """Record a sample of counter track `name` at wall-clock `time_s` (default: now)."""
        sample_time_s = time.time() if time_s is None else float(time_s)
        with self._lock:
            self._append(CounterSample(name, float(value), sample_time_s))

    def _append(self, event: Span | CounterSample) -> None:
        # Called with the lock held. A deque pops the oldest in O(1), so the cap costs nothing per event.
        if len(self._events) >= self.max_events:
            self._events.popleft()
            self.num_dropped_events += 1
        self._events.append(event)

    def rows(self) -> list[str]:
        """Row names in order of first use (rows stay known even after all their spans were dropped)."""
        with self._lock:
            return list(self._row_ids)

    def spans(self, row: str) -> list[Span]:
        """The recorded spans of `row`, oldest first."""
        with self._lock:
            return [event for event in self._events if isinstance(event, Span) and event.row == row]

    def intervals(self, row: str) -> list[tuple[float, float]]:
        """The (start_s, end_s) pairs of `row`'s spans, the input of `busy_seconds`/`overlap_seconds`."""
        return [(span.start_s, span.end_s) for span in self.spans(row)]

    def to_chrome_trace(self) -> dict:
        """The trace as a Chrome trace JSON object (what `save` writes)."""
        with self._lock:
            events = list(self._events)
            row_ids = dict(self._row_ids)
            num_dropped_events = self.num_dropped_events
        trace_events = [{"name": "process_name", "ph": "M", "pid": TRACE_PROCESS_ID, "args": {"name": "asyncrl"}}]
        for row, row_id in row_ids.items():
            trace_events.append(
                {"name": "thread_name", "ph": "M", "pid": TRACE_PROCESS_ID, "tid": row_id, "args": {"name": row}})
            # Without a sort index viewers order rows by id, which is first use; make it explicit.
            trace_events.append({"name": "thread_sort_index", "ph": "M", "pid": TRACE_PROCESS_ID, "tid": row_id,
                                 "args": {"sort_index": row_id}})
        trace_events.extend(self._to_chrome_event(event, row_ids) for event in events)
        return {"traceEvents": trace_events, "displayTimeUnit": "ms",
                "otherData": {"start_time_s": self.start_s, "num_dropped_events": num_dropped_events}}

    def _to_chrome_event(self, event: Span | CounterSample, row_ids: dict[str, int]) -> dict:
        if isinstance(event, CounterSample):
            return {"name": event.name, "ph": "C", "pid": TRACE_PROCESS_ID, "ts": self._microseconds(event.time_s),
                    "args": {event.name: event.value}}
        return {"name": event.name, "ph": "X", "pid": TRACE_PROCESS_ID, "tid": row_ids[event.row],
                "ts": self._microseconds(event.start_s),
                "dur": (event.end_s - event.start_s) * MICROSECONDS_PER_SECOND, "args": event.args}

    def _microseconds(self, time_s: float) -> float:
        return (time_s - self.start_s) * MICROSECONDS_PER_SECOND

    def save(self, path: str | Path) -> Path:
        """Write the Chrome trace JSON to `path`, atomically (a run killed mid-save keeps the previous file)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary_path = path.with_name(path.name + ".tmp")
        temporary_path.write_text(json.dumps(self.to_chrome_trace(), default=str))
        os.replace(temporary_path, path)
        return path


def read_trace(path: str | Path) -> Trace:
    """Read a Chrome trace saved by `Timeline.save`; times become seconds since the timeline's start."""
    trace = json.loads(Path(path).read_text())
    row_names = {event["tid"]: event["args"]["name"] for event in trace["traceEvents"]
                 if event["ph"] == "M" and event["name"] == "thread_name"}
    spans_by_row: dict[str, list[Span]] = {name: [] for name in row_names.values()}
    counters: dict[str, list[CounterSample]] = {}
    for event in trace["traceEvents"]:
        if event["ph"] == "X":
            row = row_names.get(event["tid"], f"tid{event['tid']}")
            start_s = event["ts"] / MICROSECONDS_PER_SECOND
            spans_by_row.setdefault(row, []).append(
                Span(row, event["name"], start_s, start_s + event["dur"] / MICROSECONDS_PER_SECOND,
                     event.get("args", {})))
        elif event["ph"] == "C":
            time_s = event["ts"] / MICROSECONDS_PER_SECOND
            for series, value in event["args"].items():
                name = event["name"] if series == event["name"] else f"{event['name']}/{series}"
                counters.setdefault(name, []).append(CounterSample(name, float(value), time_s))
    return Trace(spans_by_row, counters)


def merge_intervals(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, disjoint intervals covering the same time as `intervals` (overlapping ones are joined)."""
    merged: list[tuple[float, float]] = []
    for start_s, end_s in sorted(intervals):
        if merged and start_s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end_s))
        else:
            merged.append((start_s, end_s))
    return merged


def busy_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """Seconds covered by at least one interval; nested or overlapping spans of one row count once."""
    return sum(end_s - start_s for start_s, end_s in merge_intervals(intervals))


def overlap_seconds(intervals_a: Iterable[tuple[float, float]], intervals_b: Iterable[tuple[float, float]]) -> float:
    """Seconds during which both `a` and `b` were busy (e.g. rollout and training running at once)."""
    merged_a, merged_b = merge_intervals(intervals_a), merge_intervals(intervals_b)
    overlap_s, index_a, index_b = 0.0, 0, 0
    while index_a < len(merged_a) and index_b < len(merged_b):
        start_a, end_a = merged_a[index_a]
        start_b, end_b = merged_b[index_b]
        overlap_s += max(0.0, min(end_a, end_b) - max(start_a, start_b))
        # Advance whichever interval ends first: it cannot overlap anything later in the other list.
        if end_a <= end_b:
            index_a += 1
        else:
            index_b += 1
    return overlap_s
