"""A registry of one family of named entries (an advantage estimator, a policy loss, a rollout backend, a tool,
a tool-call format...): each entry is a function or class plus its own metadata, registered next to its
definition with one spelling, the decorator.

    @ADVANTAGE_ESTIMATORS.register("grpo", needs_groups=True, summary="(r - group mean) / group std")
    def grpo(token_level_rewards, response_mask, group_ids, knobs=AdvantageKnobs(), *, values=None, ...): ...

    KL_ESTIMATORS.register("kl", summary="another name for k1")(k1)   # an alias, or an entry made in a loop

    ADVANTAGE_ESTIMATORS["grpo"](rewards, mask, group_ids, ...)    # the function, called as before
    ADVANTAGE_ESTIMATORS.spec("grpo").needs_groups                  # what it needs, read by config validation

Every entry of one registry has the same signature, so a call site is one line. The family's record type
(a frozen dataclass deriving from `Entry`) says which metadata an entry carries; a registration that names a
field the record does not have is a TypeError at import. Config validation, the schema's help and
docs/configuration.md read names and metadata from here, so a new estimator, loss or backend is one definition
and one registration, from any module. An unknown name raises ValueError naming the closest registered one.

This module is the ground floor: it imports nothing of asyncrl, so every room may declare a registry. A config
key that chooses from a registry declared above the config tree names it by its family
(`registry_named("rollout backend")`), read once the registry's module is imported.
"""

import difflib
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Iterator, TypeVar

# Entries whose function or class is defined in this package are the ones asyncrl ships (and documents).
PACKAGE_PREFIX = "asyncrl."


@dataclass(frozen=True)
class Entry:
    """What every registered function carries. A family's record adds fields whose metadata "column" titles
    them in the generated reference."""

    name: str
    fn: Callable[..., Any]
    summary: str  # one line for the reference: what the entry computes


S = TypeVar("S", bound=Entry)
F = TypeVar("F", bound=Callable[..., Any])


def column(title: str, default: Any) -> Any:
    """A metadata field of a family's record, titled `title` in the generated reference."""
    return field(default=default, metadata={"column": title})


class Registry(Mapping[str, Callable[..., Any]], Generic[S]):
    """name -> function, in registration order, with each entry's record behind `spec(name)`."""

    def __init__(self, family: str, record: type[S], plural: str = ""):
        if family in FAMILIES:
            raise ValueError(f"a registry of {family!r} already exists ({FAMILIES[family]!r})")
        self.family = family  # "advantage estimator": used in messages and headings
        self.plural = plural or f"{family}s"
        self.record = record
        self._specs: dict[str, S] = {}
        FAMILIES[family] = self

    def register(self, name: str, **metadata: Any) -> Callable[[F], F]:
        """Decorator: registers the function (or class) under `name` with `metadata` (the record's fields) and
        returns it unchanged. A name is registered once (a second registration would silently replace what
        every config naming it runs)."""

        def decorator(fn: F) -> F:
            if name in self._specs:
                existing = self._specs[name].fn
                raise ValueError(f"{self.family} {name!r} is already registered "
                                 f"(by {existing.__module__}.{existing.__qualname__})")
            self._specs[name] = self.record(name=name, fn=fn, **metadata)
            return fn

        return decorator

    def spec(self, name: str) -> S:
        """The record of `name`: its function and metadata."""
        if name not in self._specs:
            raise ValueError(self.unknown_name_message(name))
        return self._specs[name]

    def specs(self) -> list[S]:
        """Every record, in registration order."""
        return list(self._specs.values())

    def builtin_specs(self) -> list[S]:
        """The records asyncrl ships (their function or class is defined in asyncrl), in registration order: what
        the generated reference lists, so that it does not depend on what a process registered besides."""
        return [spec for spec in self._specs.values() if spec.fn.__module__.startswith(PACKAGE_PREFIX)]

    def unknown_name_message(self, name: Any) -> str:
        """'unknown advantage estimator 'grpp'; did you mean 'grpo'? valid names: gae, grpo, ...'."""
        close = difflib.get_close_matches(str(name), list(self._specs), n=1, cutoff=0.5)  # the config keys' cutoff
        hint = f"; did you mean {close[0]!r}?" if close else ";"
        return f"unknown {self.family} {name!r}{hint} valid names: {', '.join(self._specs)}"

    def __getitem__(self, name: str) -> Callable[..., Any]:
        return self.spec(name).fn

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def __repr__(self) -> str:
        return f"Registry({self.family!r}: {', '.join(self._specs)})"


# Every live registry by family: a registry lives as long as the module that declares it (a test's own dies with
# the test), so a family is declared once at a time.
FAMILIES: "weakref.WeakValueDictionary[str, Registry]" = weakref.WeakValueDictionary()


def registry_named(family: str) -> Registry:
    """The registry of `family` (its declaring module must have been imported)."""
    if family not in FAMILIES:
        raise LookupError(f"no registry of {family!r} is loaded (loaded: {', '.join(sorted(FAMILIES))}); import "
                          f"the module that declares it first")
    return FAMILIES[family]
