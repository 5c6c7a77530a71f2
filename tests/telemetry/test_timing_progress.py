"""Stage timing and the progress display."""

import io

import pytest

from asyncrl.telemetry import Progress, Stopwatch, Timeline, timed
from asyncrl.telemetry import timing


class FakeClock:
    """Stands in for the `time` module of `asyncrl.telemetry.timing`: it moves only when a test advances it, so
    every duration is exact (binary fractions of a second) whatever the machine's load."""

    WALL_OFFSET_S = 1.7e9  # the wall clock reads like today's; the monotonic one starts at 1000 s

    def __init__(self) -> None:
        self.now_s = 1000.0

    def perf_counter(self) -> float:
        return self.now_s

    def time(self) -> float:
        return self.WALL_OFFSET_S + self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(timing, "time", fake)
    return fake


def test_timed_accumulates_and_records_a_span(clock):
    metrics = {}
    timeline = Timeline()
    with timed(metrics, "generate", timeline=timeline, row="driver"):
        clock.advance(0.25)
    assert metrics == {"timing_s/generate": 0.25}
    clock.advance(4.0)  # between the blocks: not the stage's time
    with timed(metrics, "generate"):
        clock.advance(0.125)
    assert metrics == {"timing_s/generate": 0.375}
    (span,) = timeline.spans("driver")
    assert (span.name, span.start_s, span.end_s) == ("generate", FakeClock.WALL_OFFSET_S + 1000.0,
                                                     FakeClock.WALL_OFFSET_S + 1000.25)


def test_timed_counts_the_time_of_a_failing_block(clock):
    metrics = {}
    with pytest.raises(RuntimeError, match="scorer crashed"), timed(metrics, "reward"):
        clock.advance(0.5)
        raise RuntimeError("scorer crashed")
    assert metrics == {"timing_s/reward": 0.5}


def test_stopwatch_laps_add_up_to_elapsed(clock):
    stopwatch = Stopwatch()
    clock.advance(0.5)
    assert stopwatch.lap_s() == 0.5
    clock.advance(0.25)
    assert stopwatch.lap_s() == 0.25  # since the previous lap, not since the start
    clock.advance(0.125)
    assert stopwatch.elapsed_s() == 0.875
    stopwatch.restart()
    clock.advance(1.0)
    assert stopwatch.elapsed_s() == 1.0 and stopwatch.lap_s() == 1.0


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
