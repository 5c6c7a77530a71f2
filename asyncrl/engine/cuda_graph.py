"""CUDA graphs of the decode forward, one per batch-size bucket, captured lazily on first use.

A decode step of S sequences runs the graph of the smallest bucket >= S (buckets 1, 2, 4, 8, 16, 32, then
multiples of 32 up to max_num_seqs). Inputs live in static buffers sized for the largest bucket; rows
S .. bucket - 1 are padding that writes to and reads from the KV cache's sink block. Weights are updated in
place and the KV cache keeps its address while awake, so graphs stay valid across weight updates; `clear`
drops them when the cache is released (engine sleep).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from asyncrl.engine.attention import AttentionMetadata, DecodeKernel, PagedAttention
from asyncrl.engine.kv_cache import KVCache
from asyncrl.engine.step_inputs import StepInputs
from asyncrl.models.transformer import CausalLM


def decode_buckets(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, 16, 32, 64, 96, ... up to and including max_num_seqs."""
    buckets = [size for size in (1, 2, 4, 8, 16, 32) if size < max_num_seqs]
    buckets += list(range(64, max_num_seqs, 32))
    return buckets + [max_num_seqs]


def decode_num_splits(num_sequences: int, num_kv_heads: int, num_processors: int) -> int:
    """Context splits of the decode kernel: enough programs to fill the device twice, at most 32."""
    num_splits = 1
    while num_sequences * num_kv_heads * num_splits < 2 * num_processors and num_splits < 32:
        num_splits *= 2
    return num_splits


class DecodeGraphs:
    """Captures and replays the decode forward (input ids -> final hidden states) per bucket."""

    def __init__(self, model: CausalLM, kv_cache: KVCache, decode_kernel: DecodeKernel, max_num_seqs: int,
                 max_blocks_per_sequence: int, num_processors: int) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.decode_kernel = decode_kernel
        self.buckets = decode_buckets(max_num_seqs)
        self.num_processors = num_processors
        size, device = self.buckets[-1], kv_cache.device
        self.input_ids = torch.zeros(size, dtype=torch.int64, device=device)
        self.positions = torch.zeros(size, dtype=torch.int64, device=device)
        self.write_slots = torch.zeros(size, dtype=torch.int64, device=device)
        self.block_tables = torch.zeros((size, max_blocks_per_sequence), dtype=torch.int32, device=device)
        self.context_lens = torch.ones(size, dtype=torch.int32, device=device)
        self.row_order = torch.arange(size, dtype=torch.int32, device=device)
        self.identity_order = self.row_order.clone()  # padding rows keep their own place in the order
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, Tensor] = {}  # bucket -> (bucket, hidden) static output
        self.pool = None  # one memory pool shared by all buckets (they never run at the same time)

    def bucket_for(self, num_sequences: int) -> int:
        return next(size for size in self.buckets if size >= num_sequences)

    def num_splits_for(self, num_sequences: int) -> int:
        return decode_num_splits(self.bucket_for(num_sequences), self.kv_cache.num_kv_heads, self.num_processors)

    def run(self, inputs: StepInputs) -> Tensor:
        """inputs of a decode step of S sequences -> final hidden states (S, hidden)."""
        num_sequences = inputs.num_sequences
        bucket = self.bucket_for(num_sequences)
        self._load(inputs, bucket)
        if bucket not in self.graphs:
            self._capture(bucket)
        self.graphs[bucket].replay()
        return self.outputs[bucket][:num_sequences]

    def _load(self, inputs: StepInputs, bucket: int) -> None:
        num_sequences = inputs.num_sequences
        metadata = inputs.attention
        self.input_ids[:num_sequences].copy_(inputs.input_ids)
        self.positions[:num_sequences].copy_(inputs.positions)
        self.write_slots[:num_sequences].copy_(metadata.write_slots)
        self.block_tables[:num_sequences, :metadata.block_tables.shape[1]].copy_(metadata.block_tables)
        self.context_lens[:num_sequences].copy_(metadata.context_lens)
        self.row_order[:num_sequences].copy_(metadata.row_order)
        if bucket > num_sequences:
            self._pad(num_sequences, bucket)

    def _pad(self, start: int, stop: int) -> None:
        """Padding rows: token 0 at position 0, writing and reading one token in the sink block."""
        sink = self.kv_cache.sink_block
        self.input_ids[start:stop].zero_()
        self.positions[start:stop].zero_()
        self.write_slots[start:stop].fill_(sink * self.kv_cache.block_size)
        self.block_tables[start:stop, 0].fill_(sink)
        self.context_lens[start:stop].fill_(1)
        self.row_order[start:stop].copy_(self.identity_order[start:stop])

    def capture_all(self) -> None:
        """Captures every bucket now (largest first, so smaller ones reuse its pool) on padding rows only."""
        for bucket in reversed(self.buckets):
            if bucket not in self.graphs:
                self._pad(0, bucket)
                self._capture(bucket)

    def static_forward(self, bucket: int) -> Callable[[], Tensor]:
        """The decode forward of `bucket` rows over the static buffers: () -> hidden (bucket, hidden)."""
        device = self.kv_cache.device
        metadata = AttentionMetadata(
            write_slots=self.write_slots[:bucket], write_rows=None, block_tables=self.block_tables[:bucket],
            context_lens=self.context_lens[:bucket], query_lens=torch.ones(bucket, dtype=torch.int64, device=device),
            query_token_indices=torch.arange(bucket, device=device), max_query_len=1,
            max_context_len=self.block_tables.shape[1] * self.kv_cache.block_size, is_decode=True,
            num_splits=decode_num_splits(bucket, self.kv_cache.num_kv_heads, self.num_processors),
            row_order=self.row_order[:bucket])
        attention = PagedAttention(self.kv_cache, metadata, self.decode_kernel)
        input_ids, positions = self.input_ids[:bucket], self.positions[:bucket]
        return lambda: self.model(input_ids, positions, attention)

    def _capture(self, bucket: int) -> None:
        forward = self.static_forward(bucket)
        # Warm-up outside the capture compiles the Triton kernels and sets up cuBLAS; it rewrites the same
        # KV the replay writes, so running it on the real step's inputs is harmless.
        forward()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        # thread_local: CUDA calls of other threads (an asyncio loop, a colocated trainer) do not break capture.
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            self.outputs[bucket] = forward()
        if self.pool is None:
            self.pool = graph.pool()
        self.graphs[bucket] = graph

    def clear(self) -> None:
        self.graphs.clear()
        self.outputs.clear()
        self.pool = None
