"""A micro-batch packed into buffers of a fixed capacity: the static shapes a CUDA-graph step replays on.

    capacity = PackCapacity.covering(micro, token_budget=4096)
    packed = pack_micro_batch(micro, capacity, num_tokens, num_seqs)     # host tensors
    buffers = PackedBuffers(packed, device)                             # device tensors of that capacity
    buffers.load(packed)                                                # one copy; read buffers.batch

A graph replays the kernels it captured on the addresses and shapes it captured, so every micro-batch of a
capacity must fill the same buffers. The layout:

    input_ids, positions (N,)      the rows back to back, each from position 0; the unused tail of the capacity
                                   is one more sequence of pad tokens (id 0, positions 0, 1, ...), so it attends
                                   only to itself and no real token sees it
    starts (rows + 2,) int32       cumulative lengths: the micro-batch's rows, the tail, then repeats of N
                                   (empty sequences) up to the capacity's row count
    predictor_index (M,)           the packed position whose hidden state predicts each trained token
    target_ids (M,)                the trained tokens
    response_index (M,)            where each trained token's log-prob goes in the flattened (rows + 1, R)
                                   grid; unused slots point into the extra row, which is dropped
    response fields (rows, R)      mask, old log-probs, advantages and the optional fields of `TrainBatch`,
                                   zero beyond the micro-batch's rows and columns (the mask 0 there)
    counts (2,) float32            the mini-batch's global token and sequence counts (loss normalisers)

Capacities are rounded up (rows and response length to powers of two, tokens to the micro-batch budget, the
trained tokens to a multiple of `TRAINED_QUANTUM`), so a run needs a handful of graphs, not one per
micro-batch. Trained tokens are listed in row-major order, as `forward.response_token_index` lists them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from asyncrl.train.batch import TrainBatch

# Without a token budget (micro-batches by rows), packed tokens round up to a multiple of this.
TOKEN_QUANTUM = 1024
# Trained tokens (the LM head's rows) round up to a multiple of this: at most this many wasted LM-head rows.
TRAINED_QUANTUM = 512
# Optional per-response-token fields a policy loss may read; each is packed when the micro-batch has it.
OPTIONAL_FIELDS = ("rollout_log_probs", "ref_log_probs", "rollout_is_weights")
# Bytes each tensor of `PackedBuffers` starts at a multiple of: kernels load aligned vectors.
_BUFFER_ALIGNMENT = 64


@dataclass(frozen=True)
class PackCapacity:
    tokens: int           # N: packed tokens
    rows: int             # sequences (the micro-batch's rows)
    response_length: int  # R: columns of the response fields
    trained_tokens: int   # M: tokens through the LM head

    @classmethod
    def covering(cls, micro: TrainBatch, token_budget: Optional[int]) -> "PackCapacity":
        """The smallest rounded capacity that holds `micro`; `token_budget` (the dynamic micro-batch budget,
        None without one) fixes the token count whenever the micro-batch fits in it."""
        total = int((micro.prompt_lengths + micro.response_lengths).sum())
        fits = token_budget is not None and total <= token_budget
        tokens = token_budget if fits else _round_up(total, TOKEN_QUANTUM)
        trained = int((micro.response_mask > 0).sum())
        return cls(tokens=tokens, rows=_next_power_of_two(micro.num_rows),
                   response_length=_next_power_of_two(micro.max_response_length),
                   trained_tokens=min(_round_up(max(trained, 1), TRAINED_QUANTUM), tokens))


@dataclass
class PackedMicroBatch:
    input_ids: Tensor                  # (N,) int64
    positions: Tensor                  # (N,) int64
    starts: Tensor                     # (rows + 2,) int32
    predictor_index: Tensor            # (M,) int64
    target_ids: Tensor                 # (M,) int64
    response_index: Tensor             # (M,) int64
    response_mask: Tensor              # (rows, R) float32
    old_log_probs: Tensor              # (rows, R) float32
    advantages: Tensor                 # (rows, R) float32
    counts: Tensor                     # (2,) float32: global tokens, global sequences of the mini-batch
    rollout_log_probs: Optional[Tensor] = None
    ref_log_probs: Optional[Tensor] = None
    rollout_is_weights: Optional[Tensor] = None

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]

    def need(self, field_name: str, stage: str) -> Tensor:
        """The optional field, or an error naming the stage that needed it (as `TrainBatch.need`)."""
        value = getattr(self, field_name)
        if value is None:
            raise ValueError(f"{stage} needs TrainBatch.{field_name}, which no earlier stage filled in")
        return value

    def tensors(self) -> dict[str, Tensor]:
        """The fields that are set, by name (the buffers a captured step reads)."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)
                if getattr(self, field.name) is not None}


