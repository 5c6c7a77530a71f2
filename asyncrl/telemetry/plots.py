"""PNG plots of a run and of benchmark results.

    plot_run("outputs/run")          # reads outputs/run/metrics.jsonl, writes outputs/run/plots/*.png
    plot_timeline("outputs/run/timeline.json", "outputs/run/plots/timeline.png")
    plot_bars({"sync": 41.0, "fully_async": 97.5}, "Throughput", "samples/s", "outputs/speed.png")

`plot_run` writes each plot whose metrics exist in the run and skips the others:
`score_vs_step.png`, `score_vs_wall_time.png` (critic/score/mean), `validation_score.png` (val/score/mean
and every val/<data_source>/score/mean), `response_length.png` (response_length/mean, /max, /min) and
`time_breakdown.png` (the timing_s/<stage> metrics of the step's own path stacked per step, timing_s/step
drawn over them as a dashed line, and times measured inside or beside that path, such as the generation's
own `generate_async`, as dotted lines).

matplotlib is imported inside the functions, and only its object-oriented API with the Agg canvas is used:
importing this module stays cheap, and plotting never touches pyplot's global backend or a display.
"""

from __future__ import annotations

import re
from pathlib import Path

from asyncrl.telemetry.timeline import CounterSample, Span, read_trace
from asyncrl.telemetry.trackers import METRICS_FILE_NAME, read_metrics

PLOTS_DIR_NAME = "plots"
SCORE_KEY = "critic/score/mean"
VALIDATION_KEY = "val/score/mean"
VALIDATION_SOURCE_PATTERN = re.compile(r"^val/(.+)/score/mean$")
EVALUATION_VERSION_KEY = "val/param_version"   # the evaluation stage's rows: the policy version they measured
RESPONSE_LENGTH_KEYS = ("response_length/mean", "response_length/max", "response_length/min")
TIMING_PREFIX = "timing_s/"
STEP_TIME_KEY = "timing_s/step"
# Timings that are not a stage of the step's own path, so stacking them would count time twice: each is
# drawn as a dotted line under its label instead (None: not drawn, it repeats another key).
UNSTACKED_TIMINGS = {
    # The generation's own time: inside `gen` in sync mode, beside the training in the async modes.
    "timing_s/generate_async": "generation (inside gen, or overlapped)",
    # one_step_off's name for `gen`, the part of generation training did not hide: the same number.
    "timing_s/wait_prev_gen": None,
}
MAX_LEGEND_ENTRIES = 20


def new_figure(num_rows: int = 1, width_in: float = 8.0, height_in: float = 4.5):
    """A Figure drawn by the Agg canvas (no pyplot state) with `num_rows` stacked axes sharing x."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width_in, height_in), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.subplots(num_rows, 1, sharex=True, squeeze=False)[:, 0]
    return figure, list(axes)


def save_figure(figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path)
    return path


def series(records: list[dict], key: str, x_key: str = "step") -> tuple[list[float], list[float]]:
    """(x, y) of the records holding a non-null `key` (nulls are non-finite values, left out of lines)."""
    points = [(record[x_key], record[key]) for record in records
              if record.get(key) is not None and record.get(x_key) is not None]
    return [x for x, _ in points], [y for _, y in points]


def plot_lines(records: list[dict], keys_and_labels: list[tuple[str, str]], x_key: str, xlabel: str,
               ylabel: str, title: str, path: Path, marker: str | None = None) -> Path | None:
    """One line per (metric, label) against `x_key`; None (and no file) when no metric has a point."""
    lines = [(label, *series(records, key, x_key)) for key, label in keys_and_labels]
    lines = [(label, xs, ys) for label, xs, ys in lines if xs]
    if not lines:
        return None
    figure, (axes,) = new_figure()
    for label, xs, ys in lines:
        axes.plot(xs, ys, label=label, marker=marker)
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
    if len(lines) > 1:
        axes.legend()
    return save_figure(figure, path)


def plot_validation_score(records: list[dict], path: Path) -> Path | None:
    keys = sorted({key for record in records for key in record if VALIDATION_SOURCE_PATTERN.match(key)})
    keys_and_labels = [(VALIDATION_KEY, "all")] + [(key, VALIDATION_SOURCE_PATTERN.match(key).group(1))
                                                    for key in keys]
    # Validation runs every test_freq steps, so its points are sparse: markers show where they are.
    return plot_lines(records, keys_and_labels, "step", "step", "validation score", "Validation score", path,
                      marker="o")


def plot_evaluation(records: list[dict], path: Path) -> Path | None:
    """The evaluation stage's score and pass@k against the policy version each evaluation measured."""
    pass_keys = sorted({key for record in records for key in record if re.fullmatch(r"val/pass@\d+", key)},
                       key=lambda key: int(key.rsplit("@", 1)[1]))
    keys_and_labels = [(VALIDATION_KEY, "mean score")] + [(key, key.removeprefix("val/")) for key in pass_keys]
    return plot_lines(records, keys_and_labels, EVALUATION_VERSION_KEY, "policy version measured", "score",
                      "Evaluation by policy version", path, marker="o")


