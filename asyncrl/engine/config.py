"""Engine-local knobs: batching limits, KV-cache budget, device and dtype.

    config = EngineConfig.from_rollout(run_config.rollout, device="cuda", dtype=torch.bfloat16)
    config = EngineConfig(device="cpu", num_kv_blocks=64)      # tests: a fixed, small cache
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

import torch

from asyncrl.config.invariants import cuda_decode_takes_block_size
from asyncrl.config.rollout_schema import DecodeAttention, DecodeProducts, RolloutConfig

DECODE_ATTENTION_KERNELS = get_args(DecodeAttention)
DECODE_PRODUCTS = get_args(DecodeProducts)


@dataclass
class EngineConfig:
    """Limits and memory budget of one `LLMEngine`.

    The KV cache takes `gpu_memory_utilization` x device memory minus weights and activations on CUDA,
    `cpu_kv_cache_mb` on CPU (0: sized from the model and the machine); `num_kv_blocks` fixes the block count instead (tests, benchmarks).
    `max_model_len` None means the model's `max_position_embeddings`. `dtype` None means bfloat16 on
    CUDA and float32 on CPU.
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    gpu_memory_utilization: float = 0.5
    cpu_kv_cache_mb: int = 0  # 0: sized from the model and the machine (`kv_cache.plan_cpu_kv_blocks`)
    num_kv_blocks: int | None = None
    max_model_len: int | None = None
    enforce_eager: bool = False
    compile: bool = True  # torch.compile the decoder layers on CUDA (off with enforce_eager, never on CPU)
    # Launch the next decode before postprocessing the current one, overlapping host work with the device
    # (see `LLMEngine.step`); outputs are the same either way.
    async_scheduling: bool = True
    # Reuse the KV of full blocks whose tokens (and every token before them) were computed before, by the same
    # weights: a group's samples admitted in different steps, an agent's next turn, a readmitted request
    # (`block_manager.py`). Log-probs are the same with it off (bitwise on CPU in the tests).
    enable_prefix_caching: bool = True
    # The CUDA decode-attention kernel: "cuda" (the CUDA C++ kernel of `kernels/cuda_decode.py`, built on first use;
    # an error where it cannot be built), "triton" (`kernels/triton_decode.py`), or "auto": "cuda" where it builds,
    # else "triton" with a warning that says why. Calls the CUDA kernel does not cover (fp16/fp32, split contexts,
    # and with "auto" block sizes that are not a power of two from 16) go to Triton either way.
    # "auto" prefers the CUDA kernel: on an H200 its decode steps are 1-2% faster than the Triton kernel's on their
    # own, and the fused decode layers need it.
    decode_attention: str = "auto"
    # The decode step's layers: "fused" (`kernels/fused_decode.py`: four fused CUDA products per layer around
    # attention; Hopper, bf16 and the CUDA attention kernel only; an error where they cannot run), "torch" (the
    # model's layers), or "auto": "fused" where they run, else "torch" with a warning that says why. CPU and fp32
    # runs use "torch".
    decode_products: str = "auto"
    device: str = "cpu"
    dtype: torch.dtype | None = None

    def __post_init__(self) -> None:
        for key in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            value = getattr(self, key)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"engine.{key} must be a positive integer, got {value!r}")
        if not isinstance(self.cpu_kv_cache_mb, int) or self.cpu_kv_cache_mb < 0:
            raise ValueError(f"engine.cpu_kv_cache_mb must be 0 (sized automatically) or a positive integer, "
                             f"got {self.cpu_kv_cache_mb!r}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"engine.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.num_kv_blocks is not None and self.num_kv_blocks <= 0:
            raise ValueError(f"engine.num_kv_blocks must be positive or None, got {self.num_kv_blocks}")
        if self.max_model_len is not None and self.max_model_len <= 1:
            raise ValueError(f"engine.max_model_len must be > 1 or None, got {self.max_model_len}")
        if self.decode_attention not in DECODE_ATTENTION_KERNELS:
            raise ValueError(f"engine.decode_attention must be one of {DECODE_ATTENTION_KERNELS}, "
                             f"got {self.decode_attention!r}")
        if self.decode_products not in DECODE_PRODUCTS:
            raise ValueError(f"engine.decode_products must be one of {DECODE_PRODUCTS}, got {self.decode_products!r}")
        if self.decode_products == "fused" and self.decode_attention == "triton":
            raise ValueError("engine.decode_products='fused' needs engine.decode_attention 'cuda' or 'auto' (the fused "
                             "layers hand RoPE to the CUDA attention kernel), got 'triton'")
        if self.decode_attention == "cuda" and not cuda_decode_takes_block_size(self.block_size):
            raise ValueError(f"engine.decode_attention='cuda' reads KV blocks whose size is a power of two from 16, "
                             f"got engine.block_size={self.block_size}; 'auto' or 'triton' decode with Triton")
        if torch.device(self.device).type not in ("cpu", "cuda"):
            raise ValueError(f"engine.device must be 'cpu' or 'cuda[:i]', got {self.device!r}")

    @property
    def torch_device(self) -> torch.device:
        device = torch.device(self.device)
        if device.type == "cuda" and device.index is None:
            return torch.device("cuda", torch.cuda.current_device())
        return device

    @property
    def is_cuda(self) -> bool:
        return self.torch_device.type == "cuda"

    @property
    def model_dtype(self) -> torch.dtype:
        if self.dtype is not None:
            return self.dtype
        return torch.bfloat16 if self.is_cuda else torch.float32

    @property
    def use_cuda_graphs(self) -> bool:
        return self.is_cuda and not self.enforce_eager

    @property
    def use_compile(self) -> bool:
        return self.is_cuda and self.compile and not self.enforce_eager

    @classmethod
    def weights_dtype(cls, setting: str, is_cuda: bool) -> torch.dtype:
        """The engine's weights for a run's `model.dtype` (auto = bfloat16 on GPU, float32 on CPU)."""
        if setting == "auto":
            return torch.bfloat16 if is_cuda else torch.float32
        return getattr(torch, setting)

    @classmethod
    def from_rollout(cls, rollout: RolloutConfig, device: str = "cpu", dtype: torch.dtype | None = None,
                     **overrides) -> EngineConfig:
        """The engine knobs of a run's `rollout` section; `overrides` set the remaining fields."""
        return cls(max_num_seqs=rollout.max_num_seqs, max_num_batched_tokens=rollout.max_num_batched_tokens,
                   block_size=rollout.block_size, gpu_memory_utilization=rollout.gpu_memory_utilization,
                   cpu_kv_cache_mb=rollout.cpu_kv_cache_mb, enforce_eager=rollout.enforce_eager,
                   decode_attention=rollout.decode_attention, decode_products=rollout.decode_products,
                   enable_prefix_caching=rollout.enable_prefix_caching, device=device,
                   dtype=dtype, **overrides)
