"""Where benchmark results go, and how: JSON lines, each run appending one line, so a file collects a series of runs.

    path = append_result(options.output, result)      # options.output defaults to default_output("trainer.jsonl")
    print(f"appended the result to {path.resolve()}")

Unless told otherwise (`--output`, `--results-dir`), a benchmark writes under `outputs/bench/` of the current
directory: never into the source tree, whose `outputs/` is git-ignored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OUTPUT_DIR = Path("outputs") / "bench"


def default_output(name: str) -> Path:
    """`outputs/bench/<name>` under the current directory."""
    return OUTPUT_DIR / name


def append_result(path: str | Path, result: dict[str, Any]) -> Path:
    """Appends `result` to `path` as one JSON line, creating its folder; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        handle.write(json.dumps(result) + "\n")
    return path
