"""A dataclass field with a help text, range bounds or a registry of valid names, read by the loader and the
docs generator.

    lr: float = option(1e-6, "peak learning rate", ge=0.0)
    top_k: int = option(-1, "top-k sampling; -1 disables", ge=1, also_allowed=(-1,))
    betas: list[float] = option([0.9, 0.999], "AdamW betas", ge=0.0, lt=1.0)      # bounds of every item
    adv_estimator: str = option("grpo", "advantage estimator", choices=ADVANTAGE_ESTIMATORS)
    backend: str = option("auto", "rollout backend", choices="rollout backend", also_allowed=("auto",))

Bounds and choices are checked by `asyncrl.config.loader` when a config is built, so an out-of-range value or
an unregistered name fails with its full dotted key before any work starts. A registry declared above the config
tree (a rollout backend, a tool-call format: their entries live in asyncrl.rollout) is named by its family and
checked by `check_named_choices` at pre-flight, once its module is imported, still before Ray starts. `also_allowed` names the values
that mean something of their own outside the bounds (an "off" value); a list's bounds hold for each item. A
field's choices are the registry itself, read when the config is built: a name registered by the user's own
code is valid. Rules that hold for every field need no metadata: a float is finite, an int fits in 64 bits.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from asyncrl.registry import Registry


def option(default: Any, help: str, *, ge: float | None = None, gt: float | None = None,
           le: float | None = None, lt: float | None = None, also_allowed: tuple[Any, ...] = (),
           choices: Optional[Registry | str] = None) -> Any:
    """A config field: `default` (a list or dataclass default is copied per instance), its help, bounds, the
    values allowed outside them and the registry its value names an entry of (or that registry's family)."""
    metadata = {"help": help, "ge": ge, "gt": gt, "le": le, "lt": lt, "also_allowed": also_allowed,
                "choices": choices}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=metadata)
    if dataclasses.is_dataclass(default) and isinstance(default, type):
        return dataclasses.field(default_factory=default, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def section(cls: type, help: str) -> Any:
    """A nested config section built from its own defaults."""
    return dataclasses.field(default_factory=cls, metadata={"help": help})


BOUND_SYMBOLS = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))


def is_within_bounds(field: dataclasses.Field, value: float) -> bool:
    """Whether a number satisfies every bound of `field`, or is one of its `also_allowed` values."""
    meta = field.metadata
    checks = {"ge": lambda bound: value >= bound, "gt": lambda bound: value > bound,
              "le": lambda bound: value <= bound, "lt": lambda bound: value < bound}
    return value in meta["also_allowed"] or all(
        holds(meta[name]) for name, holds in checks.items() if meta[name] is not None)


def bounds_text(field: dataclasses.Field) -> str:
    """Human-readable bounds of a leaf field, e.g. '>= 0, <= 1' or '-1 or >= 1' (empty when unbounded)."""
    parts = [f"{symbol} {field.metadata[key]}" for key, symbol in BOUND_SYMBOLS if field.metadata[key] is not None]
    allowed = " or ".join(str(value) for value in field.metadata["also_allowed"])
    if allowed and parts:
        return f"{allowed} or {', '.join(parts)}"
    return allowed or ", ".join(parts)
