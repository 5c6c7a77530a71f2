"""Runs the model on a scheduled batch: flattened inputs -> forward with paged attention -> logits at each
sequence's last token -> sampling on the device -> one small device-to-host copy.

`launch` queues all of it without waiting for the device (async scheduling builds and launches the next
decode meanwhile); `StepOutput.wait` blocks until the sampled tokens are on the host. `run` does both.

On CPU everything is eager torch in fp32. On CUDA the model runs in bf16 (by default), the KV cache is sized by
profiling, and the kernels chosen once by `kernels/selection.py` run the hot spots: decode attention, sampling,
the decode step's layers, and CUDA graphs that replay decode steps (unless `enforce_eager`).
"""

from __future__ import annotations

import contextlib
import itertools
import logging

import torch
import torch.nn.functional as F
from torch import Tensor

from asyncrl.engine.attention import AttentionMetadata
from asyncrl.engine.config import EngineConfig
from asyncrl.engine.kernels.selection import select_kernels
from asyncrl.engine.kv_cache import (
    CUDA_GRAPH_RESERVE_BYTES,
    GpuMemoryPlan,
    KVCache,
    bytes_per_block,
    plan_cpu_kv_blocks,
    plan_gpu_kv_cache,
)
from asyncrl.engine.sampler import Sampler, SamplingInputs
from asyncrl.engine.scheduler import ScheduledBatch
from asyncrl.engine.step_inputs import (
    BlockTableCache,
    SamplingArrayCache,
    StepInputs,
    build_step_inputs,
    decode_graph_arrays,
)
from asyncrl.engine.step_output import StepOutput, start_download
from asyncrl.models.compile import fuse_projections
from asyncrl.models.routing import Routing, routing_dtype
from asyncrl.models.transformer import CausalLM

logger = logging.getLogger(__name__)


