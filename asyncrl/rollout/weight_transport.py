"""Bucketed weight broadcast from trainer rank 0 to every rollout replica.

One process group (NCCL on GPU, gloo on CPU) joins the sender (trainer rank 0, group rank 0) and the
replicas (group ranks 1..N). It is created once at start, directly from a TCPStore, beside the trainer's
own FSDP group, and reused for every sync.

Both sides derive the same `TransferPlan` from the parameter list (names, shapes) and a bucket size, so
no metadata travels per sync: tensors are packed, in plan order, into fixed-size byte buckets (a tensor
larger than a bucket spans several). Two buckets alternate, so packing bucket k+1 (and gathering its
tensors from FSDP shards) overlaps the broadcast of bucket k, and on the receiving side copying bucket k
into the engine overlaps receiving k+1. Memory on either side is two buckets, never a model copy.

Host work per tensor, not the link, limits a sync of a small model (hundreds of tensors, a few ms of
transfer). So when the tensors on a side persist between syncs (a one-rank trainer's weights, an engine's
parameters), the views each bucket copies from and to are computed once and every bucket is packed or
unpacked by one `torch._foreach_copy_`; they are recomputed only when a tensor's storage moved.

    plan = TransferPlan.build([(name, shape), ...], dtype=torch.bfloat16, bucket_bytes=256 << 20)
    sender = WeightSender(group, plan, device); sender.send(named_full_tensors, persistent=False)
    receiver = WeightReceiver(group, plan, device); engine.update_weights_in_place(receiver.receive_into, version)
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import torch
import torch.distributed as dist
from torch import Tensor

from asyncrl.rollout.backend import SyncStats
from asyncrl.train.parallel import tcp_store

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
    sparse: bool = False   # send per-tensor deltas (`delta_transport.py`) instead of every byte

    @classmethod
    def build(cls, named_shapes: Iterable[tuple[str, tuple[int, ...]]], dtype: torch.dtype,
              bucket_bytes: int, sparse: bool = False) -> "TransferPlan":
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
                   dtype, bucket_bytes, tuple(pieces), bucket + 1 if pieces else 0, sparse)

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
    store = tcp_store(host, port, world_size, rank == 0, timeout)  # listens on `host` only
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


class CopyLists:
    """Per bucket, the destination and source views one `_foreach_copy_` copies, valid while the tensors'
    storages stay where they were when the lists were made (`key`)."""

    def __init__(self) -> None:
        self.key: tuple[int, ...] = ()
        self.destinations: list[list[Tensor]] = []
        self.sources: list[list[Tensor]] = []

    def current(self, tensors: list[Tensor], build: Callable[[], tuple[list[list[Tensor]], list[list[Tensor]]]]
                ) -> "CopyLists":
        key = tuple(tensor.data_ptr() for tensor in tensors)
        if key != self.key:
            self.destinations, self.sources = build()
            self.key = key
        return self


def bucket_view(buffer: Tensor, piece: Piece, dtype: torch.dtype) -> Tensor:
    return buffer[piece.offset:piece.offset + piece.stop - piece.start].view(dtype)


class WeightSender:
    def __init__(self, group: dist.ProcessGroup, plan: TransferPlan, device: torch.device):
        self.group = group
        self.plan = plan
        self.buffers = bucket_buffers(plan, device)
        self.itemsize = torch.empty((), dtype=plan.dtype).element_size()
        self.copies = CopyLists()

    def sync(self, named_tensors: Iterable[tuple[str, Tensor]], persistent: bool) -> SyncStats:
        sent = self.send(named_tensors, persistent)
        return SyncStats(sent, sent)

    def send(self, named_tensors: Iterable[tuple[str, Tensor]], persistent: bool) -> int:
        """Broadcast tensors given in plan order; returns the bytes sent. `persistent`: the tensors outlive
        the call and are updated in place between syncs (then each bucket is packed by one foreach copy
        through views made once); otherwise each is valid only until the next is asked for."""
        if persistent:
            return self.send_persistent(list(named_tensors))
        tensors = iter(named_tensors)
        current: dict[str, Tensor] = {}

        def pack(index: int, pieces: list[Piece]) -> None:
            nonlocal current
            for piece in pieces:
                if piece.name not in current:
                    current = {piece.name: self.next_tensor(tensors, piece.name)}
                # One kernel per piece: the cast to the transfer dtype happens in the copy into the bucket.
                bucket_view(self.buffers[index % 2], piece, self.plan.dtype).copy_(self.source(current[piece.name], piece))

        return self.broadcast_buckets(pack)

    def send_persistent(self, named_tensors: list[tuple[str, Tensor]]) -> int:
        names = [name for name, _ in named_tensors]
        if names != list(self.plan.names):
            raise RuntimeError(f"weight sync: the trainer's tensors {names[:3]}... do not follow the plan "
                               f"{list(self.plan.names[:3])}...")
        tensors = dict(named_tensors)

        def build() -> tuple[list[list[Tensor]], list[list[Tensor]]]:
            flat = {name: tensor.detach().reshape(-1) for name, tensor in tensors.items()}
            buckets = self.plan.pieces_by_bucket()
            return ([[bucket_view(self.buffers[index % 2], piece, self.plan.dtype) for piece in pieces]
                     for index, pieces in enumerate(buckets)],
                    [[self.source(flat[piece.name], piece) for piece in pieces] for pieces in buckets])

        copies = self.copies.current(list(tensors.values()), build)
        # One foreach per bucket (it casts to the transfer dtype on the way).
        return self.broadcast_buckets(lambda index, _: torch._foreach_copy_(copies.destinations[index],
                                                                             copies.sources[index]))

    def broadcast_buckets(self, pack: Callable[[int, list[Piece]], object]) -> int:
        """Pack bucket k into its buffer (`pack(k, pieces)`) while bucket k-1 is on the wire."""
        pending: list[dist.Work | None] = [None, None]
        sizes = self.plan.bucket_sizes
        for index, pieces in enumerate(self.plan.pieces_by_bucket()):
            slot = index % 2
            if pending[slot] is not None:
                pending[slot].wait()  # this buffer's previous broadcast must be done before reuse
            pack(index, pieces)
            pending[slot] = broadcast(self.group, self.buffers[slot][:sizes[index]])
        for work in pending:
            if work is not None:
                work.wait()
        return self.plan.total_bytes

    def source(self, flat: Tensor, piece: Piece) -> Tensor:
        return flat[piece.start // self.itemsize:piece.stop // self.itemsize]

    def next_tensor(self, tensors: Iterator[tuple[str, Tensor]], expected: str) -> Tensor:
        name, tensor = next(tensors)
        if name != expected:
            raise RuntimeError(f"weight sync: the trainer yielded {name} where the plan expects {expected}")
        return tensor.detach().reshape(-1)


def check_names(plan: TransferPlan, targets: dict[str, Tensor]) -> None:
    missing = [name for name in plan.names if name not in targets]
    if missing:
        raise ValueError(f"weight sync: the engine has no tensor {missing[0]} (and {len(missing) - 1} more)")


def check_targets(plan: TransferPlan, targets: dict[str, Tensor]) -> None:
    """Every tensor of the plan is in `targets` with its shape and dtype, contiguous (written in place)."""
    check_names(plan, targets)
    for name, shape in zip(plan.names, plan.shapes):
        target = targets[name]
        if tuple(target.shape) != shape or target.dtype != plan.dtype or not target.is_contiguous():
            raise ValueError(f"weight sync: engine tensor {name} is {list(target.shape)} {target.dtype}, "
                             f"the trainer sends {list(shape)} {plan.dtype}")


class WeightReceiver:
    def __init__(self, group: dist.ProcessGroup, plan: TransferPlan, device: torch.device):
        self.group = group
        self.plan = plan
        self.buffers = bucket_buffers(plan, device)
        self.copies = CopyLists()

    def receive_into(self, targets: dict[str, Tensor]) -> int:
        """Receive every tensor straight into `targets` (the engine's parameters, by name: contiguous, in the
        plan's dtype, updated only here), one foreach byte copy per bucket; returns how many tensors."""
        check_names(self.plan, targets)

        def build() -> tuple[list[list[Tensor]], list[list[Tensor]]]:
            check_targets(self.plan, targets)
            flat = {name: targets[name].view(-1).view(torch.uint8) for name in self.plan.names}
            buckets = self.plan.pieces_by_bucket()
            return ([[flat[piece.name][piece.start:piece.stop] for piece in pieces] for pieces in buckets],
                    [[bucket_view(self.buffers[index % 2], piece, torch.uint8) for piece in pieces]
                     for index, pieces in enumerate(buckets)])

        copies = self.copies.current([targets[name] for name in self.plan.names], build)
        for index in self.arrived_buckets():
            torch._foreach_copy_(copies.destinations[index], copies.sources[index])
        return len(self.plan.names)

    def receive_named(self) -> Iterator[tuple[str, Tensor]]:
        """Every tensor as (name, a new tensor), in plan order, each yielded once its last byte arrived: for an
        engine that loads weights through its own loader (vLLM) instead of a copy into its parameters. The
        caller may keep what it is given; it must consume each tensor before asking for the next."""
        itemsize = torch.empty((), dtype=self.plan.dtype).element_size()
        shapes = dict(zip(self.plan.names, self.plan.shapes))
        sizes = {name: itemsize * int(torch.Size(shape).numel()) for name, shape in shapes.items()}
        device = self.buffers[0].device
        staged: dict[str, Tensor] = {}
        buckets = self.plan.pieces_by_bucket()
        for index in self.arrived_buckets():
            for piece in buckets[index]:
                if piece.name not in staged:
                    staged[piece.name] = torch.empty(shapes[piece.name], dtype=self.plan.dtype, device=device)
                flat = staged[piece.name].view(-1).view(torch.uint8)
                flat[piece.start:piece.stop].copy_(bucket_view(self.buffers[index % 2], piece, torch.uint8))
                if piece.stop == sizes[piece.name]:
                    yield piece.name, staged.pop(piece.name)

    def arrived_buckets(self) -> Iterator[int]:
        """Bucket indices, each once its bytes are in its buffer; bucket k+1 is already on the wire while the
        caller unpacks bucket k, which it must finish before asking for the next."""
        sizes = self.plan.bucket_sizes
        works: list[dist.Work | None] = [None, None]
        if self.plan.num_buckets:
            works[0] = broadcast(self.group, self.buffers[0][:sizes[0]])
        for index in range(self.plan.num_buckets):
            slot = index % 2
            works[slot].wait()
            # Start the next bucket only now: its buffer is the one unpacked last iteration.
            if index + 1 < self.plan.num_buckets:
                works[1 - slot] = broadcast(self.group, self.buffers[1 - slot][:sizes[index + 1]])
            yield index
