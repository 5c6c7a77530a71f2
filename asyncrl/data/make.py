"""Write a built-in task as `train.parquet` and `val.parquet` in verl's schema.

    asyncrl data make arithmetic --out data/arith --train-size 4000 --val-size 200 --set max_digits=3

Validation problems are drawn first and never repeated in the training split, so validation measures
generalisation rather than recall.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as parquet

from asyncrl.data.tasks import TASKS


def make_task(name: str, options: dict[str, str] | None = None) -> Any:
    """A task instance from its name and `key=value` knob strings."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; built-in tasks: {', '.join(sorted(TASKS))}")
    cls = TASKS[name]
    hints = typing.get_type_hints(cls)
    knobs = {field.name for field in dataclasses.fields(cls)}
    kwargs = {}
    for key, raw in (options or {}).items():
        if key not in knobs:
            raise ValueError(f"task {name} has no knob {key!r}; knobs: {', '.join(sorted(knobs))}")
        kwargs[key] = hints[key](raw)
    return cls(**kwargs)


def write_task(task: Any, out_dir: str | Path, train_size: int, val_size: int, seed: int) -> dict[str, Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    val = unique_problems(task, rng, val_size, exclude=set())
    train = unique_problems(task, rng, train_size, exclude={question for question, _ in val})
    paths = {}
    for split, problems in (("train", train), ("val", val)):
        rows = [task.make_row(question, answer, split, index) for index, (question, answer) in enumerate(problems)]
        paths[split] = out_dir / f"{split}.parquet"
        parquet.write_table(pa.Table.from_pylist(rows), paths[split])
    return paths


def unique_problems(task: Any, rng: np.random.Generator, count: int, exclude: set[str]) -> list[tuple[str, str]]:
    problems, seen = [], set(exclude)
    attempts = 0
    while len(problems) < count:
        attempts += 1
        if attempts > 50 * count + 1000:
            raise ValueError(f"{task} has fewer than {count} distinct problems; make it harder or ask for fewer")
        question, answer = task.make_problem(rng)
        if question not in seen:
            seen.add(question)
            problems.append((question, answer))
    return problems
