"""Flattened model inputs of one step, built on the host and uploaded in a single copy.

A prefill computes each group leader's tokens once, from the end of its cached prefix (rows = leaders); a
follower reuses the leader's last hidden state for its first sample and receives the prompt's tail KV in its
private last block through extra (row, slot) writes. A decode computes one token per sequence (rows =
sequences). A decode scheduled ahead takes its input ids from the previous step's sampled tokens on the
device, never from the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from asyncrl.engine.attention import AttentionMetadata
from asyncrl.engine.sampler import SamplingInputs, position_keys, seed_keys
from asyncrl.engine.scheduler import ScheduledBatch
from asyncrl.engine.sequence import Sequence


@dataclass
class StepInputs:
    """N computed tokens in R rows, S sampled sequences."""

    input_ids: Tensor  # (N,) int64
    positions: Tensor  # (N,) int64
    attention: AttentionMetadata
    last_token_indices: Tensor  # (S,) int64 token whose hidden state samples each sequence's next token
    sampling: SamplingInputs
    is_decode: bool

    @property
    def num_sequences(self) -> int:
        return int(self.last_token_indices.shape[0])


def _slots(sequence: Sequence, positions: np.ndarray, block_size: int) -> np.ndarray:
    """Flat cache slots of `positions` (int64) of one sequence."""
    return sequence.block_array[positions // block_size].astype(np.int64) * block_size + positions % block_size


def _block_tables(sequences: list[Sequence], sink_block: int, width: int | None = None) -> np.ndarray:
    """(R, width or max blocks) int32, padded with the sink block; row copies of each block array."""
    width = width or max(sequence.block_array.size for sequence in sequences)
    tables = np.full((len(sequences), width), sink_block, dtype=np.int32)
    for row, sequence in enumerate(sequences):
        tables[row, :sequence.block_array.size] = sequence.block_array
    return tables


class BlockTableCache:
    """The previous decode step's block-table matrix, reused row by row: consecutive decode steps mostly
    run the same sequences, and a row changes only when its sequence's `block_table_version` does (once
    every block_size tokens), so only those rows are rewritten instead of all S x W entries."""

    def __init__(self, sink_block: int) -> None:
        self.sink_block = sink_block
        self.tables = np.zeros((0, 0), dtype=np.int32)  # (S, capacity width)
        self.versions = np.zeros(0, dtype=np.int64)  # (S,) block_table_version of each cached row

    def build(self, sequences: list[Sequence]) -> np.ndarray:
        """(S, max blocks) int32 block tables of `sequences`, padded with the sink block."""
        versions = np.fromiter((s.block_table_version for s in sequences), dtype=np.int64, count=len(sequences))
        width = max(sequence.block_array.size for sequence in sequences)
        if versions.size != self.versions.size or width > self.tables.shape[1]:
            # Room to grow: a full rebuild then serves the next block_size x 8 tokens of every row.
            self.tables = _block_tables(sequences, self.sink_block, width + 8)
        else:
            for row in np.flatnonzero(versions != self.versions):
                blocks = sequences[row].block_array
                self.tables[row, :blocks.size] = blocks
                self.tables[row, blocks.size:] = self.sink_block
        self.versions = versions
        return self.tables[:, :width]


class SamplingArrayCache:
    """The previous batch's per-sequence sampling constants (temperature, top-k, top-p, the seed half of the
    noise key, prompt length), reused while a batch holds the same sequences in the same order, as decode
    steps do between admissions and finishes: only the response positions are hashed anew each step."""

    def __init__(self) -> None:
        self.sequences: list[Sequence] = []
        self.constants: dict[str, np.ndarray] = {}
        self.max_top_k = 0  # the batch's largest top-k (0: none), for the sampler's truncation pass
        self.use_top_p = False  # whether any sequence truncates by top-p

    def build(self, sequences: list[Sequence], num_tokens: np.ndarray) -> dict[str, np.ndarray]:
        """Sampling arrays (S,) of `sequences` holding `num_tokens` (S,) tokens each when sampling; also sets
        `max_top_k` and `use_top_p` for them."""
        if sequences != self.sequences:  # a list comparison by identity: ~2 µs for 256 sequences
            self.sequences = list(sequences)
            self.constants = {
                "temperatures": np.asarray([s.params.temperature for s in sequences], dtype=np.float32),
                "top_k": np.asarray([s.params.top_k for s in sequences], dtype=np.int64),
                "top_p": np.asarray([s.params.top_p for s in sequences], dtype=np.float32),
                "seed_keys": seed_keys(np.asarray([s.seed for s in sequences], dtype=np.int64)),
                "num_prompt_tokens": np.asarray([s.num_prompt_tokens for s in sequences], dtype=np.int64),
            }
            self.max_top_k = max(int(self.constants["top_k"].max()), 0)
            self.use_top_p = bool((self.constants["top_p"] < 1.0).any())
        constants = self.constants
        return {"temperatures": constants["temperatures"], "top_k": constants["top_k"], "top_p": constants["top_p"],
                "keys": position_keys(constants["seed_keys"], num_tokens - constants["num_prompt_tokens"])}


def _upload(arrays: dict[str, np.ndarray], device: torch.device) -> dict[str, Tensor]:
    """One host-to-device copy for all arrays (each copy costs a fixed latency): every array travels as
    int64 (float32 as its bit pattern) and gets its dtype back on the device."""
    flat = [(array.view(np.int32) if array.dtype == np.float32 else array).astype(np.int64, copy=False).ravel()
            for array in arrays.values()]
    if device.type == "cuda":
        # Pinned and non-blocking: a copy from pageable memory waits until the device is idle, which would
        # serialise building the next step with the GPU running the current one (async scheduling).
        staging = torch.empty(sum(part.size for part in flat), dtype=torch.int64, pin_memory=True)
        np.concatenate(flat, out=staging.numpy())
        buffer = staging.to(device, non_blocking=True)
    else:
        buffer = torch.from_numpy(np.concatenate(flat))
    tensors, offset = {}, 0
    for (name, array), part in zip(arrays.items(), flat):
        tensor = buffer[offset:offset + part.size].view(array.shape)
        offset += part.size
        if array.dtype == np.float32:
            tensor = tensor.to(torch.int32).view(torch.float32)
        elif array.dtype == np.int32:
            tensor = tensor.to(torch.int32)
        tensors[name] = tensor
    return tensors


def _prefill_arrays(batch: ScheduledBatch, block_size: int, sink_block: int) -> dict[str, np.ndarray]:
    leader_indices = [index for index, leader in enumerate(batch.leader_indices) if leader == index]
    leaders = [batch.sequences[index] for index in leader_indices]
    row_of_leader = {index: row for row, index in enumerate(leader_indices)}
    lengths = np.asarray([len(leader) for leader in leaders], dtype=np.int64)  # (R,)
    cached = np.asarray([leader.num_cached_tokens for leader in leaders], dtype=np.int64)  # (R,) prefix-cache hits
    query_lens = lengths - cached
    starts = np.concatenate([[0], np.cumsum(query_lens)])  # (R + 1,)
    positions = np.concatenate([np.arange(first, length) for first, length in zip(cached, lengths)])
    slots = [_slots(leader, np.arange(first, length), block_size) for leader, first, length
             in zip(leaders, cached, lengths)]
    rows = [np.arange(starts[-1])]
    for index, sequence in enumerate(batch.sequences):
        row = row_of_leader[batch.leader_indices[index]]
        tail = len(sequence) % block_size
        if batch.leader_indices[index] != index and tail:
            # The tail lies past the cached prefix, which covers full blocks only.
            tail_positions = np.arange(len(sequence) - tail, len(sequence))
            rows.append(starts[row] + tail_positions - cached[row])
            slots.append(_slots(sequence, tail_positions, block_size))
    leader_rows = np.asarray([row_of_leader[leader] for leader in batch.leader_indices], dtype=np.int64)
    return {
        "input_ids": np.concatenate([np.asarray(leader.token_ids[first:], dtype=np.int64)
                                     for leader, first in zip(leaders, cached)]),
        "positions": positions,
        "write_slots": np.concatenate(slots),
        "write_rows": np.concatenate(rows),
        "block_tables": _block_tables(leaders, sink_block),
        "context_lens": lengths.astype(np.int32),
        "query_lens": query_lens,
        "query_starts": starts.astype(np.int32),
        "query_token_indices": np.concatenate([row * query_lens.max() + np.arange(length)
                                               for row, length in enumerate(query_lens)]),
        "last_token_indices": starts[leader_rows + 1] - 1,
    }


def _decode_arrays(batch: ScheduledBatch, block_size: int, block_tables_cache: BlockTableCache
                   ) -> dict[str, np.ndarray]:
    sequences = batch.sequences
    num_sequences = len(sequences)
    # Position of the token each row computes: the last known one, or for a decode ahead the one sampled by
    # the previous step (not yet appended on the host).
    positions = np.fromiter((len(s.token_ids) for s in sequences), dtype=np.int64, count=num_sequences)
    positions += batch.lookahead - 1
    block_tables = block_tables_cache.build(sequences)  # (S, W)
    current_blocks = block_tables[np.arange(num_sequences), positions // block_size].astype(np.int64)
    if batch.source_rows is None:
        token_source = {"input_ids": np.fromiter((s.token_ids[-1] for s in sequences), dtype=np.int64,
                                                 count=num_sequences)}
    else:
        token_source = {"source_rows": np.asarray(batch.source_rows, dtype=np.int64)}
    return {
        **token_source,
        "positions": positions,
        "write_slots": current_blocks * block_size + positions % block_size,
        "block_tables": block_tables,
        "context_lens": (positions + 1).astype(np.int32),
        "row_order": np.argsort(-positions, kind="stable").astype(np.int32),  # longest context first
        "query_lens": np.ones(num_sequences, dtype=np.int64),
        "query_token_indices": np.arange(num_sequences, dtype=np.int64),
        "last_token_indices": np.arange(num_sequences, dtype=np.int64),
    }


def decode_graph_arrays(batch: ScheduledBatch, block_size: int, block_tables_cache: BlockTableCache,
                        sampling_cache: SamplingArrayCache) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """A decode's host arrays as the CUDA-graph path stages them (`kernels/decode_staging.FIELDS` but thresholds,
    each (S,)) and its block tables (S, W) int32."""
    arrays = _decode_arrays(batch, block_size, block_tables_cache)
    sampling = sampling_cache.build(batch.sequences, arrays["positions"] + 1)
    num_sequences = batch.num_sequences
    if batch.source_rows is None:
        sources = {"source_rows": np.zeros(num_sequences, dtype=np.int64), "from_host": 1}
    else:
        sources = {"input_ids": 0, "from_host": 0}
    return {**arrays, **sources, **sampling}, arrays["block_tables"]


def build_step_inputs(batch: ScheduledBatch, block_size: int, block_tables_cache: BlockTableCache,
                      sampling_cache: SamplingArrayCache, device: torch.device, num_splits: int = 1,
                      previous_token_ids: Tensor | None = None) -> StepInputs:
    """The device inputs of `batch`; `num_splits` is the decode kernel's context split count. A decode
    ahead (`batch.source_rows`) reads its input ids from `previous_token_ids` (S_prev,), the previous step's
    sampled tokens on the device."""
    if batch.is_prefill:
        arrays = _prefill_arrays(batch, block_size, block_tables_cache.sink_block)
        num_tokens = np.fromiter((len(s.token_ids) for s in batch.sequences), dtype=np.int64,
                                 count=batch.num_sequences)
    else:
        arrays = _decode_arrays(batch, block_size, block_tables_cache)
        num_tokens = arrays["positions"] + 1
    sampling_arrays = sampling_cache.build(batch.sequences, num_tokens)
    tensors = _upload({**arrays, **sampling_arrays}, device)
    if batch.source_rows is None:
        input_ids = tensors["input_ids"]
    elif previous_token_ids is None:
        raise ValueError("a decode scheduled ahead needs the previous step's sampled token ids")
    else:
        input_ids = previous_token_ids[tensors["source_rows"]]
    attention = AttentionMetadata(
        write_slots=tensors["write_slots"], write_rows=tensors["write_rows"] if batch.is_prefill else None,
        block_tables=tensors["block_tables"], context_lens=tensors["context_lens"],
        query_lens=tensors["query_lens"], query_token_indices=tensors["query_token_indices"],
        max_query_len=int(arrays["query_lens"].max()), max_context_len=int(arrays["context_lens"].max()),
        is_decode=not batch.is_prefill, num_splits=num_splits,
        has_cached_context=batch.is_prefill and bool((arrays["query_lens"] < arrays["context_lens"]).any()),
        row_order=None if batch.is_prefill else tensors["row_order"],
        query_starts=tensors["query_starts"] if batch.is_prefill else None)
    sampling = SamplingInputs(
        temperatures=tensors["temperatures"], top_k=tensors["top_k"], top_p=tensors["top_p"], keys=tensors["keys"],
        max_top_k=sampling_cache.max_top_k, use_top_p=sampling_cache.use_top_p)
    return StepInputs(input_ids, tensors["positions"], attention, tensors["last_token_indices"],
                      sampling, is_decode=not batch.is_prefill)
