"""Sparse weight sync over the weight group: per tensor only what changed since the last sync
(`sparse_delta.py` encodes), streamed through byte buckets.

The sender keeps, per tensor, the bits the receivers hold (its last sync, in the transfer dtype: one copy of
the synced weights on trainer rank 0). A group that was just formed (at start, after a replica restarted,
after the replica set grew or shrank) holds nothing known, so its first sync is dense; each later one moves
only the elements whose bits changed.

Unlike the dense plan, a delta's size is known only once its tensor was compared, so the stream describes
itself: the encoded tensors follow each other in plan order, each part at an 8-byte boundary, cut into
buckets of a fixed size; before each bucket a small header says whether it is the last, how many bytes it
holds and the (encoding, count) of every tensor whose record was written since the previous header. From
the records both sides derive every tensor's place in the stream (`blob_layout`), so no offsets travel.

    sender = DeltaSender(group, plan, device); stats = sender.sync(named_tensors, persistent=False)
    receiver = DeltaReceiver(group, plan, device); receiver.receive_into(engine_parameters)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from asyncrl.rollout.sparse_delta import Encoding, align, apply_delta, blob_layout, delta_parts, encode_delta
from asyncrl.rollout.weight_transport import (SyncStats, TransferPlan, WeightReceiver, WeightSender, broadcast,
                                               check_targets)

HEADER_FIELDS = 3  # is_last, bytes in the bucket, records in this header; then (encoding, count) per record


def stream_bucket_bytes(plan: TransferPlan) -> int:
    """The bucket size of the stream: the plan's bucket size, or less for a model whose whole stream is smaller
    (every tensor dense plus its alignment), rounded to the parts' alignment; both sides derive it."""
    itemsize = torch.empty((), dtype=plan.dtype).element_size()
    largest_stream = sum(align(itemsize * int(torch.Size(shape).numel())) + align(1) for shape in plan.shapes)
    return align(max(1, min(plan.bucket_bytes, largest_stream)))


def header_length(plan: TransferPlan) -> int:
    return HEADER_FIELDS + 2 * len(plan.names)


