"""Metric trackers: one `Tracker` fans each step's metrics out to the chosen backends.

    tracker = Tracker(output_dir, ["console", "jsonl", "tensorboard"], project="asyncrl",
                      experiment="gsm8k-grpo", config=config_dict, resume_step=None)
    tracker.log({"critic/score/mean": 0.42, "actor/pg_loss": -0.01}, step=1)
    tracker.close()

Backends (names as in `trainer.logger`):
- `console`: one compact line per step on stdout, the most important metrics first (see `CONSOLE_METRICS`).
- `jsonl`: `output_dir/metrics.jsonl`, one JSON object per call with `step`, `timestamp` (Unix seconds) and
  `wall_time_s` (seconds since the tracker was created, plus the last kept line's wall_time_s when
  resuming, so it keeps growing across restarts); keys sorted, non-finite numbers as null, flushed
  per line so a killed run keeps every finished step. `read_metrics` reads it back.
- `tensorboard`: event files under `output_dir/tensorboard` (`pip install asyncrl[tensorboard]`).
- `wandb`, `mlflow`: optional (`pip install asyncrl[wandb]` / `asyncrl[mlflow]`); imported only when chosen.

Resuming at step k (`resume_step=k`): metrics.jsonl keeps only lines with step < k, since the resumed
run writes steps k, k+1, ... again; tensorboard purges its events from step k on; wandb and mlflow
continue the run whose id was saved in output_dir.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import numpy as np
from tqdm import tqdm

BACKENDS = ("console", "jsonl", "tensorboard", "wandb", "mlflow")
METRICS_FILE_NAME = "metrics.jsonl"

# (metric, label) in the order the console shows them; every other metric goes only to the files.
CONSOLE_METRICS = (
    ("critic/score/mean", "score"),
    ("val/score/mean", "val_score"),
    ("response_length/mean", "response_length"),
    ("actor/pg_loss", "pg_loss"),
    ("actor/entropy", "entropy"),
    ("actor/ppo_kl", "ppo_kl"),
    ("actor/grad_norm", "grad_norm"),
    ("staleness/mean", "staleness"),
    ("param_version", "version"),
    ("perf/throughput", "throughput"),
    ("timing_s/step", "step_s"),
)

MetricValue = int | float | str | None


class Backend(Protocol):
    def log(self, metrics: dict[str, MetricValue], step: int) -> None: ...

    def close(self) -> None: ...


def to_metric_value(key: str, value: object) -> MetricValue:
    """A JSON-ready value: numpy scalars and 1-element arrays/tensors become Python numbers, bools 0/1."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, int):
        return int(value)  # plain int, also for int subclasses such as IntEnum
    if isinstance(value, float):
        return float(value)
    if isinstance(value, np.generic):
        return to_metric_value(key, value.item())
    item = getattr(value, "item", None)  # a 0-d numpy array or torch tensor, without importing torch
    if callable(item):
        return to_metric_value(key, item())
    raise TypeError(f"metric {key!r} has a value of type {type(value).__name__}; expected a number or a string")


def numeric_metrics(metrics: dict[str, MetricValue]) -> dict[str, float]:
    """The metrics a numeric backend can plot: numbers as floats, strings and nulls skipped."""
    return {key: float(value) for key, value in metrics.items() if isinstance(value, (int, float))}


def format_number(value: MetricValue) -> str:
    """Short human form: integers as they are, floats with 4 significant digits (no exponent below 1e5)."""
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isfinite(value) and 1e4 <= abs(value) < 1e12:
        return f"{value:.0f}"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


class ConsoleBackend:
    """Prints `step N | score ... | ...` to stdout, through tqdm so an active progress bar is not torn."""

    def log(self, metrics: dict[str, MetricValue], step: int) -> None:
        parts = [f"step {step}"]
        parts += [f"{label} {format_number(metrics[key])}" for key, label in CONSOLE_METRICS if key in metrics]
        # sys.stdout is looked up per call so redirection (pytest's capture, contextlib) is honoured.
        tqdm.write(" | ".join(parts), file=sys.stdout)
        sys.stdout.flush()

    def close(self) -> None:
        pass


