"""Builds the engine's CUDA C++ extensions (`csrc/`) with torch's extension builder, once per machine.

    module = build_extension("asyncrl_paged_decode", entry, declaration, ["paged_decode"])

nvcc and ninja come from the CUDA toolkit torch was built against; the build lands in torch's extension cache.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import ModuleType

SOURCES = Path(__file__).with_name("csrc")


def build_extension(name: str, entry: Path, declaration: str, functions: list[str],
                    cuda_flags: tuple[str, ...] = ()) -> ModuleType:
    """Compiles `entry` (which includes headers from `csrc/`) and binds `functions`, declared in `declaration`.
    `cuda_flags` with an `-gencode` replace torch's default architecture flags."""
    from torch.utils.cpp_extension import load_inline
    # The name carries a hash of every source: torch's cache keys on the entry's text alone, so an edited kernel
    # header would otherwise load a stale build.
    digest = hashlib.sha256(b"".join(path.read_bytes() for path in sorted(SOURCES.glob("*.cu*")))).hexdigest()[:12]
    return load_inline(name=f"{name}_{digest}", cpp_sources=declaration, cuda_sources=entry.read_text(),
                       functions=functions, extra_cuda_cflags=["-O3", *cuda_flags],
                       extra_include_paths=[str(SOURCES)], verbose=False)