class StreamWriter:
    """Writes parts into the current bucket, broadcasting a header and the bucket when it is full; two
    buckets alternate, so the next fills while the last is on the wire."""

    def __init__(self, group: dist.ProcessGroup, buffers: list[Tensor], header_size: int):
        self.group = group
        self.buffers = buffers
        self.capacity = buffers[0].numel()
        self.header_size = header_size
        self.slot = 0
        self.offset = 0
        self.records: list[int] = []
        self.in_flight: list[list[object]] = [[], []]  # per buffer: its works, and the header they read
        self.wire_bytes = 0

    def write(self, kind: Encoding, count: int, parts: list[Tensor]) -> None:
        self.records += [int(kind), count]
        for part in parts:
            self.offset = align(self.offset)
            start = 0
            while start < part.numel():
                if self.offset >= self.capacity:
                    self.flush(is_last=False)
                size = min(part.numel() - start, self.capacity - self.offset)
                self.buffers[self.slot][self.offset:self.offset + size].copy_(part[start:start + size])
                self.offset += size
                start += size

    def flush(self, is_last: bool) -> None:
        values = [int(is_last), self.offset, len(self.records) // 2] + self.records
        header = torch.zeros(self.header_size, dtype=torch.int64)
        header[:len(values)] = torch.tensor(values, dtype=torch.int64)
        header = header.to(self.buffers[0].device)
        works = [broadcast(self.group, header)]
        if self.offset:
            works.append(broadcast(self.group, self.buffers[self.slot][:self.offset]))
        self.in_flight[self.slot] = [*works, header]
        self.wire_bytes += header.numel() * header.element_size() + self.offset
        self.slot, self.offset, self.records = 1 - self.slot, 0, []
        self.wait(self.slot)  # the buffer written next must be off the wire

    def finish(self) -> int:
        """Sends the last bucket; returns every byte that travelled (headers included)."""
        self.flush(is_last=True)
        self.wait(0)
        self.wait(1)
        return self.wire_bytes

    def wait(self, slot: int) -> None:
        for work in self.in_flight[slot]:
            if isinstance(work, dist.Work):
                work.wait()
        self.in_flight[slot] = []


class DeltaSender:
    def __init__(self, group: dist.ProcessGroup, plan: TransferPlan, device: torch.device):
        self.group = group
        self.plan = plan
        size = stream_bucket_bytes(plan)
        self.buffers = [torch.empty(size, dtype=torch.uint8, device=device) for _ in range(2)]
        self.held: dict[str, Tensor] = {}  # per tensor, the bits every receiver holds (flat, transfer dtype)
        self.numel = sum(int(torch.Size(shape).numel()) for shape in plan.shapes)

    def sync(self, named_tensors: Iterable[tuple[str, Tensor]], persistent: bool) -> SyncStats:
        """Streams every tensor's delta, in plan order (each tensor may be released once the next is asked
        for, so `persistent` changes nothing here); returns the bytes sent and the fraction that changed."""
        writer = StreamWriter(self.group, self.buffers, header_length(self.plan))
        named = iter(named_tensors)
        num_changed = 0
        for expected in self.plan.names:
            name, tensor = next(named, (None, None))
            if name != expected:
                raise RuntimeError(f"weight sync: the trainer yielded {name} where the plan expects {expected}")
            new = tensor.detach().reshape(-1).to(self.plan.dtype)
            held = self.held.get(name)
            delta = encode_delta(new, held)
            writer.write(delta.kind, delta.count, delta_parts(delta))
            num_changed += delta.count
            if held is None:
                self.held[name] = new.clone()
            else:
                held.copy_(new)
        return SyncStats(writer.finish(), self.plan.total_bytes, num_changed / max(1, self.numel))


@dataclass
class PendingBlob:
    """One tensor's encoded bytes, at [start, stop) of the stream, and what of them arrived."""
    name: str
    kind: Encoding
    count: int
    start: int
    stop: int
    staged: Optional[Tensor] = field(default=None)   # for a blob that spans buckets


class DeltaReceiver:
    def __init__(self, group: dist.ProcessGroup, plan: TransferPlan, device: torch.device):
        self.group = group
        self.plan = plan
        # One bucket: each is applied before the next is asked for (the next header is already on its way).
        self.buffer = torch.empty(stream_bucket_bytes(plan), dtype=torch.uint8, device=device)
        self.header = torch.empty(header_length(plan), dtype=torch.int64, device=device)
        self.itemsize = torch.empty((), dtype=plan.dtype).element_size()
        self.numels = {name: int(torch.Size(shape).numel()) for name, shape in zip(plan.names, plan.shapes)}

    def receive_into(self, targets: dict[str, Tensor]) -> int:
        """Applies every tensor's delta to `targets` (the engine's parameters, by name) in place; returns how
        many tensors."""
        check_targets(self.plan, targets)
        flat = {name: targets[name].view(-1) for name in self.plan.names}
        pending: list[PendingBlob] = []
        num_records, cursor, bucket_start = 0, 0, 0
        header_work = broadcast(self.group, self.header)
        while True:
            header_work.wait()
            values = self.header.tolist()
            is_last, used, count = values[0], values[1], values[2]
            for kind, changed in zip(values[HEADER_FIELDS:HEADER_FIELDS + 2 * count:2],
                                     values[HEADER_FIELDS + 1:HEADER_FIELDS + 2 * count:2]):
                if num_records >= len(self.plan.names):
                    raise RuntimeError(f"weight sync: the stream holds more than the plan's {num_records} tensors")
                name = self.plan.names[num_records]
                layout = blob_layout(Encoding(kind), changed, self.numels[name], self.itemsize)
                start = align(cursor)
                pending.append(PendingBlob(name, Encoding(kind), changed, start, start + layout.total_bytes))
                cursor, num_records = start + layout.total_bytes, num_records + 1
            if used:
                broadcast(self.group, self.buffer[:used]).wait()
            if not is_last:
                header_work = broadcast(self.group, self.header)  # the next header arrives while this applies
            pending = self.apply_arrived(pending, flat, self.buffer, bucket_start, used)
            bucket_start += used
            if is_last:
                break
        if pending or num_records != len(self.plan.names):
            missing = pending[0].name if pending else self.plan.names[num_records]
            raise RuntimeError(f"weight sync: the stream ended before tensor {missing} arrived")
        return num_records

    def apply_arrived(self, pending: list[PendingBlob], flat: dict[str, Tensor], bucket: Tensor, bucket_start: int,
                      used: int) -> list[PendingBlob]:
        """Applies every blob whose last byte is in this bucket; stages the part of one that goes on; returns the
        blobs still waiting."""
        bucket_stop = bucket_start + used
        waiting = []
        for blob in pending:
            if blob.start >= bucket_stop and blob.stop > blob.start:
                waiting.append(blob)
                continue
            low, high = max(blob.start, bucket_start), min(blob.stop, bucket_stop)
            piece = bucket[low - bucket_start:high - bucket_start]
            if blob.stop <= bucket_stop and blob.staged is None:
                apply_delta(flat[blob.name], blob.kind, blob.count, piece)
                continue
            if blob.staged is None:
                blob.staged = torch.empty(blob.stop - blob.start, dtype=torch.uint8, device=bucket.device)
            blob.staged[low - blob.start:high - blob.start].copy_(piece)
            if blob.stop <= bucket_stop:
                apply_delta(flat[blob.name], blob.kind, blob.count, blob.staged)
            else:
                waiting.append(blob)
        return waiting


def plan_sender(group: dist.ProcessGroup, plan: TransferPlan, device: torch.device) -> WeightSender | DeltaSender:
    """The sender the plan asks for; both answer `sync(named_tensors, persistent) -> SyncStats`."""
    return DeltaSender(group, plan, device) if plan.sparse else WeightSender(group, plan, device)


def plan_receiver(group: dist.ProcessGroup, plan: TransferPlan, device: torch.device) -> WeightReceiver | DeltaReceiver:
    """The receiver the plan asks for; both answer `receive_into(targets) -> int`."""
    return DeltaReceiver(group, plan, device) if plan.sparse else WeightReceiver(group, plan, device)
