"""Plots: the expected PNGs from a synthetic run, skipped plots for absent metrics, bars and the timeline."""

import json

import numpy as np
import pytest
from matplotlib import colormaps
from matplotlib.colors import to_rgb
from PIL import Image

from asyncrl.telemetry import Timeline, plot_bars, plot_run, plot_timeline
from asyncrl.telemetry import plots

DPI = 100  # `plots.new_figure`'s: a figure of w x h inches is a PNG of 100 w x 100 h pixels


def write_metrics(output_dir, records):
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))


def synthetic_records(num_steps=8):
    records = []
    for step in range(1, num_steps + 1):
        record = {"step": step, "wall_time_s": 2.0 * step, "critic/score/mean": step / num_steps,
                  "response_length/mean": 20.0 + step, "response_length/max": 40.0 + step,
                  "timing_s/generate": 1.0, "timing_s/update_actor": 0.5, "timing_s/step": 1.6}
        if step % 4 == 0:
            record.update({"val/score/mean": step / 10, "val/gsm8k/score/mean": step / 12})
        records.append(record)
    return records


def assert_png(path, size_in: tuple[float, float], colors: list[tuple[float, float, float]], alpha: float = 1.0):
    """The file decodes as a PNG of the figure's size in pixels, and each series' color (drawn with `alpha` over
    the white background) covers at least 0.1% of it: a blank or data-less figure has none of them."""
    with Image.open(path) as image:
        assert image.format == "PNG"
        assert image.size == (round(size_in[0] * DPI), round(size_in[1] * DPI))
        pixels = np.asarray(image.convert("RGB")).astype(int)  # (H, W, 3)
    for color in colors:
        drawn = [round(255 * (alpha * channel + 1.0 - alpha)) for channel in color]
        covered = (np.abs(pixels - drawn).max(axis=-1) <= 10).mean()
        assert covered >= 1e-3, (path.name, color, covered)


def series_color(index: int) -> tuple[float, float, float]:
    """Matplotlib's default color of the index-th line of an axes (tab:blue, tab:orange, ...)."""
    return to_rgb(f"C{index}")


def saved_figures(monkeypatch) -> dict[str, object]:
    """File name -> the figure `plots.save_figure` wrote there, filled as the plots are saved."""
    figures = {}
    original_save = plots.save_figure

    def save_figure(figure, path):
        figures[path.name] = figure
        return original_save(figure, path)

    monkeypatch.setattr(plots, "save_figure", save_figure)
    return figures


def line_points(axes) -> dict[str, list[tuple[float, float]]]:
    """Each line's label -> its (x, y) points."""
    return {line.get_label(): list(zip(line.get_xdata(), line.get_ydata())) for line in axes.lines}


def test_plot_run_writes_every_plot_of_a_complete_run(tmp_path):
    write_metrics(tmp_path, synthetic_records())
    paths = plot_run(tmp_path)
    assert sorted(path.name for path in paths) == ["response_length.png", "score_vs_step.png",
                                                  "score_vs_wall_time.png", "time_breakdown.png",
                                                  "validation_score.png"]
    for path in paths:
        assert path.parent == tmp_path / "plots"
    default_size = (8.0, 4.5)
    assert_png(tmp_path / "plots" / "score_vs_step.png", default_size, [series_color(0)])
    assert_png(tmp_path / "plots" / "score_vs_wall_time.png", default_size, [series_color(0)])
    assert_png(tmp_path / "plots" / "validation_score.png", default_size, [series_color(0), series_color(1)])
    assert_png(tmp_path / "plots" / "response_length.png", default_size, [series_color(0), series_color(1)])
    assert_png(tmp_path / "plots" / "time_breakdown.png", default_size, [series_color(0), series_color(1)],
               alpha=0.8)


def test_plot_run_draws_the_runs_numbers(tmp_path, monkeypatch):
    figures = saved_figures(monkeypatch)
    write_metrics(tmp_path, synthetic_records())
    plot_run(tmp_path)
    steps = range(1, 9)
    axes = {name: figure.axes[0] for name, figure in figures.items()}
    assert line_points(axes["score_vs_step.png"]) == {"train score": [(step, step / 8) for step in steps]}
    assert line_points(axes["score_vs_wall_time.png"]) == {"train score": [(2.0 * step, step / 8) for step in steps]}
    assert line_points(axes["validation_score.png"]) == {"all": [(4, 0.4), (8, 0.8)],
                                                         "gsm8k": [(4, 4 / 12), (8, 8 / 12)]}
    assert line_points(axes["response_length.png"]) == {"mean": [(step, 20.0 + step) for step in steps],
                                                        "max": [(step, 40.0 + step) for step in steps]}
    breakdown = axes["time_breakdown.png"]
    assert line_points(breakdown) == {"step (total)": [(step, 1.6) for step in steps]}
    # The stages stacked: generate's 1.0 s, update_actor's 0.5 s on top of it, at every step.
    tops = [collection.get_paths()[0].vertices[:, 1].max() for collection in breakdown.collections]
    assert [collection.get_label() for collection in breakdown.collections] == ["generate", "update_actor"]
    assert tops == pytest.approx([1.0, 1.5])


