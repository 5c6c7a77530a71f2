"""Build an `AsyncRLConfig` from a YAML file plus dotted overrides, checking every key and value.

    cfg = load_config("run.yaml", ["actor.optim.lr=1e-5", "trainer.mode=fully_async"])

Errors are `ConfigError` (a ValueError) naming the dotted key, the bad value and what is allowed; for an
unknown key or an unregistered algorithm name, the closest valid one. Every float must be finite (NaN and
infinities are refused whatever the key) and every int must fit in 64 bits; each field's own bounds come
from its metadata (`fields.option`). A named preset (`algorithm.rollout_correction.preset`) first fills the keys
of its section that the file and the overrides left unset. Cross-field invariants run last (`invariants.check_invariants`). What
the machine decides (a CUDA device, a resume folder) is checked later, before Ray starts
(`environment.check_environment`).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from asyncrl.algos import ROLLOUT_CORRECTION_PRESETS
from asyncrl.config.errors import ConfigError
from asyncrl.config.fields import bounds_text, is_within_bounds
from asyncrl.config.invariants import check_invariants, resolve_critic
from asyncrl.config.schema import AsyncRLConfig
from asyncrl.config.yaml_reader import load_yaml, read_yaml
from asyncrl.registry import Registry, registry_named

# Every integer reaches torch or numpy as an int64 somewhere (seeds, sizes, counts).
MAX_INT = 2**63 - 1


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                check: bool = True) -> AsyncRLConfig:
    """Defaults <- YAML file <- `key=value` overrides, then type, range and invariant checks."""
    tree: dict[str, Any] = {}
    if path is not None:
        tree = read_yaml(Path(path))
    for override in overrides or []:
        key, value = parse_override(override)
        set_dotted(tree, key, value)
    apply_correction_preset(tree)
    config = build_dataclass(AsyncRLConfig, tree, prefix="")
    if check:
        check_invariants(config)
    resolve_critic(config)
    return config


def parse_override(text: str) -> tuple[str, Any]:
    """'actor.optim.lr=1e-5' -> ('actor.optim.lr', '1e-5' parsed as YAML)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} must look like key.path=value")
    try:
        value = load_yaml(raw, f"override {text!r}") if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    node = tree
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {key}: {part} is a value, not a section")
        node = child
    node[parts[-1]] = value


def apply_correction_preset(tree: dict[str, Any]) -> None:
    """Fill algorithm.rollout_correction from its `preset`: the preset's settings first, keys set explicitly win."""
    section: Any = tree
    for part in ("algorithm", "rollout_correction"):
        section = section.get(part) if isinstance(section, dict) else None
    if not isinstance(section, dict) or section.get("preset") is None:
        return  # no preset (a section that is no mapping fails in build_dataclass, naming its key)
    name = section["preset"]
    if name not in ROLLOUT_CORRECTION_PRESETS:
        raise ConfigError(
            f"algorithm.rollout_correction.preset: {ROLLOUT_CORRECTION_PRESETS.unknown_name_message(name)}")
    for key, value in ROLLOUT_CORRECTION_PRESETS.spec(name).settings().items():
        section.setdefault(key, value)


