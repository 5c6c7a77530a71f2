"""Sparse weight deltas: per tensor, only the elements whose bits changed since the last sync.

After a small RL update most bf16 weights keep their value (the update is below bf16's resolution), so a
sync need not move them. Per tensor the sender compares the new weights, cast to the transfer dtype, with
what it sent last time, bit for bit, and picks the smallest of three encodings:

    dense     every element                                      numel x itemsize bytes
    indices   positions of the changed elements + their values   count x (4 or 8) + count x itemsize
    bitmask   one bit per element + the changed values           ceil(numel / 8) + count x itemsize

(an unchanged tensor is `indices` with count 0: no bytes). The receiver writes the values at those
positions in place, so its tensor ends bitwise equal to the sender's: the comparison is on bits, never on
values, so -0.0 against 0.0 or a NaN's payload travel too.

    delta = encode_delta(new_flat, last_flat)           # last_flat None: dense
    blob = delta_blob(delta)                            # the bytes that travel (uint8)
    apply_delta(target_flat, delta.kind, delta.count, blob)
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Optional

import torch
from torch import Tensor

PART_ALIGNMENT = 8  # bytes: every part of a blob, and every blob in a stream, starts at a multiple of this
MAX_INT32_NUMEL = 2 ** 31


class Encoding(IntEnum):
    DENSE = 0
    INDICES = 1
    BITMASK = 2


def align(size: int) -> int:
    return -(-size // PART_ALIGNMENT) * PART_ALIGNMENT


def bits_dtype(dtype: torch.dtype) -> torch.dtype:
    """The integer dtype of the same width: changes are found, and values moved, as bits."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[itemsize]


def index_dtype(numel: int) -> torch.dtype:
    return torch.int32 if numel < MAX_INT32_NUMEL else torch.int64


@dataclass(frozen=True)
class BlobLayout:
    """Where the parts of one tensor's encoded bytes lie: positions (indices or bitmask) at 0, values after."""
    positions_bytes: int
    values_offset: int
    values_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.values_offset + self.values_bytes


def blob_layout(kind: Encoding, count: int, numel: int, itemsize: int) -> BlobLayout:
    """The layout both sides derive from (kind, count) and the plan's shape: nothing else travels."""
    if kind == Encoding.DENSE:
        return BlobLayout(0, 0, numel * itemsize)
    if kind == Encoding.INDICES:
        positions = count * torch.empty((), dtype=index_dtype(numel)).element_size()
    else:
        positions = -(-numel // 8)
    return BlobLayout(positions, align(positions), count * itemsize)


def cheapest_encoding(count: int, numel: int, itemsize: int) -> Encoding:
    """The encoding with the fewest bytes (dense on a tie: its receiver does the least work)."""
    sizes = {kind: blob_layout(kind, count, numel, itemsize).total_bytes
             for kind in (Encoding.INDICES, Encoding.BITMASK, Encoding.DENSE)}
    best = min(sizes.values())
    return Encoding.DENSE if sizes[Encoding.DENSE] == best else min(sizes, key=sizes.__getitem__)


@dataclass(frozen=True)
class TensorDelta:
    kind: Encoding
    numel: int                   # elements of the tensor
    count: int                   # elements whose bits changed (numel when dense and nothing was known)
    positions: Optional[Tensor]  # (count,) int32/int64 indices, or (ceil(numel/8),) uint8 bitmask; None if dense
    values: Tensor               # (count,) of the bits dtype: the new bits at those positions (all if dense)


def encode_delta(new: Tensor, last: Optional[Tensor]) -> TensorDelta:
    """`new` and `last`: flat tensors of one dtype (last = what the receiver holds; None = unknown)."""
    new_bits = new.view(bits_dtype(new.dtype))
    numel, itemsize = new.numel(), new.element_size()
    if last is None:
        return TensorDelta(Encoding.DENSE, numel, numel, None, new_bits)
    changed = new_bits != last.view(bits_dtype(last.dtype))
    count = int(changed.sum())
    kind = cheapest_encoding(count, numel, itemsize)
    if kind == Encoding.DENSE:
        return TensorDelta(kind, numel, count, None, new_bits)
    if kind == Encoding.INDICES:
        return TensorDelta(kind, numel, count, changed.nonzero().view(-1).to(index_dtype(numel)), new_bits[changed])
    return TensorDelta(kind, numel, count, pack_bits(changed), new_bits[changed])


def delta_parts(delta: TensorDelta) -> list[Tensor]:
    """The delta's parts as uint8 tensors, in blob order (each starts at an aligned offset of the blob)."""
    parts = [] if delta.positions is None else [delta.positions.view(torch.uint8)]
    return parts + [delta.values.view(torch.uint8)]


def delta_blob(delta: TensorDelta) -> Tensor:
    """The delta's bytes laid out as `blob_layout` says (tests; the transport writes the parts in place)."""
    layout = blob_layout(delta.kind, delta.count, delta.numel, delta.values.element_size())
    blob = torch.zeros(layout.total_bytes, dtype=torch.uint8, device=delta.values.device)
    if delta.positions is not None:
        blob[:layout.positions_bytes] = delta.positions.view(torch.uint8)
    blob[layout.values_offset:] = delta.values.view(torch.uint8)
    return blob


def apply_delta(target: Tensor, kind: Encoding, count: int, blob: Tensor) -> None:
    """Write a delta's values into `target` (flat, contiguous, the sender's dtype) in place."""
    bits = target.view(bits_dtype(target.dtype))
    numel, itemsize = target.numel(), target.element_size()
    layout = blob_layout(kind, count, numel, itemsize)
    if blob.numel() != layout.total_bytes:
        raise ValueError(f"weight sync: a {Encoding(kind).name.lower()} delta of {count} elements is "
                         f"{layout.total_bytes} bytes, {blob.numel()} arrived")
    values = blob[layout.values_offset:].view(bits.dtype)
    if kind == Encoding.DENSE:
        bits.copy_(values)
    elif kind == Encoding.INDICES:
        if count:
            bits.index_copy_(0, blob[:layout.positions_bytes].view(index_dtype(numel)).long(), values)
    else:
        bits.masked_scatter_(unpack_bits(blob[:layout.positions_bytes], numel), values)


BIT_SHIFTS = torch.arange(8, dtype=torch.uint8)


def pack_bits(mask: Tensor) -> Tensor:
    """bool (n,) -> uint8 (ceil(n/8),): element 8j+k is bit k of byte j."""
    padded = torch.zeros(-(-mask.numel() // 8) * 8, dtype=torch.uint8, device=mask.device)
    padded[:mask.numel()] = mask
    return (padded.view(-1, 8) << BIT_SHIFTS.to(mask.device)).sum(1, dtype=torch.uint8)


def unpack_bits(packed: Tensor, numel: int) -> Tensor:
    """uint8 (ceil(n/8),) -> bool (n,)."""
    return ((packed.unsqueeze(1) >> BIT_SHIFTS.to(packed.device)) & 1).view(-1)[:numel].bool()
