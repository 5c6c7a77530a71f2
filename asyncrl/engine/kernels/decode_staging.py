"""The inputs of a graphed decode step, written by the host into pinned memory and uploaded in one copy.

Each per-sequence array of a decode step (ids, positions, slots, context lengths, row order, sampling knobs)
has a fixed place in one int32 buffer: field k holds rows [k * capacity, k * capacity + rows), floats as
their bit patterns. The decode graphs read their inputs through views of the device copy, and the dtype
conversions they need are captured with them. So a step costs the host a numpy fill, one host-to-device
copy and one device copy of the block tables (their width changes from step to step, so they cannot be a
fixed view) instead of one small torch op per array.

Rows past the step's sequences, up to its CUDA-graph bucket, get padding values: token 0 at position 0,
writing into the KV cache's sink block and attending to that one token.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from asyncrl.engine.step_output import recorded_event

FIELDS = ("input_ids", "source_rows", "from_host", "positions", "write_slots", "context_lens", "row_order",
          "temperatures", "thresholds", "keys", "top_k", "top_p")
FLOAT_FIELDS = frozenset({"temperatures", "thresholds", "top_p"})
MAX_INT32 = 2**31 - 1


class DecodeStaging:
    """A ring of pinned host buffers and one device buffer holding a decode step's inputs for up to
    `capacity` rows and `max_blocks` block-table columns."""

    def __init__(self, capacity: int, max_blocks: int, sink_slot: int, num_cache_slots: int, device: torch.device,
                 num_slots: int = 2) -> None:
        if num_cache_slots > MAX_INT32:
            raise ValueError(f"a KV cache of {num_cache_slots} slots does not fit the decode inputs' int32")
        self.capacity = capacity
        self.tables_offset = len(FIELDS) * capacity
        size = self.tables_offset + capacity * max_blocks
        pinned = device.type == "cuda"
        # A ring: the host fills step s + 1 while step s's upload may still wait in the stream.
        self.host = [torch.zeros(size, dtype=torch.int32, pin_memory=pinned) for _ in range(num_slots)]
        self.uploaded: list[torch.cuda.Event | None] = [None] * num_slots
        self.next_slot = 0
        self.device_buffer = torch.zeros(size, dtype=torch.int32, device=device)
        self.padding = {"input_ids": 0, "source_rows": 0, "from_host": 1, "positions": 0, "write_slots": sink_slot,
                        "context_lens": 1, "temperatures": 1.0, "thresholds": float("-inf"), "keys": 0,
                        "top_k": -1, "top_p": 1.0}

    def field(self, name: str, rows: int) -> Tensor:
        """The device view of field `name` for `rows` rows (float fields as float32)."""
        start = FIELDS.index(name) * self.capacity
        view = self.device_buffer[start:start + rows]
        return view.view(torch.float32) if name in FLOAT_FIELDS else view

    def upload(self, arrays: dict[str, np.ndarray], num_rows: int, bucket: int, tables: np.ndarray) -> Tensor:
        """Writes `arrays` (FIELDS but `thresholds`, each (num_rows,); none for padding only) and the padding
        rows up to `bucket` into the next host buffer and queues its copy to the device; returns the device view
        of `tables` (num_rows, width) int32. 32-bit keys travel as their bit patterns."""
        slot = self.next_slot
        self.next_slot = (slot + 1) % len(self.host)
        if self.uploaded[slot] is not None:
            self.uploaded[slot].synchronize()  # that buffer's previous copy has left it (normally long ago)
        host = self.host[slot].numpy()
        host_floats = host.view(np.float32)
        for index, name in enumerate(FIELDS):
            rows = (host_floats if name in FLOAT_FIELDS else host)[index * self.capacity:index * self.capacity + bucket]
            filled = 0
            if name in arrays:  # all but `thresholds` (the sampler's truncation, when used, writes them)
                values = arrays[name]
                rows[:num_rows] = values.astype(np.uint32).view(np.int32) if name == "keys" else values
                filled = num_rows
            rows[filled:] = np.arange(filled, bucket) if name == "row_order" else self.padding[name]
        num_tables = tables.size
        host[self.tables_offset:self.tables_offset + num_tables] = tables.ravel()
        size = self.tables_offset + num_tables
        self.device_buffer[:size].copy_(self.host[slot][:size], non_blocking=True)
        self.uploaded[slot] = recorded_event(self.device_buffer)
        return self.device_buffer[self.tables_offset:size].view(tables.shape)
