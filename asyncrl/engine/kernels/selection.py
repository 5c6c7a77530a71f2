"""The one place that decides which kernels run an engine step, once, from the engine config and the device.

    kernels = select_kernels(model, config)                            # in `ModelRunner.__init__`
    attention = kernels.attention(kv_cache, metadata)                  # a step's attention backend
    graphs = kernels.decode_graphs(model, kv_cache, sampler, max_num_seqs, max_model_len)   # None: eager decodes

On CPU nothing is chosen (`KernelChoice.torch_paths()`): attention and sampling run the torch paths of
`attention.py` and `sampler.py`. On CUDA:
- decode attention: our CUDA kernel (`cuda_decode`) or the Triton one (`triton_decode`), as
  `EngineConfig.decode_attention` asks; "auto" takes the CUDA kernel where it builds, else Triton with a warning;
- sampling: our CUDA sampler (`cuda_sampler`), or the Triton one (`triton_sampler`) where it cannot be built;
- a decode step's layers: the fused products of `fused_decode` where `EngineConfig.decode_products` asks for them
  and they can run, which starts with their allow-list of families and layer flags
  (`models/layer_features.FUSED_DECODE_LAYERS`), else the model's own layers;
- decode steps replayed from CUDA graphs (`cuda_graph`) unless `enforce_eager`;
- the decoder layers compiled with torch.compile (`EngineConfig.use_compile`), and CUDA's attention kept off the
  cuDNN backend (every prefill has a new shape, and cuDNN plans each one);
- mixture-of-experts layers: the grouped expert products of `grouped_moe`; such a model runs its own layers (the
  fused decode products are dense-only) and no CUDA graphs (tokens per expert change every step, and the engine
  reads each step's routing back).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from asyncrl.engine.attention import AttentionMetadata, DecodeKernel, PagedAttention
from asyncrl.engine.config import EngineConfig
from asyncrl.engine.kernels import fused_decode
from asyncrl.engine.kernels.cuda_graph import DecodeGraphs, decode_num_splits
from asyncrl.engine.kernels.fused_decode import FusedDecodeLayers
from asyncrl.engine.kernels.grouped_moe import install_grouped_experts
from asyncrl.engine.kv_cache import KVCache
from asyncrl.engine.sampler import FusedSampleKernel, Sampler
from asyncrl.models.attention import avoid_per_shape_attention_plans
from asyncrl.models.compile import compile_decoder_layers
from asyncrl.models.layer_features import FUSED_DECODE_LAYERS
from asyncrl.models.lora import has_adapters
from asyncrl.models.transformer import CausalLM

logger = logging.getLogger(__name__)

# A step's layers: (S or N,) token ids and positions and the step's attention -> final-normed hidden states.
Layers = Callable[[Tensor, Tensor, PagedAttention], Tensor]


@dataclass(frozen=True)
class KernelChoice:
    """What runs the hot spots of an engine step; on CPU nothing (`torch_paths`), and the torch paths run."""

    decode_attention: str | None  # the decode-attention kernel that runs, "cuda" or "triton"; None: the torch path
    decode_kernel: DecodeKernel | None
    sample_kernel: FusedSampleKernel | None  # None: the sampler's torch reference
    fused_layers: FusedDecodeLayers | None  # a decode step's layers as fused products; None: the model's layers
    num_processors: int  # the device's SMs (1 on CPU), which the decode kernel's context splits fill
    use_cuda_graphs: bool

    @classmethod
    def torch_paths(cls) -> KernelChoice:
        return cls(decode_attention=None, decode_kernel=None, sample_kernel=None, fused_layers=None, num_processors=1,
                   use_cuda_graphs=False)

    @property
    def rotary_in_decode_kernel(self) -> bool:
        """The CUDA kernel rotates q and the new key itself (one kernel per decode layer fewer); Triton's does not."""
        return self.decode_attention == "cuda"

    def attention(self, kv_cache: KVCache, metadata: AttentionMetadata) -> PagedAttention:
        """The attention backend of a step: decode-kernel launches are programmatic where the fused layers run the
        decode (see `PagedAttention`)."""
        programmatic = self.fused_layers is not None and metadata.is_decode
        return PagedAttention(kv_cache, metadata, self.decode_kernel, self.rotary_in_decode_kernel, programmatic)

    def decode_layers(self, model: CausalLM) -> Layers:
        """What runs a decode step's layers: the fused products where they were loaded, else the model."""
        return model if self.fused_layers is None else self.fused_layers.forward

    def num_splits(self, num_sequences: int, num_kv_heads: int) -> int:
        """Context splits of the decode kernel for a step of `num_sequences` sequences."""
        return decode_num_splits(num_sequences, num_kv_heads, self.num_processors)

    def decode_graphs(self, model: CausalLM, kv_cache: KVCache, sampler: Sampler, max_num_seqs: int,
                      max_model_len: int) -> DecodeGraphs | None:
        """The CUDA graphs that replay decode steps (captured on first use), or None where decodes run eagerly."""
        if not self.use_cuda_graphs:
            return None
        max_blocks = -(-max_model_len // kv_cache.block_size)
        return DecodeGraphs(model, kv_cache, self.decode_kernel, sampler, max_num_seqs, max_blocks, self.num_processors,
                            self.rotary_in_decode_kernel, self.fused_layers)


def select_kernels(model: CausalLM, config: EngineConfig) -> KernelChoice:
    """The kernels `config` asks for on its device, loaded (CUDA extensions are built on first use, a minute or two
    once per machine); on CUDA the model's decoder layers are compiled here too (`config.use_compile`). Call it
    after `fuse_projections` (the fused layers read the stacked weights) and before the KV cache is sized (their
    folded weight copies count as weights)."""
    if not config.is_cuda:
        return KernelChoice.torch_paths()
    avoid_per_shape_attention_plans()  # every prefill has a new (rows, length) shape
    if config.use_compile:
        compile_decoder_layers(model)
    decode_attention, decode_kernel, sample_kernel = load_cuda_kernels(config.decode_attention)
    num_processors = torch.cuda.get_device_properties(config.torch_device).multi_processor_count
    if model.config.is_moe:
        install_grouped_experts(model)
        if config.use_cuda_graphs:
            logger.info("the engine runs decode steps eagerly: CUDA graphs do not hold mixture-of-experts dispatch")
        return KernelChoice(decode_attention, decode_kernel, sample_kernel, None, num_processors, False)
    fused_layers = load_fused_layers(model, config, decode_attention, config.max_num_seqs, num_processors)
    return KernelChoice(decode_attention, decode_kernel, sample_kernel, fused_layers, num_processors,
                        config.use_cuda_graphs)


def load_cuda_kernels(decode_attention: str) -> tuple[str, DecodeKernel, FusedSampleKernel]:
    """The decode-attention kernel `EngineConfig.decode_attention` asks for (with the name of the one that
    runs, "cuda" or "triton"), and the fused sampler (ours in CUDA, or Triton's where it cannot be built)."""
    # Imported here, not at the top: triton ships with CUDA installs only.
    from asyncrl.engine.kernels import cuda_decode, cuda_sampler, triton_decode, triton_sampler
    name, decode_kernel = "triton", triton_decode.paged_decode_attention
    if decode_attention != "triton":
        try:
            name, decode_kernel = "cuda", cuda_decode.load_decode_kernel()
        except RuntimeError as error:
            if decode_attention == "cuda":
                raise
            logger.warning("engine.decode_attention='auto' uses the Triton kernel: %s", error)
    try:
        sample_kernel = cuda_sampler.load_sample_kernel()
    except RuntimeError as error:
        logger.warning("the engine samples with the Triton kernel: %s", error)
        sample_kernel = triton_sampler.fused_sample
    return name, decode_kernel, sample_kernel


def load_fused_layers(model: CausalLM, config: EngineConfig, decode_attention: str | None, max_rows: int,
                      num_processors: int) -> FusedDecodeLayers | None:
    """The fused decode layers `EngineConfig.decode_products` asks for, or None for the model's layers: "fused"
    raises where they cannot run, "auto" logs why and runs the model's layers (also where their launches would
    take more than one wave of the device's SMs, where they are slower)."""
    if config.decode_products == "torch" or not config.is_cuda or config.model_dtype != torch.bfloat16:
        return None
    if has_adapters(model):  # the fused products multiply the stacked base weights only
        if config.decode_products == "fused":
            raise RuntimeError("engine.decode_products='fused' cannot run LoRA adapters; use 'auto' or 'torch'")
        logger.info("engine.decode_products='auto' runs the model's layers: the model has LoRA adapters")
        return None
    reason = FUSED_DECODE_LAYERS.unsupported_reason(model.config)   # a family or layer flag they do not implement
    if reason is not None:
        if config.decode_products == "fused":
            raise RuntimeError(f"engine.decode_products='fused' cannot run this model: {reason}; use 'auto' or "
                               f"'torch'")
        logger.info("engine.decode_products='auto' runs the model's layers: %s", reason)
        return None
    if config.decode_products == "auto":
        reason = fused_decode.slower_reason(model.config, max_rows, num_processors)
        if reason is not None:
            logger.info("engine.decode_products='auto' runs the model's layers: %s", reason)
            return None
    try:
        if decode_attention != "cuda":
            raise RuntimeError(f"the fused decode layers need the CUDA decode-attention kernel, which is not "
                               f"running ({decode_attention})")
        return fused_decode.load_fused_decode_layers(model, max_rows)
    except RuntimeError as error:
        if config.decode_products == "fused":
            raise
        logger.warning("engine.decode_products='auto' runs the model's layers: %s", error)
        return None
