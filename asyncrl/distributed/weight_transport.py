"""Bucketed weight broadcast from trainer rank 0 to every rollout replica.

One process group (NCCL on GPU, gloo on CPU) joins the sender (trainer rank 0, group rank 0) and the
replicas (group ranks 1..N). It is created once at start, directly from a TCPStore, beside the trainer's
own FSDP group, and reused for every sync.

Both sides derive the same `TransferPlan` from the parameter list (names, shapes) and a bucket size, so
no metadata travels per sync: tensors are packed, in plan order, into fixed-size byte buckets (a tensor
larger than a bucket spans several). Two buckets alternate, so packing bucket k+1 (and gathering its
tensors from FSDP shards) overlaps the broadcast of bucket k, and on the receiving side copying bucket k
into the engine overlaps receiving k+1. Memory on either side is two buckets, never a model copy.

    plan = TransferPlan.build([(name, shape), ...], dtype=torch.bfloat16, bucket_bytes=256 << 20)
    sender = WeightSender(group, plan, device); sender.send(named_full_tensors)
    receiver = WeightReceiver(group, plan, device); engine.update_weights(receiver.receive(), version)
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch
import torch.distributed as dist
from torch import Tensor

ALIGNMENT = 256  # bytes: every tensor starts aligned, as fast copies like


@dataclass(frozen=True)
class Piece:
    """Bytes [start, stop) of a tensor's flat byte view land at `offset` in bucket `bucket`."""
    name: str
    bucket: int
    offset: int
    start: int
    stop: int


