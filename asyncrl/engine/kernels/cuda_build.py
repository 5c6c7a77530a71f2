"""Builds the engine's CUDA C++ extensions (`csrc/`) with torch's extension builder, once per machine.

    module = build_extension("asyncrl_paged_decode", entry, declaration, ["paged_decode"])

nvcc and ninja come from the CUDA toolkit torch was built against; the build lands in torch's extension cache.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from types import ModuleType

SOURCES = Path(__file__).with_name("csrc")
# A build takes 1-2 minutes; a build lock older than this was left by a build that was killed, and torch's builder
# would wait for it to go away forever.
STALE_LOCK_SECONDS = 900.0


def build_extension(name: str, entry: Path, declaration: str, functions: list[str],
                    cuda_flags: tuple[str, ...] = ()) -> ModuleType:
    """Compiles `entry` (which includes headers from `csrc/`) and binds `functions`, declared in `declaration`.
    `cuda_flags` with an `-gencode` replace torch's default architecture flags."""
    from torch.utils.cpp_extension import load_inline
    versioned = versioned_name(name)
    wait_for_build_lock(versioned)
    return load_inline(name=versioned, cpp_sources=declaration, cuda_sources=entry.read_text(),
                       functions=functions, extra_cuda_cflags=["-O3", *cuda_flags],
                       extra_include_paths=[str(SOURCES)], verbose=False)


def versioned_name(name: str) -> str:
    """The extension's name in torch's cache: `name` and a hash of every source. torch's cache keys on the entry's
    text alone, so an edited kernel header would otherwise load a stale build."""
    digest = hashlib.sha256(b"".join(path.read_bytes() for path in sorted(SOURCES.glob("*.cu*")))).hexdigest()[:12]
    return f"{name}_{digest}"


def wait_for_build_lock(name: str, stale_after: float = STALE_LOCK_SECONDS, poll_seconds: float = 1.0) -> None:
    """Returns once no build of extension `name` holds its lock (another process building it: wait for it); raises,
    naming the lock file, where the lock is older than `stale_after` seconds. torch's builder waits on a lock for as
    long as it exists, so a build killed midway (Ctrl-C, a timeout) would otherwise hang every later start."""
    from torch.utils.cpp_extension import _get_build_directory
    lock = Path(_get_build_directory(name, verbose=False)) / "lock"
    while True:
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            return
        if age > stale_after:
            raise RuntimeError(f"the build of CUDA extension {name} is locked by {lock}, {age:.0f} s old: a build "
                               f"that was interrupted left it. Delete that file (no other process is building the "
                               f"extension after this long) and start again")
        time.sleep(poll_seconds)
