"""Progress of a training run: a tqdm bar on a terminal, a periodic status line elsewhere.

    progress = Progress(total_steps=100, enabled=True)
    for step in range(1, 101):
        ...
        progress.update(step, metrics, num_samples=len(batch))
    progress.close()

The status shows the step, samples/s (metric `perf/samples_per_s` when logged, else `num_samples` over the
time since the previous update), the training reward (`critic/score/mean`) and the latest validation
score (`val/score/mean`, kept until the next validation). When the stream is not a terminal (CI, a log
file, `nohup`), a bar would write carriage-return garbage, so one plain line is printed every
`interval_s` seconds instead (the first update and `close()` always print).
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
        if metrics.get(VALIDATION_KEY) is not None:
            self.last_validation_score = metrics[VALIDATION_KEY]
        status = self.status(samples_per_s, metrics.get(REWARD_KEY))
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            self.bar.set_postfix_str(status, refresh=True)
            return
        self.pending_line = self.status_line(step, status, now_s)
        if self.last_print_s is None or now_s - self.last_print_s >= self.interval_s:
            self.print_pending(now_s)

    def status(self, samples_per_s: float | None, reward: float | None) -> str:
        """`12.3 samples/s | reward 0.512 | val 0.6`, leaving out what is unknown."""
        parts = []
        if samples_per_s is not None:
            parts.append(f"{format_number(float(samples_per_s))} samples/s")
        if reward is not None:
            parts.append(f"reward {format_number(float(reward))}")
        if self.last_validation_score is not None:
            parts.append(f"val {format_number(float(self.last_validation_score))}")
        return " | ".join(parts)

    def status_line(self, step: int, status: str, now_s: float) -> str:
        """The line-mode status: step (of total, with percent), elapsed time, ETA, then `status`."""
        elapsed_s = now_s - self.start_s
        parts = [f"step {step}"]
        if self.total_steps:
            parts[0] += f"/{self.total_steps} ({100.0 * step / self.total_steps:.0f}%)"
        parts.append(f"elapsed {format_duration(elapsed_s)}")
        num_done_steps = step - self.initial_step
        if self.total_steps and num_done_steps > 0:
            parts.append(f"eta {format_duration(elapsed_s / num_done_steps * (self.total_steps - step))}")
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
