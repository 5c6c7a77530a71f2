"""The engine's two rooms: the readable core reaches its kernels only through `kernels/selection.py`, the kernels
never import the core's driving parts, and importing the engine loads no triton (CPU installs may lack it)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import asyncrl.engine

ENGINE = Path(asyncrl.engine.__file__).parent
# What drives a step: the room below may use the core's records and reference paths, never these.
DRIVERS = {"asyncrl.engine", "asyncrl.engine.llm_engine", "asyncrl.engine.async_engine", "asyncrl.engine.model_runner",
           "asyncrl.engine.scheduler", "asyncrl.engine.block_manager"}


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


def test_the_core_reaches_the_kernels_only_through_the_selector():
    kernel_imports = {path.name: {name for name in imported_modules(path) if name.startswith("asyncrl.engine.kernels")}
                      for path in ENGINE.glob("*.py")}
    assert {name: modules for name, modules in kernel_imports.items() if modules} == {
        "model_runner.py": {"asyncrl.engine.kernels.selection", "asyncrl.engine.kernels.selection.select_kernels"}}


def test_the_kernels_import_no_driver_of_the_core():
    for path in (ENGINE / "kernels").glob("*.py"):
        assert imported_modules(path).isdisjoint(DRIVERS), path.name


def test_importing_the_engine_loads_no_triton():
    code = "import sys, asyncrl.engine; print(sorted(m for m in sys.modules if m.split('.')[0] == 'triton'))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert result.stdout.strip() == "[]"
