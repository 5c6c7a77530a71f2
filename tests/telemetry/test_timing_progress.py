"""Stage timing and the progress display."""

import io
import time

import pytest

from asyncrl.telemetry import Progress, Stopwatch, Timeline, timed


def test_timed_accumulates_and_records_a_span():
    metrics = {}
    timeline = Timeline()
    with timed(metrics, "generate", timeline=timeline, row="driver"):
        time.sleep(0.02)
    first_s = metrics["timing_s/generate"]
    assert first_s >= 0.02
    with timed(metrics, "generate"):
        time.sleep(0.01)
    assert metrics["timing_s/generate"] >= first_s + 0.01
    (span,) = timeline.spans("driver")
    # Wall-clock seconds near 1.7e9 resolve only ~0.2 microseconds as floats, hence the tolerance.
    assert span.name == "generate" and span.end_s - span.start_s == pytest.approx(first_s, abs=1e-5)


def test_timed_counts_the_time_of_a_failing_block():
    metrics = {}
    with pytest.raises(RuntimeError), timed(metrics, "reward"):
        raise RuntimeError("scorer crashed")
    assert metrics["timing_s/reward"] >= 0.0


def test_stopwatch_laps_add_up_to_elapsed():
    stopwatch = Stopwatch()
    time.sleep(0.01)
    first_lap_s = stopwatch.lap_s()
    second_lap_s = stopwatch.lap_s()
    assert first_lap_s >= 0.01 and second_lap_s < first_lap_s
    assert stopwatch.elapsed_s() >= first_lap_s + second_lap_s


def test_progress_without_a_terminal_prints_status_lines():
    stream = io.StringIO()  # isatty() is False, as in CI
    progress = Progress(total_steps=10, enabled=True, stream=stream, interval_s=3600.0)
    progress.update(1, {"critic/score/mean": 0.25, "perf/samples_per_s": 12.5, "val/score/mean": 0.5})
    progress.update(2, {"critic/score/mean": 0.375}, num_samples=8)  # held back by the interval
    assert stream.getvalue().count("\n") == 1
    progress.close()
    first, last = stream.getvalue().splitlines()
    assert first.startswith("[progress] step 1/10 (10%)")
    assert "12.5 samples/s" in first and "reward 0.25" in first and "val 0.5" in first
    assert last.startswith("[progress] step 2/10 (20%)")
    assert "reward 0.375" in last and "val 0.5" in last and "samples/s" in last
    assert "\r" not in stream.getvalue()


def test_disabled_progress_prints_nothing():
    stream = io.StringIO()
    progress = Progress(total_steps=10, enabled=False, stream=stream, interval_s=0.0)
    progress.update(1, {"critic/score/mean": 0.25})
    progress.close()
    assert stream.getvalue() == ""
