"""Plots: the expected PNGs from a synthetic run, skipped plots for absent metrics, bars and the timeline."""

import json

import pytest

from asyncrl.telemetry import Timeline, plot_bars, plot_run, plot_timeline

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


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


def assert_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 1000


def test_plot_run_writes_every_plot_of_a_complete_run(tmp_path):
    write_metrics(tmp_path, synthetic_records())
    paths = plot_run(tmp_path)
    assert sorted(path.name for path in paths) == ["response_length.png", "score_vs_step.png",
                                                  "score_vs_wall_time.png", "time_breakdown.png",
                                                  "validation_score.png"]
    for path in paths:
        assert path.parent == tmp_path / "plots"
        assert_png(path)


def test_plot_run_skips_plots_whose_metrics_are_absent(tmp_path):
    records = [{"step": step, "wall_time_s": float(step), "critic/score/mean": 0.1 * step} for step in range(4)]
    write_metrics(tmp_path, records)
    paths = plot_run(tmp_path)
    assert sorted(path.name for path in paths) == ["score_vs_step.png", "score_vs_wall_time.png"]
    assert sorted(path.name for path in (tmp_path / "plots").iterdir()) == ["score_vs_step.png",
                                                                           "score_vs_wall_time.png"]


def test_plot_axes_are_titled(tmp_path, monkeypatch):
    from asyncrl.telemetry import plots

    saved = []
    original_save = plots.save_figure
    monkeypatch.setattr(plots, "save_figure", lambda figure, path: saved.append(figure) or original_save(figure, path))
    write_metrics(tmp_path, synthetic_records())
    plot_run(tmp_path)
    assert len(saved) == 5
    for figure in saved:
        for axes in figure.axes:
            assert axes.get_title() and axes.get_xlabel() and axes.get_ylabel()


def test_plot_bars_writes_a_png(tmp_path):
    path = plot_bars({"sync": 41.0, "fully_async": 97.5}, "Throughput", "samples/s", tmp_path / "bars.png")
    assert_png(path)
    with pytest.raises(ValueError, match="Empty"):
        plot_bars({}, "Empty", "x", tmp_path / "empty.png")


def test_plot_timeline_draws_a_saved_trace(tmp_path):
    timeline = Timeline()
    origin_s = timeline.start_s
    timeline.add_span("rollout/replica0", "generate", origin_s, origin_s + 2.0)
    timeline.add_span("trainer/rank0", "update_actor", origin_s + 1.0, origin_s + 3.0)
    timeline.add_counter("queue_size", 3, origin_s + 0.5)
    trace_path = timeline.save(tmp_path / "timeline.json")
    assert_png(plot_timeline(trace_path, tmp_path / "plots" / "timeline.png"))
