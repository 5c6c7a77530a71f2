"""Telemetry: metric trackers, stage timing, a Chrome-trace timeline, plots and a progress display.

Light on purpose: importing it loads neither torch nor matplotlib (tensorboard's writer and the plots
import them when used), so rollout workers, data processes and the CLI can use it freely.

    tracker = Tracker(output_dir, ["console", "jsonl"], project="asyncrl", experiment="run", config={})
    timeline = Timeline()
    metrics = {}
    with timed(metrics, "generate", timeline=timeline):
        ...
    tracker.log(metrics, step=1)
    timeline.save(output_dir / "timeline.json")
    plot_run(output_dir)
"""

from asyncrl.telemetry.plots import plot_bars, plot_run, plot_timeline
from asyncrl.telemetry.progress import Progress
from asyncrl.telemetry.timeline import (
    CounterSample,
    Span,
    Timeline,
    Trace,
    busy_seconds,
    merge_intervals,
    overlap_seconds,
    read_trace,
)
from asyncrl.telemetry.timing import Stopwatch, timed
from asyncrl.telemetry.trackers import BACKENDS, METRICS_FILE_NAME, Tracker, read_metrics

__all__ = [
    "BACKENDS",
    "METRICS_FILE_NAME",
    "CounterSample",
    "Progress",
    "Span",
    "Stopwatch",
    "Timeline",
    "Trace",
    "Tracker",
    "busy_seconds",
    "merge_intervals",
    "overlap_seconds",
    "plot_bars",
    "plot_run",
    "plot_timeline",
    "read_metrics",
    "read_trace",
    "timed",
]