@dataclass(frozen=True)
class TransferPlan:
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtype: torch.dtype
    bucket_bytes: int
    pieces: tuple[Piece, ...]
    num_buckets: int

    @classmethod
    def build(cls, named_shapes: Iterable[tuple[str, tuple[int, ...]]], dtype: torch.dtype,
              bucket_bytes: int) -> "TransferPlan":
        named_shapes = list(named_shapes)
        itemsize = torch.empty((), dtype=dtype).element_size()
        pieces, bucket, offset = [], 0, 0
        for name, shape in named_shapes:
            size = itemsize * int(torch.Size(shape).numel())
            start = 0
            while start < size:
                if offset >= bucket_bytes:
                    bucket, offset = bucket + 1, 0
                stop = min(size, start + bucket_bytes - offset)
                pieces.append(Piece(name, bucket, offset, start, stop))
                offset = -(-(offset + stop - start) // ALIGNMENT) * ALIGNMENT
                start = stop
        return cls(tuple(name for name, _ in named_shapes), tuple(tuple(shape) for _, shape in named_shapes),
                   dtype, bucket_bytes, tuple(pieces), bucket + 1 if pieces else 0)

    @property
    def total_bytes(self) -> int:
        return sum(piece.stop - piece.start for piece in self.pieces)

    @property
    def bucket_sizes(self) -> tuple[int, ...]:
        """The bytes each bucket uses (the last one, or every one of a small model, is not full): only
        these travel."""
        sizes = [0] * self.num_buckets
        for piece in self.pieces:
            sizes[piece.bucket] = max(sizes[piece.bucket], piece.offset + piece.stop - piece.start)
        return tuple(sizes)

    def pieces_by_bucket(self) -> list[list[Piece]]:
        buckets: list[list[Piece]] = [[] for _ in range(self.num_buckets)]
        for piece in self.pieces:
            buckets[piece.bucket].append(piece)
        return buckets


def create_group(host: str, port: int, rank: int, world_size: int, device: torch.device,
                 timeout_s: float) -> dist.ProcessGroup:
    """A process group outside the default one (rank 0 hosts the store). Every member must call it."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, world_size, rank == 0, timeout, wait_for_workers=False)
    prefixed = dist.PrefixStore("asyncrl-weights", store)
    if device.type == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(prefixed, rank, world_size, options)
    return dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)


def bucket_buffers(plan: TransferPlan, device: torch.device) -> list[Tensor]:
    """Two byte buffers, each as large as the largest bucket the plan uses (a small model needs less than
    `bucket_bytes`)."""
    size = max(plan.bucket_sizes, default=0)
    return [torch.empty(size, dtype=torch.uint8, device=device) for _ in range(2)]


def broadcast(group: dist.ProcessGroup, buffer: Tensor) -> dist.Work:
    options = dist.BroadcastOptions()
    options.rootRank = 0
    return group.broadcast([buffer], options)


class WeightSender:
    def __init__(self, group: dist.ProcessGroup, plan: TransferPlan, device: torch.device):
        self.group = group
        self.plan = plan
        self.buffers = bucket_buffers(plan, device)
        self.itemsize = torch.empty((), dtype=plan.dtype).element_size()

    def send(self, named_tensors: Iterable[tuple[str, Tensor]]) -> int:
        """Broadcast tensors given in plan order; returns the bytes sent."""
        tensors = iter(named_tensors)
        current: dict[str, Tensor] = {}
        pending: list[dist.Work | None] = [None, None]
        sizes = self.plan.bucket_sizes
        for index, pieces in enumerate(self.plan.pieces_by_bucket()):
            slot = index % 2
            if pending[slot] is not None:
                pending[slot].wait()  # this buffer's previous broadcast must be done before reuse
            buffer = self.buffers[slot]
            for piece in pieces:
                if piece.name not in current:
                    current = {piece.name: self.next_tensor(tensors, piece.name)}
                # One kernel per piece: the cast to the transfer dtype happens in the copy into the bucket.
                first, last = piece.start // self.itemsize, piece.stop // self.itemsize
                target = buffer[piece.offset:piece.offset + piece.stop - piece.start].view(self.plan.dtype)
                target.copy_(current[piece.name][first:last])
            pending[slot] = broadcast(self.group, buffer[:sizes[index]])
        for work in pending:
            if work is not None:
                work.wait()
        return self.plan.total_bytes

    def next_tensor(self, tensors: Iterator[tuple[str, Tensor]], expected: str) -> Tensor:
        name, tensor = next(tensors)
        if name != expected:
            raise RuntimeError(f"weight sync: the trainer yielded {name} where the plan expects {expected}")
        return tensor.detach().reshape(-1)


class WeightReceiver:
    def __init__(self, group: dist.ProcessGroup, plan: TransferPlan, device: torch.device):
        self.group = group
        self.plan = plan
        self.buffers = bucket_buffers(plan, device)
        self.shapes = dict(zip(plan.names, plan.shapes))
        self.itemsize = torch.empty((), dtype=plan.dtype).element_size()

    def receive(self) -> Iterator[tuple[str, Tensor]]:
        """(name, tensor) pairs, each as soon as its last piece arrived. Bucket k+1 is already in flight
        while the caller consumes bucket k's tensors."""
        buckets = self.plan.pieces_by_bucket()
        sizes = self.plan.bucket_sizes
        works: list[dist.Work | None] = [None, None]
        if buckets:
            works[0] = broadcast(self.group, self.buffers[0][:sizes[0]])
        partial: dict[str, Tensor] = {}
        for index, pieces in enumerate(buckets):
            slot = index % 2
            works[slot].wait()
            # Start the next bucket only now: its buffer is the one consumed (copied out) last iteration.
            if index + 1 < len(buckets):
                works[1 - slot] = broadcast(self.group, self.buffers[1 - slot][:sizes[index + 1]])
            buffer = self.buffers[slot]
            for piece in pieces:
                numel = int(torch.Size(self.shapes[piece.name]).numel())
                if piece.start == 0 and piece.stop == numel * self.itemsize:
                    # Whole tensor in this bucket: hand out a view; the caller copies it before the buffer
                    # is reused two buckets later.
                    view = buffer[piece.offset:piece.offset + piece.stop].view(self.plan.dtype)
                    yield piece.name, view.view(self.shapes[piece.name])
                    continue
                if piece.name not in partial:
                    partial[piece.name] = torch.empty(numel, dtype=self.plan.dtype, device=buffer.device)
                target = partial[piece.name].view(torch.uint8)
                target[piece.start:piece.stop].copy_(buffer[piece.offset:piece.offset + piece.stop - piece.start])
                if piece.stop == target.numel():
                    yield piece.name, partial.pop(piece.name).view(self.shapes[piece.name])
