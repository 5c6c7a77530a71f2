"""Optional OS limits of a scoring process, set in the process itself (Linux).

    limits = ScoringLimits(max_memory_mb=2048, max_cpu_s=30)
    limit_memory(limits.max_memory_mb)   # once, before the reward function is loaded
    limit_cpu(limits.max_cpu_s)          # before each sample
"""

from __future__ import annotations

import math
import resource
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class ScoringLimits:
    """Optional OS limits of each scoring process (None: no limit).

    `max_memory_mb` is memory the process may allocate beyond what it holds when it starts loading the
    reward function (the interpreter and the main module spawning re-imported), so one value fits a small
    script and a driver that imported torch alike; the reward module's own imports count against it. It is
    RLIMIT_DATA (private writable memory: heap, anonymous mmap, thread stacks) rather than RLIMIT_AS, which
    also counts address space that threads' malloc arenas reserve but never touch and would fail threaded
    scorers that use little memory. Past it, an allocation raises MemoryError in the function.
    `max_cpu_s` is CPU seconds per sample (RLIMIT_CPU, raised before each sample); past it the kernel stops
    the process with SIGXCPU, the sample scores 0 and the process is replaced. It catches a scorer that
    burns CPU on many threads well within `timeout_s` of wall time.
    """
    max_memory_mb: Optional[float] = None
    max_cpu_s: Optional[float] = None

    def __post_init__(self):
        for name, value in (("max_memory_mb", self.max_memory_mb), ("max_cpu_s", self.max_cpu_s)):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"reward scoring limit {name} must be a positive number or None, got {value}")


def limit_memory(max_memory_mb: Optional[float]) -> None:
    if max_memory_mb is None:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = data_bytes() + int(max_memory_mb * 2 ** 20)
    resource.setrlimit(resource.RLIMIT_DATA, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))


def data_bytes() -> int:
    """What RLIMIT_DATA measures now: VmData of /proc/self/status."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmData:"))
    return int(line.split()[1]) * 1024


def limit_cpu(max_cpu_s: Optional[float]) -> None:
    """RLIMIT_CPU counts the process's whole life, so each sample gets the time used so far plus its own."""
    if max_cpu_s is None:
        return
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(usage.ru_utime + usage.ru_stime + max_cpu_s)
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))
    # SIGXCPU's default action dumps core; a scorer over its limit should leave no core file behind.
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