def test_time_breakdown_stacks_only_the_steps_own_stages(tmp_path, monkeypatch):
    # A sync-mode step as the recipe logs it: generate_async (the generation's own time) is inside gen, and
    # one_step_off's wait_prev_gen repeats gen; stacking either would raise the stack above the step.
    figures = saved_figures(monkeypatch)
    records = [{"step": step, "timing_s/gen": 0.75, "timing_s/generate_async": 0.5, "timing_s/wait_prev_gen": 0.75,
                "timing_s/update_actor": 0.25, "timing_s/step": 1.125} for step in range(1, 5)]
    write_metrics(tmp_path, records)
    plot_run(tmp_path)
    breakdown = figures["time_breakdown.png"].axes[0]
    assert [collection.get_label() for collection in breakdown.collections] == ["gen", "update_actor"]
    tops = [collection.get_paths()[0].vertices[:, 1].max() for collection in breakdown.collections]
    assert tops == pytest.approx([0.75, 1.0])  # the stack stays under the step's 1.125 s
    lines = line_points(breakdown)
    assert lines["step (total)"] == [(step, 1.125) for step in range(1, 5)]
    assert lines["generation (inside gen, or overlapped)"] == [(step, 0.5) for step in range(1, 5)]
    assert "wait_prev_gen" not in " ".join(lines)


def test_plot_run_skips_plots_whose_metrics_are_absent(tmp_path):
    records = [{"step": step, "wall_time_s": float(step), "critic/score/mean": 0.1 * step} for step in range(4)]
    write_metrics(tmp_path, records)
    paths = plot_run(tmp_path)
    assert sorted(path.name for path in paths) == ["score_vs_step.png", "score_vs_wall_time.png"]
    assert sorted(path.name for path in (tmp_path / "plots").iterdir()) == ["score_vs_step.png",
                                                                           "score_vs_wall_time.png"]


def test_plot_axes_are_titled(tmp_path, monkeypatch):
    figures = saved_figures(monkeypatch)
    write_metrics(tmp_path, synthetic_records())
    plot_run(tmp_path)
    assert len(figures) == 5
    for figure in figures.values():
        for axes in figure.axes:
            assert axes.get_title() and axes.get_xlabel() and axes.get_ylabel()


def test_plot_bars_draws_each_value(tmp_path, monkeypatch):
    figures = saved_figures(monkeypatch)
    path = plot_bars({"sync": 41.0, "fully_async": 97.5}, "Throughput", "samples/s", tmp_path / "bars.png")
    assert_png(path, (4.4, 4.5), [series_color(0)])  # 1.2 in per bar + 2 in
    (axes,) = figures["bars.png"].axes
    assert [bar.get_height() for bar in axes.patches] == [41.0, 97.5]
    assert [label.get_text() for label in axes.get_xticklabels()] == ["sync", "fully_async"]
    assert [text.get_text() for text in axes.texts] == ["41", "97.5"]
    with pytest.raises(ValueError, match="Empty"):
        plot_bars({}, "Empty", "x", tmp_path / "empty.png")


def test_plot_timeline_draws_a_saved_trace(tmp_path, monkeypatch):
    timeline = Timeline()
    origin_s = timeline.start_s
    timeline.add_span("rollout/replica0", "generate", origin_s, origin_s + 2.0)
    timeline.add_span("trainer/rank0", "update_actor", origin_s + 1.0, origin_s + 3.0)
    timeline.add_counter("queue_size", 3, origin_s + 0.5)
    trace_path = timeline.save(tmp_path / "timeline.json")
    figures = saved_figures(monkeypatch)
    path = plot_timeline(trace_path, tmp_path / "plots" / "timeline.png")
    # Two lanes and a counter panel: 1.5 in + 0.5 in per lane + 2.5 in; one tab20 color per span name.
    assert_png(path, (12.0, 5.0), [colormaps["tab20"](0)[:3], colormaps["tab20"](1)[:3]])
    lanes, counters = figures["timeline.png"].axes
    assert [label.get_text() for label in lanes.get_yticklabels()] == ["rollout/replica0", "trainer/rank0"]
    # Each span a bar in its lane, (start, lane bottom, end, lane top), in seconds since the trace's start.
    boxes = [collection.get_paths()[0].get_extents() for collection in lanes.collections]
    assert np.allclose([box.extents for box in boxes], [(0.0, -0.4, 2.0, 0.4), (1.0, 0.6, 3.0, 1.4)])
    assert line_points(counters) == {"queue_size": [(0.5, 3.0)]}
