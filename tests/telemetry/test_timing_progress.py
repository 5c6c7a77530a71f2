"""Stage timing and the progress display."""

import io

import pytest

from asyncrl.telemetry import Progress, Stopwatch, Timeline, timed
from asyncrl.telemetry.progress import StepRate
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


# Step times of a run whose first step pays the warm-up (actors' first calls, the pipeline filling): 7 s, then
# steps of 0.2-0.3 s with an occasional slow one, as a 2-core machine shared with other work gives them.
WARM_UP_STEP_TIMES_S = [7.0] + [0.2, 0.25, 0.3, 0.2, 1.2, 0.2, 0.25, 0.2, 0.3] * 11


def test_eta_after_the_first_tenth_of_the_steps_is_within_2x_of_the_real_remaining_time():
    total_steps = len(WARM_UP_STEP_TIMES_S)
    ends_s = [sum(WARM_UP_STEP_TIMES_S[:step]) for step in range(1, total_steps + 1)]
    rate = StepRate(initial_step=0, start_s=0.0)
    tenth = total_steps // 10
    for step in range(1, tenth + 1):
        rate.record(step, ends_s[step - 1])
    real_remaining_s = ends_s[-1] - ends_s[tenth - 1]
    estimate_s = rate.remaining_s(tenth, total_steps)
    assert real_remaining_s / 2 <= estimate_s <= 2 * real_remaining_s, (estimate_s, real_remaining_s)
    # The run's average so far, first step included, is the estimator this replaces: 2x off and more here.
    naive_s = ends_s[tenth - 1] / tenth * (total_steps - tenth)
    assert naive_s > 2 * real_remaining_s


def test_eta_uses_the_first_step_until_a_second_one_finishes_and_counts_from_a_resumed_step():
    rate = StepRate(initial_step=40, start_s=100.0)
    assert rate.remaining_s(40, 50) is None
    rate.record(41, 103.0)
    assert rate.remaining_s(41, 50) == pytest.approx(27.0)  # 3 s for the one step so far, 9 to go
    rate.record(43, 104.0)
    assert rate.remaining_s(43, 50) == pytest.approx(3.5)   # 0.5 s per step after the first, 7 to go


def test_an_older_validation_is_shown_with_its_step():
    stream = io.StringIO()
    progress = Progress(total_steps=4, enabled=True, stream=stream, interval_s=0.0)
    progress.update(1, {"critic/score/mean": 0.25, "val/score/mean": 0.5})
    progress.update(2, {"critic/score/mean": 0.5})
    progress.close()
    first, second = stream.getvalue().splitlines()
    assert first.endswith("val 0.5")          # measured at this step
    assert second.endswith("val 0.5 @ step 1")  # the final validation comes after the last step's line
