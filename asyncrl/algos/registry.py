"""A name -> function table for one family of algorithms (advantage estimators, policy losses, KL types).

Every entry of one registry has exactly the same signature, so a call site is one line,
``POLICY_LOSSES[name](...)``. An unknown name raises ``ValueError`` listing the valid names instead of a bare
``KeyError`` deep in the training loop.
"""

from typing import Callable, Optional


class Registry(dict):
    """A dict of name -> function whose lookup of an unknown name raises ValueError with the valid names.

    ``host_reads``, for a family that runs on the device every step (the policy losses), names the entries that
    read a device value on the host (on a GPU, a wait for every queued kernel at each call), each with why it
    must; the family's other entries never do, which `tests/algos` checks on the meta device."""

    def __init__(self, family: str, entries: dict[str, Callable], host_reads: Optional[dict[str, str]] = None):
        super().__init__(entries)
        self.family = family
        self.host_reads = host_reads or {}
        unknown = sorted(set(self.host_reads) - set(entries))
        if unknown:
            raise ValueError(f"{family} host_reads names entries that are not registered: {', '.join(unknown)}")

    def __missing__(self, name: str):
        raise ValueError(f"unknown {self.family} {name!r}; valid names: {', '.join(sorted(self))}")
