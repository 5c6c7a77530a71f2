"""The package's layering, read from its source with `ast`: no import cycle between modules, and no module
imports from a room above its own. The order of the rooms is declared once, here, bottom up; a room may
import its own modules and any room of a lower layer, never a room of its own layer or above.

Every import counts, wherever it sits (a function's body, a TYPE_CHECKING block), and `from package import
name` counts as an import of the submodule `package.name` when there is one. The fast paths' rooms
(`engine/kernels/`, `train/fast/`) may import their readable core; the core reaches them only through
the room's selector.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "asyncrl"

# Bottom up. A room is a sub-package or a top-level module of asyncrl.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("registry",),                        # the one Registry every seam declares; imports nothing of asyncrl
    ("algos", "telemetry", "remote"),    # pure tensor functions; metrics and traces; named waits on Ray actors
    ("config",),                          # reads the algorithm registries for validation
    ("models", "data"),
    ("engine",),
    ("rewards", "train"),                 # a generative judge runs on the engine
    ("rollout", "teacher"),               # backends: the engine, Ray replicas, weight sync; the distillation teacher
    ("serving",),                         # `asyncrl serve` over the engine; recording endpoints sit on it
    ("core",),                            # the PPO stages over a trainer group and a rollout backend
    ("recipes",),
    ("launch",),                          # the composition root
    ("bench",),
    ("cli",),
)
# (room, its fast-path sub-room, the one module of the room that may import the sub-room)
FAST_ROOMS = (("engine", "engine.kernels", "engine.model_runner"),
              ("train", "train.fast", "train.worker"),
              ("train", "train.fast", "train.forward"))
ROOT_MODULES = frozenset({"asyncrl"})  # the package's own __init__ (version only)


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules(root: Path = PACKAGE_ROOT) -> dict[str, Path]:
    return {module_name(path, root): path for path in sorted(root.rglob("*.py"))}


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules `name` imports: `import a.b`, `from a import b` (b a module or a name of a), relative
    imports resolved against `name`'s package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    imported: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        imported |= {target for target in targets if target in known}
    return imported


def import_graph(root: Path = PACKAGE_ROOT) -> dict[str, set[str]]:
    modules = package_modules(root)
    known = set(modules)
    return {name: imported_modules(name, path, known) - {name} for name, path in modules.items()}


def room_of(module: str) -> str:
    return module.split(".")[1] if "." in module else module


def layer_of(room: str) -> int:
    for index, rooms in enumerate(LAYERS):
        if room in rooms:
            return index
    raise AssertionError(f"room {room!r} has no layer: add it to LAYERS in {__file__}")


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """'a imports b' for every import of a module of the same layer's other room or of a layer above."""
    problems = []
    for module, imports in sorted(graph.items()):
        if module in ROOT_MODULES:
            continue
        room = room_of(module)
        for target in sorted(imports):
            target_room = room_of(target)
            if target in ROOT_MODULES or target_room == room:
                continue
            if layer_of(target_room) >= layer_of(room):
                problems.append(f"{module} (layer {layer_of(room)}) imports {target} (layer {layer_of(target_room)})")
    return problems


def fast_room_leaks(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a fast-path sub-room from its readable core other than through the room's selector."""
    problems = []
    for room, sub_room, _ in FAST_ROOMS:
        allowed = {gate for gate_room, gate_sub_room, gate in FAST_ROOMS if gate_sub_room == sub_room}
        inside = f"asyncrl.{sub_room}"
        for module, imports in sorted(graph.items()):
            is_core = module.startswith(f"asyncrl.{room}") and not module.startswith(inside)
            if not is_core or module.removeprefix("asyncrl.") in allowed:
                continue
            problems += [f"{module} imports {target}" for target in sorted(imports)
                         if target.startswith(inside) and target != inside]
    return sorted(set(problems))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    lowlink: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = lowlink[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                lowlink[node] = min(lowlink[node], lowlink[target])
            elif target in on_stack:
                lowlink[node] = min(lowlink[node], index[target])
        if lowlink[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_every_room_has_a_layer(graph):
    rooms = {room_of(module) for module in graph if module not in ROOT_MODULES}
    declared = {room for rooms_of_layer in LAYERS for room in rooms_of_layer}
    assert rooms - declared == set(), "rooms without a layer"


def test_no_module_imports_from_a_room_above_its_own(graph):
    assert upward_imports(graph) == []


def test_the_fast_paths_are_reached_only_through_their_selector(graph):
    assert fast_room_leaks(graph) == []


def test_the_package_has_no_import_cycle(graph):
    assert cycles(graph) == []


def test_the_checks_catch_a_planted_upward_import_and_a_cycle(tmp_path):
    """The same checks on a copy of the package, with `algos` importing the CLI (upward, and with the CLI's own
    imports of lower rooms, a cycle) and the engine core importing a kernel directly."""
    copy = tmp_path / "asyncrl"
    for name, path in package_modules().items():
        target = copy / path.relative_to(PACKAGE_ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(path.read_text())
    (copy / "algos" / "__init__.py").write_text("from asyncrl.cli import main\n" +
                                                (copy / "algos" / "__init__.py").read_text())
    (copy / "engine" / "scheduler.py").write_text("from asyncrl.engine.kernels import cuda_graph\n" +
                                                 (copy / "engine" / "scheduler.py").read_text())
    planted = import_graph(copy)
    assert "asyncrl.algos (layer 1) imports asyncrl.cli (layer 12)" in upward_imports(planted)
    assert any("asyncrl.algos" in component and "asyncrl.cli" in component for component in cycles(planted))
    assert "asyncrl.engine.scheduler imports asyncrl.engine.kernels.cuda_graph" in fast_room_leaks(planted)
