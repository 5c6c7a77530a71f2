"""The trainer's two rooms: the worker, the losses and the readable forward reach the speed paths only through
`fast/selection.py`, the speed paths never import what drives an update, and importing the trainer loads no triton
(CPU installs may lack it)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import asyncrl.train

TRAIN = Path(asyncrl.train.__file__).parent
# What drives an update: the room below may use the core's records, losses and LM head, never these.
DRIVERS = {"asyncrl.train", "asyncrl.train.worker", "asyncrl.train.actor", "asyncrl.train.critic",
           "asyncrl.train.forward", "asyncrl.train.sft"}


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, at its top or inside a function (`from a import b` counts as a and a.b)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_core_reaches_the_speed_paths_only_through_the_selector():
    for path in TRAIN.glob("*.py"):
        fast_imports = {name for name in imported_modules(path) if name.startswith("asyncrl.train.fast")}
        assert {name.split(".")[3] for name in fast_imports} <= {"selection"}, path.name
    assert "asyncrl.train.fast.selection" in imported_modules(TRAIN / "worker.py")
    assert "asyncrl.train.fast.selection" in imported_modules(TRAIN / "forward.py")


def test_the_speed_paths_import_no_driver_of_the_core():
    for path in (TRAIN / "fast").glob("*.py"):
        assert imported_modules(path).isdisjoint(DRIVERS), path.name


def test_importing_the_trainer_loads_no_triton():
    code = "import sys, asyncrl.train; print(sorted(m for m in sys.modules if m.split('.')[0] == 'triton'))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert result.stdout.strip() == "[]"