class PackedBuffers:
    """A packed micro-batch's tensors on a device, as views into one byte buffer that `load` fills from the host
    in one copy: the fixed addresses a captured step reads. Copying the ten tensors one by one, each pinned first,
    took ~1 ms of host time before an H200's first micro-batch of an update could start.

        buffers = PackedBuffers(packed, device)   # allocated for packed's capacity and fields
        buffers.load(packed)                      # any micro-batch of that capacity and fields
        step(buffers.batch)
    """

    def __init__(self, like: PackedMicroBatch, device: torch.device) -> None:
        self.layout: list[tuple[str, int, torch.dtype, tuple[int, ...]]] = []  # name, byte offset, dtype, shape
        offset = 0
        for name, tensor in like.tensors().items():
            self.layout.append((name, offset, tensor.dtype, tuple(tensor.shape)))
            offset += _round_up(tensor.numel() * tensor.element_size(), _BUFFER_ALIGNMENT)
        self.flat = torch.empty(offset, dtype=torch.uint8, device=device)
        self.batch = PackedMicroBatch(**self._views(self.flat))

    def load(self, source: PackedMicroBatch) -> None:
        """Writes `source` (host tensors of the same capacity and fields) into the buffers: gathered into one
        staging buffer (pinned for a CUDA device, so the copy does not wait), then one copy."""
        staging = torch.empty(self.flat.shape, dtype=torch.uint8, pin_memory=self.flat.is_cuda)
        for name, view in self._views(staging).items():
            view.copy_(getattr(source, name))
        # The host allocator keeps a pinned block until the copies queued from it are done.
        self.flat.copy_(staging, non_blocking=True)

    def _views(self, flat: Tensor) -> dict[str, Tensor]:
        return {name: flat[offset:offset + math.prod(shape) * dtype.itemsize].view(dtype).view(shape)
                for name, offset, dtype, shape in self.layout}


def pack_micro_batch(micro: TrainBatch, capacity: PackCapacity, num_tokens: float,
                     num_seqs: float) -> PackedMicroBatch:
    """`micro` (left-aligned rows, see `TrainBatch`) in the fixed-capacity layout of the module docstring."""
    lengths = micro.prompt_lengths + micro.response_lengths  # (B,)
    total, num_rows = int(lengths.sum()), micro.num_rows
    trained = torch.nonzero(micro.response_mask > 0)  # (M', 2) row-major
    if (total > capacity.tokens or num_rows > capacity.rows or micro.max_response_length > capacity.response_length
            or trained.shape[0] > capacity.trained_tokens):
        raise ValueError(f"micro-batch of {num_rows} rows, {total} tokens, {trained.shape[0]} trained tokens and "
                         f"{micro.max_response_length} response columns does not fit {capacity}")
    valid = torch.arange(micro.input_ids.shape[1])[None, :] < lengths[:, None]  # (B, T)
    tail = capacity.tokens - total
    input_ids = torch.zeros(capacity.tokens, dtype=torch.int64)
    input_ids[:total] = micro.input_ids[valid]
    positions = torch.cat([torch.arange(micro.input_ids.shape[1]).expand_as(valid)[valid], torch.arange(tail)])
    ends = torch.cumsum(lengths, dim=0)
    starts = torch.full((capacity.rows + 2,), capacity.tokens, dtype=torch.int32)
    starts[0] = 0
    starts[1:num_rows + 1] = ends.to(torch.int32)

    rows, columns = trained.unbind(1)
    spare = capacity.trained_tokens - trained.shape[0]
    row_offsets = ends - lengths  # (B,) where each row starts in the packed tokens
    predictor_index = _pad(row_offsets[rows] + micro.prompt_lengths[rows] + columns - 1, spare, 0)
    target_ids = _pad(micro.response_ids()[rows, columns], spare, 0)
    width = capacity.response_length
    spare_slots = capacity.rows * width + torch.arange(spare) % width  # the extra row of the grid
    response_index = torch.cat([rows * width + columns, spare_slots])

    def grid(values: Optional[Tensor]) -> Optional[Tensor]:
        if values is None:
            return None
        padded = torch.zeros(capacity.rows, width, dtype=values.dtype)
        padded[:num_rows, :values.shape[1]] = values
        return padded

    return PackedMicroBatch(
        input_ids=input_ids, positions=positions, starts=starts, predictor_index=predictor_index,
        target_ids=target_ids, response_index=response_index, response_mask=grid(micro.response_mask),
        old_log_probs=grid(micro.need("old_log_probs", "update_actor")),
        advantages=grid(micro.need("advantages", "update_actor")),
        counts=torch.tensor([num_tokens, num_seqs], dtype=torch.float32),
        **{name: grid(getattr(micro, name)) for name in OPTIONAL_FIELDS})


def scatter_to_grid(values: Tensor, packed: PackedMicroBatch) -> Tensor:
    """Per-trained-token values (M,) -> the (rows, R) response grid, 0 where no token trains."""
    rows, width = packed.response_mask.shape
    grid = values.new_zeros((rows + 1) * width).index_put((packed.response_index,), values)
    return grid.view(rows + 1, width)[:rows]


def _pad(values: Tensor, count: int, fill: int) -> Tensor:
    return torch.cat([values, torch.full((count,), fill, dtype=values.dtype)])


def _round_up(value: int, quantum: int) -> int:
    return -(-value // quantum) * quantum


def _next_power_of_two(value: int) -> int:
    return 1 << max(0, value - 1).bit_length()
