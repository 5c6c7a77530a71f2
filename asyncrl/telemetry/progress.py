"""Progress of a training run: a tqdm bar on a terminal, a periodic status line elsewhere.

    progress = Progress(total_steps=100, enabled=True)
    for step in range(1, 101):
        ...
        progress.update(step, metrics, num_samples=len(batch))
    progress.close()

The status shows the step, samples/s (metric `perf/samples_per_s` when logged, else `num_samples` over the
time since the previous update), the training reward (`critic/score/mean`) and the latest validation
score (`val/score/mean`, kept until the next validation and marked with its step once older than the
shown step). When the stream is not a terminal (CI, a log file, `nohup`), a bar would write
carriage-return garbage, so one plain line is printed every `interval_s` seconds instead (the first update
and `close()` always print).

The ETA leaves out the run's first step (`StepRate`): it pays the warm-up (actors' first calls, a pipeline
filling, compilation) and would otherwise inflate the estimate several times over for the whole run.
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from typing import TextIO

from tqdm import tqdm

from asyncrl.telemetry.trackers import format_number

SAMPLES_PER_SECOND_KEY = "perf/samples_per_s"
REWARD_KEY = "critic/score/mean"
VALIDATION_KEY = "val/score/mean"


class StepRate:
    """Seconds per step for the ETA, measured over the steps after the run's first one.

    The first step of a run pays its warm-up: on the demo it takes several times a later step, and an
    average that includes it overestimates the remaining time by that factor until many steps dilute it.
    Until a second step finishes, the first one is all there is.
    """

    def __init__(self, initial_step: int, start_s: float) -> None:
        self.initial_step = initial_step
        self.start_s = start_s
        self.first: tuple[int, float] | None = None   # (step, time) when the run's first step finished
        self.last: tuple[int, float] | None = None

    def record(self, step: int, now_s: float) -> None:
        if self.first is None:
            self.first = (step, now_s)
        self.last = (step, now_s)

    def seconds_per_step(self) -> float | None:
        if self.first is None or self.last is None:
            return None
        (first_step, first_s), (last_step, last_s) = self.first, self.last
        if last_step > first_step:
            return (last_s - first_s) / (last_step - first_step)
        return (first_s - self.start_s) / max(first_step - self.initial_step, 1)

    def remaining_s(self, step: int, total_steps: int) -> float | None:
        seconds = self.seconds_per_step()
        return None if seconds is None else seconds * max(total_steps - step, 0)


class Progress:
    """A progress display for `total_steps` steps (None when unknown); does nothing when not `enabled`.

    `initial_step` is the step a resumed run starts from, so rates and the ETA count only this run's steps.
    """

    def __init__(self, total_steps: int | None, enabled: bool = True, stream: TextIO | None = None,
                 interval_s: float = 30.0, initial_step: int = 0) -> None:
        self.total_steps = total_steps
        self.is_enabled = enabled
        self.stream = sys.stdout if stream is None else stream
        self.interval_s = interval_s
        self.initial_step = initial_step
        self.start_s = time.monotonic()
        self.last_update_s = self.start_s
        self.last_print_s: float | None = None
        self.pending_line: str | None = None  # a status not yet printed in line mode, shown by close()
        self.last_validation_score: float | None = None
        self.last_validation_step: int | None = None
        self.rate = StepRate(initial_step, self.start_s)
        self.is_terminal = enabled and self.stream.isatty()
        self.bar = tqdm(total=total_steps, initial=initial_step, file=self.stream, unit="step",
                        dynamic_ncols=True) if self.is_terminal else None

    def update(self, step: int, metrics: dict, num_samples: int | None = None) -> None:
        """Show that `step` finished, with its metrics; `num_samples` is how many samples the step used."""
        if not self.is_enabled:
            return
        now_s = time.monotonic()
        samples_per_s = metrics.get(SAMPLES_PER_SECOND_KEY)
        if samples_per_s is None and num_samples is not None and now_s > self.last_update_s:
            samples_per_s = num_samples / (now_s - self.last_update_s)
        self.last_update_s = now_s
        self.rate.record(step, now_s)
        if metrics.get(VALIDATION_KEY) is not None:
            self.last_validation_score = metrics[VALIDATION_KEY]
            self.last_validation_step = step
        status = self.status(samples_per_s, metrics.get(REWARD_KEY), step)
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            self.bar.set_postfix_str(status, refresh=True)
            return
        self.pending_line = self.status_line(step, status, now_s)
        if self.last_print_s is None or now_s - self.last_print_s >= self.interval_s:
            self.print_pending(now_s)

    def status(self, samples_per_s: float | None, reward: float | None, step: int) -> str:
        """`12.3 samples/s | reward 0.512 | val 0.6`, leaving out what is unknown; a validation older than
        `step` says when it was measured (`val 0.6 @ step 25`), so a last line before the final validation
        does not pass the previous one off as current."""
        parts = []
        if samples_per_s is not None:
            parts.append(f"{format_number(float(samples_per_s))} samples/s")
        if reward is not None:
            parts.append(f"reward {format_number(float(reward))}")
        if self.last_validation_score is not None:
            when = "" if self.last_validation_step == step else f" @ step {self.last_validation_step}"
            parts.append(f"val {format_number(float(self.last_validation_score))}{when}")
        return " | ".join(parts)

    def status_line(self, step: int, status: str, now_s: float) -> str:
        """The line-mode status: step (of total, with percent), elapsed time, ETA, then `status`."""
        elapsed_s = now_s - self.start_s
        parts = [f"step {step}"]
        if self.total_steps:
            parts[0] += f"/{self.total_steps} ({100.0 * step / self.total_steps:.0f}%)"
        parts.append(f"elapsed {format_duration(elapsed_s)}")
        remaining_s = self.rate.remaining_s(step, self.total_steps) if self.total_steps else None
        if remaining_s is not None:
            parts.append(f"eta {format_duration(remaining_s)}")
        if status:
            parts.append(status)
        return "[progress] " + " | ".join(parts)

    def print_pending(self, now_s: float) -> None:
        print(self.pending_line, file=self.stream, flush=True)
        self.pending_line = None
        self.last_print_s = now_s

    def close(self) -> None:
        """Close the bar, or print the last status line if the interval held it back; safe to call twice."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif self.pending_line is not None:
            self.print_pending(time.monotonic())


def format_duration(seconds: float) -> str:
    """`1:02:03` for 3723 seconds (whole seconds; negative durations clamp to 0)."""
    return str(timedelta(seconds=round(max(0.0, seconds))))