def plot_time_breakdown(records: list[dict], path: Path) -> Path | None:
    """Stacked area of the step's stages per step, the whole step's time as a dashed line over them, and
    the times measured inside or beside the step (`UNSTACKED_TIMINGS`) as dotted lines."""
    keys = sorted({key for record in records for key in record if key.startswith(TIMING_PREFIX)})
    # timing_s/step is the sum of the stages (plus untimed glue): stacking it too would count time twice.
    stage_keys = [key for key in keys if key != STEP_TIME_KEY and key not in UNSTACKED_TIMINGS] or \
        [key for key in keys if key not in UNSTACKED_TIMINGS]
    if not stage_keys:
        return None
    timed_records = [record for record in records if any(record.get(key) is not None for key in stage_keys)]
    steps = [record["step"] for record in timed_records]
    stacks = [[record.get(key) or 0.0 for record in timed_records] for key in stage_keys]
    figure, (axes,) = new_figure()
    axes.stackplot(steps, stacks, labels=[key.removeprefix(TIMING_PREFIX) for key in stage_keys], alpha=0.8)
    if STEP_TIME_KEY not in stage_keys:
        step_xs, step_ys = series(records, STEP_TIME_KEY)
        if step_xs:
            axes.plot(step_xs, step_ys, color="black", linestyle="--", label="step (total)")
    for key, label in UNSTACKED_TIMINGS.items():
        xs, ys = series(records, key)
        if label is not None and xs:
            axes.plot(xs, ys, color="dimgray", linestyle=":", label=label)
    axes.set_title("Time per step by stage")
    axes.set_xlabel("step")
    axes.set_ylabel("seconds")
    axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")  # outside: never hides data
    return save_figure(figure, path)


def plot_run(output_dir: str | Path) -> list[Path]:
    """Write the run's plots under `output_dir/plots/` from its metrics.jsonl; return the files written."""
    output_dir = Path(output_dir)
    records = read_metrics(output_dir / METRICS_FILE_NAME)
    plots_dir = output_dir / PLOTS_DIR_NAME
    score = [(SCORE_KEY, "train score")]
    response_lengths = [(key, key.split("/")[-1]) for key in RESPONSE_LENGTH_KEYS]
    paths = [
        plot_lines(records, score, "step", "step", "training score", "Training score",
                   plots_dir / "score_vs_step.png"),
        plot_lines(records, score, "wall_time_s", "wall time (s)", "training score", "Training score over time",
                   plots_dir / "score_vs_wall_time.png"),
        plot_validation_score(records, plots_dir / "validation_score.png"),
        plot_evaluation(records, plots_dir / "evaluation_vs_version.png"),
        plot_lines(records, response_lengths, "step", "step", "response length (tokens)", "Response length",
                   plots_dir / "response_length.png"),
        plot_time_breakdown(records, plots_dir / "time_breakdown.png"),
    ]
    return [path for path in paths if path is not None]


def plot_bars(values: dict[str, float], title: str, ylabel: str, path: str | Path) -> Path:
    """A bar chart of `values` (label -> number), each bar annotated with its value; returns `path`."""
    if not values:
        raise ValueError(f"plot_bars needs at least one value for {title!r}")
    figure, (axes,) = new_figure(width_in=max(4.0, 1.2 * len(values) + 2.0))
    bars = axes.bar(list(values), list(values.values()), color="tab:blue")
    axes.bar_label(bars, labels=[f"{value:.4g}" for value in values.values()])
    axes.set_title(title)
    axes.set_xlabel("configuration")
    axes.set_ylabel(ylabel)
    axes.margins(y=0.15)  # room above the tallest bar for its label
    return save_figure(figure, Path(path))


def plot_timeline(trace_path: str | Path, png_path: str | Path) -> Path:
    """Draw a Chrome trace saved by `Timeline.save`: one lane per row, spans as bars colored by name.

    Lanes share the time axis, so rollout and training overlapping (or waiting on each other) shows at a
    glance. Counter tracks, when present, are drawn as step lines in a panel below.
    """
    trace = read_trace(trace_path)
    num_panels = 2 if trace.counters else 1
    height_in = 1.5 + 0.5 * len(trace.spans_by_row) + 2.5 * (num_panels - 1)
    figure, axes_list = new_figure(num_panels, width_in=12.0, height_in=height_in)
    draw_lanes(axes_list[0], trace.spans_by_row)
    if trace.counters:
        draw_counters(axes_list[1], trace.counters)
    axes_list[-1].set_xlabel("time since start (s)")
    return save_figure(figure, Path(png_path))


def draw_lanes(axes, spans_by_row: dict[str, list[Span]]) -> None:
    """One horizontal lane per row, first row on top; one color per span name, named in the legend."""
    from matplotlib import colormaps
    from matplotlib.patches import Patch

    rows = list(spans_by_row)
    span_names = sorted({span.name for spans in spans_by_row.values() for span in spans})
    palette = colormaps["tab20"]
    colors = {name: palette(index % palette.N) for index, name in enumerate(span_names)}
    for lane, row in enumerate(rows):
        for name in span_names:
            bars = [(span.start_s, span.end_s - span.start_s) for span in spans_by_row[row] if span.name == name]
            if bars:
                axes.broken_barh(bars, (lane - 0.4, 0.8), color=colors[name])
    axes.set_yticks(range(len(rows)), labels=rows)
    axes.set_ylim(len(rows) - 0.5, -0.5)  # first row on top, as trace viewers show it
    axes.set_title("Timeline")
    axes.set_ylabel("row")
    if span_names:
        handles = [Patch(color=colors[name], label=name) for name in span_names[:MAX_LEGEND_ENTRIES]]
        axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")


def draw_counters(axes, counters: dict[str, list[CounterSample]]) -> None:
    """Each counter track as a step line: a counter holds its value until the next sample."""
    for name, samples in counters.items():
        axes.step([sample.time_s for sample in samples], [sample.value for sample in samples],
                  where="post", label=name)
    axes.set_title("Counters")
    axes.set_ylabel("counter value")
    axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