class ModelRunner:
    """Owns the model, the KV cache, the sampler and the kernels chosen for the device (`runner.kernels`)."""

    def __init__(self, model: CausalLM, config: EngineConfig, max_model_len: int) -> None:
        self.config = config
        self.device = config.torch_device
        self.max_model_len = max_model_len
        self.block_size = config.block_size
        self.model = model.eval()
        fuse_projections(model.model)  # one q/k/v and one gate/up product per layer
        # Chosen before the KV cache is sized: its profile counts the fused decode layers' folded weight copies.
        self.kernels = select_kernels(model, config)
        self.sampler = Sampler(self.kernels.sample_kernel)
        self.memory_plan: GpuMemoryPlan | None = None
        self.kv_cache = KVCache(model.config, self._plan_num_blocks(), self.block_size, config.model_dtype,
                                self.device)
        self.block_tables_cache = BlockTableCache(self.kv_cache.sink_block)
        self.sampling_cache = SamplingArrayCache()
        self.graphs = self.kernels.decode_graphs(self.model, self.kv_cache, self.sampler, config.max_num_seqs,
                                                 max_model_len)

    def device_guard(self) -> contextlib.AbstractContextManager:
        """Makes the engine's GPU current: `AsyncEngine` steps in pool threads, whose current device is 0."""
        return torch.cuda.device(self.device) if self.config.is_cuda else contextlib.nullcontext()

    def run(self, batch: ScheduledBatch) -> tuple[list[int], list[float]]:
        """Sampled token id and its log-prob for every sequence of `batch`, in order."""
        return self.launch(batch).wait()

    @torch.inference_mode()
    def launch(self, batch: ScheduledBatch, previous: StepOutput | None = None) -> StepOutput:
        """Queues the step on the device and returns without waiting for it. A decode scheduled ahead
        (`batch.source_rows`) takes its input ids from `previous`, the step launched before it."""
        with self.device_guard():
            if self.graphs is not None and not batch.is_prefill:
                arrays, tables = decode_graph_arrays(batch, self.block_size, self.block_tables_cache,
                                                     self.sampling_cache)
                return self.graphs.launch(arrays, tables, self.sampling_cache.max_top_k,
                                          self.sampling_cache.use_top_p)
            num_splits = self.kernels.num_splits(batch.num_sequences, self.kv_cache.num_kv_heads)
            inputs = build_step_inputs(batch, self.block_size, self.block_tables_cache, self.sampling_cache,
                                       self.device, num_splits, previous.token_ids if previous is not None else None)
            routing = Routing() if self.model.config.is_moe else None
            hidden = self._forward(inputs, routing)  # (S, hidden) at each sequence's last token
            # In the model dtype: the fused sampler widens bf16 in registers (a float32 copy of (S, V) logits
            # would cost more than the sampling itself); the torch paths widen first.
            logits = self.model.lm_head(hidden)  # (S, V)
            token_ids, log_probs = self.sampler(logits, inputs.sampling)
            return start_download(token_ids, log_probs, self._routed_experts(routing))

    def _forward(self, inputs: StepInputs, routing: Routing | None) -> Tensor:
        attention = self.kernels.attention(self.kv_cache, inputs.attention)
        if routing is not None:  # MoE: the model's own layers (the fused decode layers are dense-only)
            hidden = self.model(inputs.input_ids, inputs.positions, attention, routing=routing)
        else:
            layers = self.kernels.decode_layers(self.model) if inputs.is_decode else self.model
            hidden = layers(inputs.input_ids, inputs.positions, attention)  # (N, hidden)
        return hidden[inputs.last_token_indices]

    def _routed_experts(self, routing: Routing | None) -> Tensor | None:
        """(N, L, k) the experts of the step's computed tokens in the compact record dtype, or None (dense)."""
        if routing is None:
            return None
        dtype = torch.uint8 if routing_dtype(self.model.config.num_experts).itemsize == 1 else torch.int16
        return routing.stacked_expert_ids().to(dtype)

    def weights_updated(self) -> None:
        """Called after the model's weights were written in place: refreshes what is derived from them."""
        if self.kernels.fused_layers is not None:
            with self.device_guard():
                self.kernels.fused_layers.refresh_weights()

    @torch.inference_mode()
    def warm_up(self) -> None:
        """Captures all decode graphs now instead of on first use (no-op without CUDA graphs)."""
        if self.graphs is not None:
            with self.device_guard():
                self.graphs.capture_all()

    def sleep(self) -> None:
        """Frees the KV cache (and the graphs, which point into it)."""
        if self.graphs is not None:
            self.graphs.clear()
        self.kv_cache.release()
        if self.config.is_cuda:
            with self.device_guard():
                torch.cuda.empty_cache()

    def wake(self) -> None:
        """Reallocates the KV cache with the same shape; graphs are recaptured on first use."""
        self.kv_cache.allocate()

    def _plan_num_blocks(self) -> int:
        block_bytes = bytes_per_block(self.model.config, self.block_size, self.config.model_dtype)
        if self.config.num_kv_blocks is not None:
            return self.config.num_kv_blocks
        if not self.config.is_cuda:
            return plan_cpu_kv_blocks(block_bytes, self.block_size, self.config.cpu_kv_cache_mb,
                                      self.config.max_num_seqs, self.max_model_len)
        with self.device_guard():
            self.memory_plan = self._profile_memory()
        logger.info("engine memory: %s", self.memory_plan.describe())
        num_blocks = self.memory_plan.kv_cache_bytes // block_bytes
        if num_blocks <= 0:
            raise ValueError(
                f"no device memory left for the KV cache ({self.memory_plan.describe()}); raise "
                f"rollout.gpu_memory_utilization or lower rollout.max_num_batched_tokens")
        return num_blocks

    @torch.inference_mode()
    def _profile_memory(self) -> GpuMemoryPlan:
        """Measures the activation peak of the largest prefill plus sampling, like vLLM's profiling run."""
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        tensors = itertools.chain(self.model.parameters(), self.model.buffers())
        weight_bytes = sum(tensor.numel() * tensor.element_size() for tensor in tensors)
        if self.kernels.fused_layers is not None:  # the folded weight copies count as weights
            weight_bytes += self.kernels.fused_layers.num_bytes
        allocated_before = torch.cuda.memory_allocated(self.device)
        self._profile_step()
        torch.cuda.synchronize(self.device)
        activation_bytes = torch.cuda.max_memory_allocated(self.device) - allocated_before
        torch.cuda.empty_cache()
        free_bytes, total_bytes = torch.cuda.mem_get_info(self.device)
        graph_reserve = CUDA_GRAPH_RESERVE_BYTES if self.config.use_cuda_graphs else 0
        return plan_gpu_kv_cache(total_bytes, self.config.gpu_memory_utilization, weight_bytes, activation_bytes,
                                 graph_reserve, free_bytes)

    def _profile_step(self) -> None:
        """A prefill of max_num_batched_tokens tokens (rows of up to max_model_len) that writes no KV, then
        logits and top-k/top-p sampling for max_num_seqs rows."""
        num_tokens = self.config.max_num_batched_tokens
        row_length = min(self.max_model_len, num_tokens)
        lengths = [row_length] * (num_tokens // row_length)
        if num_tokens % row_length:
            lengths.append(num_tokens % row_length)
        device, lengths_tensor = self.device, torch.tensor(lengths, device=self.device)
        token_indices = torch.cat([row * row_length + torch.arange(length, device=device)
                                   for row, length in enumerate(lengths)])
        metadata = AttentionMetadata(
            write_slots=torch.zeros(0, dtype=torch.int64, device=device),
            write_rows=torch.zeros(0, dtype=torch.int64, device=device),
            block_tables=torch.zeros((len(lengths), 1), dtype=torch.int32, device=device),
            context_lens=lengths_tensor.to(torch.int32), query_lens=lengths_tensor,
            query_token_indices=token_indices, max_query_len=row_length, max_context_len=row_length,
            is_decode=False, query_starts=F.pad(lengths_tensor.cumsum(0), (1, 0)).to(torch.int32))
        scratch_cache = KVCache(self.model.config, 1, self.block_size, self.config.model_dtype, device)
        positions = torch.cat([torch.arange(length, device=device) for length in lengths])
        input_ids = torch.zeros(num_tokens, dtype=torch.int64, device=device)
        hidden = self.model(input_ids, positions, self.kernels.attention(scratch_cache, metadata))
        num_rows = min(self.config.max_num_seqs, num_tokens)
        logits = self.model.compute_logits(hidden[:num_rows])
        ones = torch.ones(num_rows, device=device)
        sampling = SamplingInputs(temperatures=ones, top_k=torch.full((num_rows,), 50, device=device),
                                  top_p=ones * 0.9, keys=torch.zeros(num_rows, dtype=torch.int64, device=device),
                                  max_top_k=50, use_top_p=True)
        self.sampler(logits, sampling)