def build_dataclass(cls: type, values: dict[str, Any], prefix: str) -> Any:
    """Instantiate `cls` from a (partial) mapping, recursing into nested sections."""
    if not isinstance(values, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a mapping, got {values!r}")
    fields = {field.name: field for field in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for name in values:
        if name not in fields:
            raise ConfigError(unknown_key_message(prefix + str(name), list(fields), prefix))
    kwargs = {}
    for name, value in values.items():
        key = prefix + name
        kwargs[name] = coerce(hints[name], value, key)
        check_bounds(fields[name], kwargs[name], key)
        check_choice(fields[name], kwargs[name], key)
    return cls(**kwargs)


def unknown_key_message(key: str, valid_names: list[str], prefix: str) -> str:
    name = key[len(prefix):]
    close = difflib.get_close_matches(name, valid_names, n=1, cutoff=0.5)
    hint = f"; did you mean {prefix}{close[0]}?" if close else f"; valid keys here: {', '.join(sorted(valid_names))}"
    return f"unknown config key {key}{hint}"


def coerce(annotation: Any, value: Any, key: str) -> Any:
    """Check `value` against a type annotation; return it converted (int -> float, section -> dataclass)."""
    origin = typing.get_origin(annotation)
    if dataclasses.is_dataclass(annotation):
        return build_dataclass(annotation, value, key + ".")
    if origin in (Union, types.UnionType):
        options = typing.get_args(annotation)
        if value is None and type(None) in options:
            return None
        errors = []
        for option_type in options:
            if option_type is type(None):
                continue
            try:
                return coerce(option_type, value, key)
            except ConfigError as error:
                errors.append(str(error))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: {value!r} matches none of {annotation}")
    if origin is Literal:
        choices = typing.get_args(annotation)
        if value not in choices:
            raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(repr, choices))}")
        return value
    if origin is list:
        if not isinstance(value, list):
            value = [value] if isinstance(value, (str, int, float)) and not isinstance(value, bool) else value
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (item_type,) = typing.get_args(annotation)
        return [coerce(item_type, item, f"{key}[{index}]") for index, item in enumerate(value)]
    return coerce_scalar(annotation, value, key)


def coerce_scalar(annotation: type, value: Any, key: str) -> Any:
    if annotation is bool:
        if isinstance(value, bool):
            return value
    elif annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            if abs(value) > MAX_INT:
                raise ConfigError(f"{key}: {value} does not fit in a 64-bit integer (at most {MAX_INT} either way)")
            return value
    elif annotation is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            # YAML 1.1 reads '1e-5' (no dot) as a string; accept any float spelling.
            try:
                number = float(value)
            except ValueError:
                pass
        if number is not None:
            if not math.isfinite(number):
                # NaN passes no comparison and inf every upper-unbounded one: neither means anything as a
                # setting, and both would surface only in a worker, as a NaN loss or a wait that never ends.
                raise ConfigError(f"{key}: {number} is not a finite number; every float setting must be finite")
            return number
    elif annotation is str:
        if isinstance(value, str):
            return value
    else:
        raise TypeError(f"unsupported config annotation {annotation} at {key}")
    hint = ""
    if annotation is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        hint = f"; YAML reads a bare number as a number: quote it, {key}='\"{value}\"'"
    raise ConfigError(f"{key}: expected {annotation.__name__}, got {value!r} ({type(value).__name__}){hint}")


def check_bounds(field: dataclasses.Field, value: Any, key: str) -> None:
    """A number against its field's bounds; a list's bounds hold for each of its items."""
    if isinstance(value, list):
        for index, item in enumerate(value):
            check_bounds(field, item, f"{key}[{index}]")
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    if not is_within_bounds(field, value):
        raise ConfigError(f"{key}: {value!r} is out of range, must be {bounds_text(field)}")


def check_choice(field: dataclasses.Field, value: Any, key: str) -> None:
    """A value that names a registry entry must name a registered one (None stays None where allowed). A
    registry named by its family is declared above the config tree: `check_named_choices` checks it later."""
    registry = field.metadata.get("choices")
    if isinstance(registry, Registry):
        check_registered(registry, field, value, key)


def check_registered(registry: Registry, field: dataclasses.Field, value: Any, key: str) -> None:
    if value is not None and value not in field.metadata["also_allowed"] and value not in registry:
        raise ConfigError(f"{key}: {registry.unknown_name_message(value)}")


def check_named_choices(config: Any, prefix: str = "") -> None:
    """Every key whose registry is named by its family (declared above the config tree) names a registered
    entry: run at pre-flight, once the modules that declare those registries are imported."""
    for field in dataclasses.fields(config):
        value, key = getattr(config, field.name), prefix + field.name
        if dataclasses.is_dataclass(value):
            check_named_choices(value, key + ".")
        elif isinstance(field.metadata.get("choices"), str):
            check_registered(registry_named(field.metadata["choices"]), field, value, key)


def config_to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


def dump_config(config: Any) -> str:
    """The resolved config as YAML, sections in declaration order."""
    return yaml.safe_dump(config_to_dict(config), sort_keys=False, default_flow_style=False)
