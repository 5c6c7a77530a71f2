"""A name -> function table for one family of algorithms (advantage estimators, policy losses, KL types).

Every entry of one registry has exactly the same signature, so a call site is one line,
``POLICY_LOSSES[name](...)``. An unknown name raises ``ValueError`` listing the valid names instead of a bare
``KeyError`` deep in the training loop.
"""

from typing import Callable


class Registry(dict):
    """A dict of name -> function whose lookup of an unknown name raises ValueError with the valid names."""

    def __init__(self, family: str, entries: dict[str, Callable]):
        super().__init__(entries)
        self.family = family

    def __missing__(self, name: str):
        raise ValueError(f"unknown {self.family} {name!r}; valid names: {', '.join(sorted(self))}")
