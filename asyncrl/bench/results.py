"""Benchmark results as JSON lines: each run appends one line, so a file collects a series of runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def append_result(path: str | Path, result: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        handle.write(json.dumps(result) + "\n")
