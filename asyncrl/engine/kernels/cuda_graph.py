"""CUDA graphs of the whole decode step, per batch-size bucket, captured lazily on first use.

A decode step of S sequences runs the graphs of the smallest bucket >= S (buckets 1, 2, 4, 8, 16, 32, then
multiples of 32 up to max_num_seqs): one from the uploaded inputs through the forward to the logits, one
for sampling, which writes the tokens and their log-probs for the host and keeps the tokens on the device,
where the next decode (scheduled ahead) gathers its input ids from them inside its own graph. Between the
two, a batch that truncates by top-k / top-p has its thresholds computed eagerly (their sort has
batch-dependent shapes). So the host pays a numpy fill, two copies and two replays per step.

Inputs come from `DecodeStaging`; rows S .. bucket - 1 are padding that writes to and reads from the KV
cache's sink block. Weights are updated in place and the KV cache keeps its address while awake, so graphs
stay valid across weight updates; `clear` drops them when the cache is released (engine sleep).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from asyncrl.engine.attention import AttentionMetadata, DecodeKernel, PagedAttention
from asyncrl.engine.kernels.decode_staging import DecodeStaging
from asyncrl.engine.kernels.fused_decode import FusedDecodeLayers
from asyncrl.engine.kv_cache import KVCache
from asyncrl.engine.sampler import MASK32, Sampler, SamplingInputs, truncation_thresholds
from asyncrl.engine.step_output import StepOutput, recorded_event
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
    """Captures and replays the decode step (uploaded inputs -> sampled tokens) per bucket."""

    def __init__(self, model: CausalLM, kv_cache: KVCache, decode_kernel: DecodeKernel | None, sampler: Sampler,
                 max_num_seqs: int, max_blocks_per_sequence: int, num_processors: int,
                 rotary_in_decode_kernel: bool = False, fused_layers: FusedDecodeLayers | None = None) -> None:
        self.model = model
        # The step's layers: the fused decode products where the runner loaded them, else the model's.
        self.decode_forward = model if fused_layers is None else fused_layers.forward
        self.programmatic_decode = fused_layers is not None  # see `PagedAttention`
        self.kv_cache = kv_cache
        self.decode_kernel = decode_kernel
        self.rotary_in_decode_kernel = rotary_in_decode_kernel  # see `PagedAttention`
        self.sampler = sampler
        self.buckets = decode_buckets(max_num_seqs)
        self.num_processors = num_processors
        size, device = self.buckets[-1], kv_cache.device
        sink_slot = kv_cache.sink_block * kv_cache.block_size
        self.staging = DecodeStaging(size, max_blocks_per_sequence, sink_slot, sink_slot + kv_cache.block_size,
                                     device)
        self.block_tables = torch.zeros((size, max_blocks_per_sequence), dtype=torch.int32, device=device)
        # One logits buffer for every bucket (per-bucket outputs would hold ~1,200 rows of the vocabulary),
        # allocated with the first graph and freed with the graphs (engine sleep gives its memory back).
        self.logits: Tensor | None = None
        # The last step's tokens on the device: a decode scheduled ahead gathers its input ids from them.
        self.sampled_ids = torch.zeros(size, dtype=torch.int64, device=device)
        self.packed = torch.zeros((size, 2), dtype=torch.int32, device=device)  # token id, log-prob bits
        # A ring: the host reads step s's tokens after launching step s + 1.
        self.downloads = [torch.zeros((size, 2), dtype=torch.int32, pin_memory=device.type == "cuda")
                          for _ in range(3)]
        self.next_download = 0
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}  # bucket -> inputs to logits
        self.sample_graphs: dict[int, torch.cuda.CUDAGraph] = {}  # bucket -> logits to sampled tokens
        self.pool = None  # one memory pool shared by all graphs (they never run at the same time)

    def bucket_for(self, num_sequences: int) -> int:
        return next(size for size in self.buckets if size >= num_sequences)

    def num_splits_for(self, num_sequences: int) -> int:
        return decode_num_splits(self.bucket_for(num_sequences), self.kv_cache.num_kv_heads, self.num_processors)

    def launch(self, arrays: dict[str, np.ndarray], tables: np.ndarray, max_top_k: int,
               use_top_p: bool) -> StepOutput:
        """Queues a decode step of S = len(tables) sequences: `arrays` holds each `DecodeStaging` field (S,),
        `tables` the block tables (S, W). A decode ahead (source rows) gathers its input ids from
        `sampled_ids`: the step before it is always a decode, hence graphed (none is scheduled ahead of a
        prefill)."""
        num_rows = tables.shape[0]
        bucket = self.bucket_for(num_rows)
        device_tables = self.staging.upload(arrays, num_rows, bucket, tables)
        self.block_tables[:num_rows, :tables.shape[1]].copy_(device_tables)
        if bucket not in self.graphs:
            self._capture_forward(bucket)
        self.graphs[bucket].replay()
        if max_top_k > 0 or use_top_p:
            self._truncate(num_rows, max_top_k, use_top_p)
        # Captured after the forward's replay: its warm-up run then samples this step's own logits and writes
        # the tokens the replay writes, never over the tokens the forward gathered its inputs from.
        if bucket not in self.sample_graphs:
            self._capture_sample(bucket)
        self.sample_graphs[bucket].replay()
        return self._download(num_rows)

    def _truncate(self, num_rows: int, max_top_k: int, use_top_p: bool) -> None:
        """The top-k / top-p thresholds of the step's rows, written where the sampling graph reads them."""
        field = self.staging.field
        inputs = SamplingInputs(temperatures=field("temperatures", num_rows), top_k=field("top_k", num_rows).long(),
                                top_p=field("top_p", num_rows), keys=field("keys", num_rows), max_top_k=max_top_k,
                                use_top_p=use_top_p)
        field("thresholds", num_rows).copy_(truncation_thresholds(self.logits[:num_rows].float(), inputs))

    def _download(self, num_rows: int) -> StepOutput:
        host = self.downloads[self.next_download][:num_rows]
        self.next_download = (self.next_download + 1) % len(self.downloads)
        host.copy_(self.packed[:num_rows], non_blocking=True)
        return StepOutput(self.sampled_ids[:num_rows], host, recorded_event(self.packed))

    def capture_all(self) -> None:
        """Captures every bucket now (largest first, so smaller ones reuse its pool) on padding rows only."""
        empty = np.zeros((0, 1), dtype=np.int32)
        for bucket in reversed(self.buckets):
            if bucket not in self.graphs:
                self.staging.upload({}, 0, bucket, empty)
                self._capture_forward(bucket)
                self._capture_sample(bucket)

    def static_forward(self, bucket: int) -> Callable[[], None]:
        """The decode forward of `bucket` rows from the staged inputs into `logits[:bucket]`."""
        device, field = self.kv_cache.device, self.staging.field
        query_lens = torch.ones(bucket, dtype=torch.int64, device=device)
        query_token_indices = torch.arange(bucket, device=device)
        num_splits = self.num_splits_for(bucket)
        max_context_len = self.block_tables.shape[1] * self.kv_cache.block_size
        lm_head_weight = self.model.lm_head.weight

        def forward() -> None:
            gathered = self.sampled_ids[field("source_rows", bucket).long()]
            input_ids = torch.where(field("from_host", bucket).bool(), field("input_ids", bucket).long(), gathered)
            metadata = AttentionMetadata(
                write_slots=field("write_slots", bucket).long(), write_rows=None,
                block_tables=self.block_tables[:bucket], context_lens=field("context_lens", bucket),
                query_lens=query_lens, query_token_indices=query_token_indices, max_query_len=1,
                max_context_len=max_context_len, is_decode=True, num_splits=num_splits,
                row_order=field("row_order", bucket))
            attention = PagedAttention(self.kv_cache, metadata, self.decode_kernel, self.rotary_in_decode_kernel,
                                       self.programmatic_decode)
            hidden = self.decode_forward(input_ids, field("positions", bucket), attention)  # int32: the compiled `embed`
            torch.matmul(hidden, lm_head_weight.t(), out=self.logits[:bucket])
        return forward

    def static_sample(self, bucket: int) -> Callable[[], None]:
        """Sampling of `bucket` rows of `logits` into `sampled_ids` and `packed`."""
        field = self.staging.field

        def sample() -> None:
            keys = field("keys", bucket).long() & MASK32  # back from their int32 bit patterns
            token_ids, log_probs = self.sampler.sample(self.logits[:bucket], field("temperatures", bucket),
                                                       field("thresholds", bucket), keys)
            self.sampled_ids[:bucket].copy_(token_ids)
            self.packed[:bucket, 0].copy_(token_ids)
            self.packed[:bucket, 1].copy_(log_probs.view(torch.int32))
        return sample

    def _capture_forward(self, bucket: int) -> None:
        if self.logits is None:
            weight = self.model.lm_head.weight
            self.logits = torch.empty((self.buckets[-1], weight.shape[0]), dtype=weight.dtype, device=weight.device)
        self.graphs[bucket] = self._capture(self.static_forward(bucket))

    def _capture_sample(self, bucket: int) -> None:
        self.sample_graphs[bucket] = self._capture(self.static_sample(bucket))

    def _capture(self, run: Callable[[], None]) -> torch.cuda.CUDAGraph:
        # Warm-up outside the capture compiles the Triton kernels and sets up cuBLAS; it writes what the replay
        # writes (the same KV, logits or tokens), so running it on the real step's inputs is harmless.
        run()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        # thread_local: CUDA calls of other threads (an asyncio loop, a colocated trainer) do not break capture.
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            run()
        if self.pool is None:
            self.pool = graph.pool()
        return graph

    def clear(self) -> None:
        self.graphs.clear()
        self.sample_graphs.clear()
        self.logits = None
        self.pool = None