class JsonlBackend:
    """Appends one JSON object per step to `metrics.jsonl`; see the module docstring for the format."""

    def __init__(self, output_dir: Path, resume_step: int | None) -> None:
        self.path = output_dir / METRICS_FILE_NAME
        self.start_s = time.monotonic()
        kept = truncate_metrics(self.path, resume_step) if self.path.exists() else []
        # A resumed run continues the clock where the kept lines stop, so wall_time_s keeps growing across
        # restarts and a score-vs-time plot stays a function (downtime between the runs is not counted).
        self.wall_time_offset_s = kept[-1]["wall_time_s"] if resume_step is not None and kept else 0.0
        self.file = self.path.open("a", encoding="utf-8")

    def log(self, metrics: dict[str, MetricValue], step: int) -> None:
        record = {key: None if isinstance(value, float) and not math.isfinite(value) else value
                  for key, value in metrics.items()}
        wall_time_s = self.wall_time_offset_s + time.monotonic() - self.start_s
        record.update(step=step, timestamp=time.time(), wall_time_s=wall_time_s)
        self.file.write(json.dumps(record, sort_keys=True, allow_nan=False) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class TensorboardBackend:
    """Scalars to `output_dir/tensorboard` through torch's SummaryWriter (torch is imported only here)."""

    def __init__(self, output_dir: Path, config: dict, resume_step: int | None) -> None:
        SummaryWriter = import_optional("torch.utils.tensorboard", "tensorboard").SummaryWriter
        # purge_step drops events at or past the resume step, as metrics.jsonl does, and a short flush
        # interval keeps a killed run's curves close to complete.
        self.writer = SummaryWriter(log_dir=str(output_dir / "tensorboard"), purge_step=resume_step, flush_secs=10)
        self.writer.add_text("config", f"```\n{json.dumps(config, indent=2, sort_keys=True, default=str)}\n```")

    def log(self, metrics: dict[str, MetricValue], step: int) -> None:
        for key, value in numeric_metrics(metrics).items():
            self.writer.add_scalar(key, value, global_step=step)

    def close(self) -> None:
        self.writer.close()


class WandbBackend:
    """Weights & Biases run; its id is kept in `output_dir/wandb_run_id` so a resumed run continues it."""

    def __init__(self, output_dir: Path, project: str, experiment: str, config: dict,
                 resume_step: int | None) -> None:
        self.wandb = import_optional("wandb", "wandb")
        id_path = output_dir / "wandb_run_id"
        run_id = id_path.read_text().strip() if resume_step is not None and id_path.exists() else None
        run = self.wandb.init(project=project, name=experiment, config=config, dir=str(output_dir),
                              id=run_id, resume="allow" if run_id else None)
        id_path.write_text(run.id)

    def log(self, metrics: dict[str, MetricValue], step: int) -> None:
        self.wandb.log(numeric_metrics(metrics), step=step)

    def close(self) -> None:
        self.wandb.finish()


class MlflowBackend:
    """MLflow run in experiment `project`; its id is kept in `output_dir/mlflow_run_id` for resuming."""

    MAX_PARAM_LENGTH = 500  # the smallest limit across MLflow versions

    def __init__(self, output_dir: Path, project: str, experiment: str, config: dict,
                 resume_step: int | None) -> None:
        self.mlflow = import_optional("mlflow", "mlflow")
        id_path = output_dir / "mlflow_run_id"
        if resume_step is not None and id_path.exists():
            run = self.mlflow.start_run(run_id=id_path.read_text().strip())
        else:
            self.mlflow.set_experiment(project)
            run = self.mlflow.start_run(run_name=experiment)
            self.mlflow.log_params({key: str(value)[:self.MAX_PARAM_LENGTH]
                                    for key, value in flatten_config(config)})
        id_path.write_text(run.info.run_id)

    def log(self, metrics: dict[str, MetricValue], step: int) -> None:
        self.mlflow.log_metrics(numeric_metrics(metrics), step=step)

    def close(self) -> None:
        self.mlflow.end_run()


def flatten_config(config: dict, prefix: str = "") -> Iterator[tuple[str, object]]:
    """(dotted key, leaf value) pairs of a nested dict: {"actor": {"lr": 1}} -> ("actor.lr", 1)."""
    for key, value in config.items():
        if isinstance(value, dict):
            yield from flatten_config(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def import_optional(module_name: str, extra: str):
    """Import an optional dependency, or raise an ImportError that says which pip extra provides it."""
    try:
        return __import__(module_name, fromlist=["_"])
    except ImportError as error:
        raise ImportError(
            f"the '{extra}' tracker needs {module_name!r}, which is not installed: "
            f"pip install asyncrl[{extra}]") from error


class Tracker:
    """Sends each step's metrics to every chosen backend; see the module docstring.

    Use as a context manager or call `close()` so files are flushed and remote runs finished.
    """

    def __init__(self, output_dir: str | Path, backends: list[str], project: str, experiment: str,
                 config: dict, resume_step: int | None = None) -> None:
        unknown = [name for name in backends if name not in BACKENDS]
        if unknown:
            raise ValueError(f"unknown tracker backend(s) {unknown}; valid: {list(BACKENDS)}")
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.backends: dict[str, Backend] = {}
        try:
            for name in dict.fromkeys(backends):  # a name listed twice is one backend
                self.backends[name] = self._make_backend(name, project, experiment, config, resume_step)
        except BaseException:
            self.close()  # do not leave a half-built tracker's files open or remote runs dangling
            raise

    def _make_backend(self, name: str, project: str, experiment: str, config: dict,
                      resume_step: int | None) -> Backend:
        if name == "console":
            return ConsoleBackend()
        if name == "jsonl":
            return JsonlBackend(self.output_dir, resume_step)
        if name == "tensorboard":
            return TensorboardBackend(self.output_dir, config, resume_step)
        if name == "wandb":
            return WandbBackend(self.output_dir, project, experiment, config, resume_step)
        return MlflowBackend(self.output_dir, project, experiment, config, resume_step)

    def log(self, metrics: dict[str, object], step: int) -> None:
        """Log one step's metrics (numbers, numpy scalars, bools, strings) to every backend."""
        values = {key: to_metric_value(key, value) for key, value in metrics.items()}
        for backend in self.backends.values():
            backend.log(values, step)

    def close(self) -> None:
        """Flush and close every backend; safe to call twice."""
        backends, self.backends = self.backends, {}
        for backend in backends.values():
            backend.close()

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def parse_metrics_lines(lines: list[str], path: Path) -> list[dict]:
    """Parsed records of metrics.jsonl lines; only the last line may be broken (a write cut by a kill)."""
    records = []
    for line_number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            if line_number == len(lines):
                break
            raise ValueError(f"{path}:{line_number}: not a JSON line ({error})") from error
    return records


def read_metrics(path: str | Path) -> list[dict]:
    """Read a metrics.jsonl (or the run folder holding it) into one dict per logged step, in file order.

    A truncated last line, left by a process killed mid-write, is ignored.
    """
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE_NAME
    return parse_metrics_lines(path.read_text(encoding="utf-8").split("\n"), path)


def truncate_metrics(path: Path, resume_step: int | None) -> list[dict]:
    """Rewrite metrics.jsonl keeping the steps before `resume_step` (all steps when None); return those kept.

    A broken last line is dropped either way, so the next append starts on a clean line.
    """
    records = read_metrics(path)
    kept = [record for record in records if resume_step is None or record["step"] < resume_step]
    temporary_path = path.with_name(path.name + ".tmp")
    with temporary_path.open("w", encoding="utf-8") as file:
        for record in kept:
            file.write(json.dumps(record, sort_keys=True) + "\n")
    os.replace(temporary_path, path)  # atomic: a kill during the rewrite leaves the old file whole
    return kept
