"""The paged KV cache tensor and the arithmetic that sizes it.

Layout: one tensor (num_layers, 2, num_blocks + 1, block_size, Hkv, D); [layer, 0] holds keys and
[layer, 1] values. Block `num_blocks` is a sink: padded rows of a CUDA-graph decode batch write there and
read it, so the real blocks 0 .. num_blocks - 1 are never touched by padding.

Sizing on CUDA (`plan_gpu_kv_cache`), with the numbers logged at start:
    budget        = gpu_memory_utilization x total device memory
    kv_bytes      = budget - weights - activation peak (profiled) - CUDA-graph reserve
    kv_bytes      = min(kv_bytes, free memory after profiling - activation peak - graph reserve)
    num_blocks    = kv_bytes // bytes per block
and on CPU num_blocks = cpu_kv_cache_mb MiB // bytes per block, or with cpu_kv_cache_mb 0 (the default) what
`plan_cpu_kv_blocks` sizes from the model and the machine: max_num_seqs sequences of max_model_len tokens, within
an eighth of the memory available at start (at most 4 GiB, at least 16 MiB).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import Tensor

from asyncrl.models.model_config import TransformerConfig

MIB = 2**20
# Private memory pool of the captured decode graphs (their activations for the largest bucket).
CUDA_GRAPH_RESERVE_BYTES = 512 * MIB


def bytes_per_block(config: TransformerConfig, block_size: int, dtype: torch.dtype) -> int:
    """Keys and values of `block_size` positions across all layers and kv heads."""
    element_size = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * block_size * config.num_key_value_heads * config.head_dim * element_size


# The automatic CPU budget's bounds: a share of the memory available at start (an engine shares the machine
# with its trainer and other replicas), a ceiling, and a floor that holds a few sequences of a tiny model.
CPU_AUTO_MEMORY_SHARE = 8
CPU_AUTO_MAX_BYTES = 4096 * MIB
CPU_AUTO_MIN_BYTES = 16 * MIB


def available_memory_bytes() -> int:
    """MemAvailable of /proc/meminfo (Linux), else the physical pages free."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def plan_cpu_kv_blocks(block_bytes: int, block_size: int, cpu_kv_cache_mb: int, max_num_seqs: int,
                       max_model_len: int) -> int:
    """CPU KV blocks: `cpu_kv_cache_mb` MiB when set (> 0), else enough for `max_num_seqs` sequences of
    `max_model_len` tokens within the bounds above."""
    if cpu_kv_cache_mb > 0:
        return cpu_kv_cache_mb * MIB // block_bytes
    wanted = max_num_seqs * -(-max_model_len // block_size) * block_bytes
    ceiling = min(available_memory_bytes() // CPU_AUTO_MEMORY_SHARE, CPU_AUTO_MAX_BYTES)
    return max(min(wanted, ceiling), CPU_AUTO_MIN_BYTES) // block_bytes


@dataclass(frozen=True)
class GpuMemoryPlan:
    """Every term of the CUDA KV-cache sizing, in bytes, so that the log explains the block count."""

    total_bytes: int
    budget_bytes: int
    weight_bytes: int
    activation_bytes: int
    graph_reserve_bytes: int
    free_bytes_after_profile: int
    kv_cache_bytes: int

    def describe(self) -> str:
        gib = 2**30
        return (f"total {self.total_bytes / gib:.2f} GiB, budget {self.budget_bytes / gib:.2f} GiB, "
                f"weights {self.weight_bytes / gib:.2f} GiB, activations {self.activation_bytes / gib:.2f} GiB, "
                f"graph reserve {self.graph_reserve_bytes / gib:.2f} GiB, free after profiling "
                f"{self.free_bytes_after_profile / gib:.2f} GiB -> KV cache {self.kv_cache_bytes / gib:.2f} GiB")


def plan_gpu_kv_cache(total_bytes: int, gpu_memory_utilization: float, weight_bytes: int, activation_bytes: int,
                      graph_reserve_bytes: int, free_bytes_after_profile: int) -> GpuMemoryPlan:
    """The KV-cache byte budget on CUDA: what the engine may take minus what it already needs, capped by
    what is actually free (another tenant of the device may hold memory)."""
    budget = int(gpu_memory_utilization * total_bytes)
    from_budget = budget - weight_bytes - activation_bytes - graph_reserve_bytes
    from_free = free_bytes_after_profile - activation_bytes - graph_reserve_bytes
    return GpuMemoryPlan(total_bytes, budget, weight_bytes, activation_bytes, graph_reserve_bytes,
                         free_bytes_after_profile, max(0, min(from_budget, from_free)))


class KVCache:
    """Owns the cache tensor; `release` frees it (engine sleep) and `allocate` brings it back (wake)."""

    def __init__(self, config: TransformerConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        if num_blocks <= 0:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        self.num_layers = config.num_hidden_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.dtype = dtype
        self.device = device
        self.tensor: Tensor | None = None  # (L, 2, num_blocks + 1, block_size, Hkv, D)
        self.allocate()

    @property
    def sink_block(self) -> int:
        return self.num_blocks

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def is_allocated(self) -> bool:
        return self.tensor is not None

    def allocate(self) -> None:
        if self.tensor is None:
            shape = (self.num_layers, 2, self.num_blocks + 1, self.block_size, self.num_kv_heads, self.head_dim)
            # Zeros, not empty: a NaN left in memory would leak through masked attention weights of 0 * NaN.
            self.tensor = torch.zeros(shape, dtype=self.dtype, device=self.device)

    def release(self) -> None:
        self.tensor = None

    def layer(self, layer_index: int) -> tuple[Tensor, Tensor]:
        """Key and value caches of one layer, each (num_blocks + 1, block_size, Hkv, D)."""
        if self.tensor is None:
            raise RuntimeError("the KV cache is released (engine asleep); call wake() first")
        return self.tensor[layer_index, 0], self.tensor[layer_index, 1]

    def write(self, layer_index: int, key: Tensor, value: Tensor, rows: Tensor | None, slots: Tensor) -> None:
        """Stores key/value (N, Hkv, D) rows into flat slots (block * block_size + offset).

        rows None writes row i to slots[i]; otherwise row rows[j] goes to slots[j] (a prompt's tail KV is
        written once per sequence that shares the prompt)."""
        key_cache, value_cache = self.layer(layer_index)
        if rows is not None:
            key, value = key[rows], value[rows]
        key_cache.view(-1, self.num_kv_heads, self.head_dim).index_copy_(0, slots, key.to(self.dtype))
        value_cache.view(-1, self.num_kv_heads, self.head_dim).index_copy_(0, slots, value.to(self.dtype))
