"""The registry of a family of named entries (the ground floor: asyncrl/registry.py): entries carry their own
metadata, stay plain callables, are registered with one spelling, a wrong name fails naming the closest registered
one, and a registry is found by its family."""

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from asyncrl.algos import (
    ADVANTAGE_ESTIMATORS,
    CORRECTION_LEVELS,
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    REJECTION_LEVELS,
    ROLLOUT_CORRECTION_PRESETS,
)
from asyncrl.algos.masked import masked_mean, masked_sum
from asyncrl.registry import Entry, Registry, column, registry_named

PACKAGE = Path(__file__).resolve().parents[2] / "asyncrl"
ALGOS = PACKAGE / "algos"


@dataclass(frozen=True)
class ToySpec(Entry):
    is_sharp: bool = column("sharp", False)


def double(x):
    return 2 * x


def test_a_registered_function_is_returned_unchanged_and_called_by_name():
    registry = Registry("toy", ToySpec)
    decorated = registry.register("double", is_sharp=True, summary="2x")(double)
    assert decorated is double
    assert registry["double"](21) == 42
    spec = registry.spec("double")
    assert (spec.name, spec.fn, spec.summary, spec.is_sharp) == ("double", double, "2x", True)
    registry.register("twice", summary="2x again")(double)
    assert registry.spec("twice").is_sharp is False  # the record's default
    assert list(registry) == ["double", "twice"] and len(registry) == 2 and dict(registry) == {
        "double": double, "twice": double}
    assert "double" in registry and "triple" not in registry


def test_metadata_the_record_does_not_have_fails_at_registration():
    registry = Registry("toy", ToySpec)
    with pytest.raises(TypeError, match="is_blunt"):
        registry.register("double", summary="2x", is_blunt=True)(double)
    with pytest.raises(TypeError, match="summary"):
        registry.register("double")(double)
    assert "double" not in registry


def test_a_name_is_registered_once():
    registry = Registry("toy", ToySpec)
    registry.register("double", summary="2x")(double)
    with pytest.raises(ValueError, match=r"toy 'double' is already registered \(by .*test_registry\.double\)"):
        registry.register("double", summary="would replace it")(lambda x: x)
    assert registry["double"] is double


def test_an_unknown_name_names_the_closest_registered_one_or_lists_them_all():
    registry = Registry("toy", ToySpec)
    registry.register("double", summary="2x")(double)
    registry.register("triple", summary="3x")(double)
    with pytest.raises(ValueError, match=r"^unknown toy 'doubel'; did you mean 'double'\? valid names: double, triple$"):
        registry["doubel"]
    with pytest.raises(ValueError, match=r"^unknown toy 'zzz'; valid names: double, triple$"):
        registry.spec("zzz")


def test_builtin_specs_are_the_entries_defined_in_asyncrl():
    registry = Registry("toy", ToySpec)
    registry.register("mean", summary="from asyncrl.algos")(masked_mean)
    registry.register("double", summary="from this test")(double)
    registry.register("sum", summary="from asyncrl.algos")(masked_sum)
    assert [spec.name for spec in registry.builtin_specs()] == ["mean", "sum"]
    assert [spec.name for spec in registry.specs()] == ["mean", "double", "sum"]


@pytest.mark.parametrize("registry", [ADVANTAGE_ESTIMATORS, POLICY_LOSSES, KL_ESTIMATORS, LOSS_AGG_MODES,
                                      CORRECTION_LEVELS, REJECTION_LEVELS, ROLLOUT_CORRECTION_PRESETS],
                         ids=lambda registry: registry.family)
def test_every_shipped_entry_has_a_summary(registry):
    assert registry.builtin_specs() and all(spec.summary for spec in registry.builtin_specs())


def test_algos_imports_nothing_but_torch_and_the_standard_library():
    allowed = {"torch", "asyncrl"} | set(sys.stdlib_module_names)
    for path in sorted(ALGOS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                roots = [(node.module or "").split(".")[0]]
                if roots == ["asyncrl"]:   # its own modules, and the ground floor's registry
                    assert node.module.startswith("asyncrl.algos") or node.module == "asyncrl.registry", \
                        f"{path.name} imports {node.module}"
            else:
                continue
            assert set(roots) <= allowed, f"{path.name} imports {roots}"


def test_a_registry_is_found_by_its_family_once_declared_and_a_family_is_declared_once():
    registry = Registry("toy", ToySpec)
    assert registry_named("toy") is registry and registry_named("advantage estimator") is ADVANTAGE_ESTIMATORS
    with pytest.raises(ValueError, match="a registry of 'toy' already exists"):
        Registry("toy", ToySpec)
    with pytest.raises(LookupError, match="no registry of 'toy tool' is loaded"):
        registry_named("toy tool")


def test_the_registry_is_the_ground_floor_and_has_one_registration_spelling():
    source = (PACKAGE / "registry.py").read_text()
    imported = {node.module for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom)}
    assert not any((module or "").startswith("asyncrl") for module in imported)
    assert not hasattr(Registry, "add")
