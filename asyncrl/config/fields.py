"""A dataclass field with a help text, range bounds or a registry of valid names, read by the loader and the
docs generator.

    lr: float = option(1e-6, "peak learning rate", ge=0.0)
    adv_estimator: str = option("grpo", "advantage estimator", choices=ADVANTAGE_ESTIMATORS)

Bounds and choices are checked by `asyncrl.config.loader` when a config is built, so an out-of-range value or
an unregistered name fails with its full dotted key before any work starts. A field's choices are the
registry itself, read when the config is built: a name registered by the user's own code is valid.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from asyncrl.algos import Registry


def option(default: Any, help: str, *, ge: float | None = None, gt: float | None = None,
           le: float | None = None, lt: float | None = None, choices: Optional[Registry] = None) -> Any:
    """A config field: `default` (a list or dataclass default is copied per instance), its help, bounds and
    the registry its value names an entry of."""
    metadata = {"help": help, "ge": ge, "gt": gt, "le": le, "lt": lt, "choices": choices}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=metadata)
    if dataclasses.is_dataclass(default) and isinstance(default, type):
        return dataclasses.field(default_factory=default, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def section(cls: type, help: str) -> Any:
    """A nested config section built from its own defaults."""
    return dataclasses.field(default_factory=cls, metadata={"help": help})


def bounds_text(field: dataclasses.Field) -> str:
    """Human-readable bounds of a field, e.g. '>= 0, <= 1' (empty when unbounded)."""
    parts = []
    for key, symbol in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
        bound = field.metadata.get(key)
        if bound is not None:
            parts.append(f"{symbol} {bound}")
    return ", ".join(parts)
