"""The CUDA C++ paged decode-attention kernel (`csrc/paged_decode_kernel.cuh`, torch entry `csrc/paged_decode.cu`),
built on first use.

    kernel = load_decode_kernel()      # RuntimeError where it cannot be built
    output = kernel(query, key_cache, value_cache, block_tables, context_lens, 1, new_key=..., ...)

Same calling convention and results as `triton_decode.paged_decode_attention` (the engine's `DecodeKernel`),
for the cases it covers: bf16, head dimension 64 or 128, at most 8 query heads per KV head, blocks of a power of
two positions (at least 16), one context split. Anything else (fp16/fp32, the small batches that split their contexts)
goes to the Triton kernel, so the engine never needs to know which one ran.

It is built with torch's extension builder (nvcc and ninja, the CUDA toolkit torch was built against) into
torch's extension cache, once per machine. Where that fails (no toolkit), `load_decode_kernel` raises, naming
the cause; the engine's default, `decode_attention="auto"`, then runs the Triton kernel and logs why
(`selection.load_cuda_kernels`).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from asyncrl.config.invariants import cuda_decode_takes_block_size
from asyncrl.engine.attention import DecodeKernel
from asyncrl.engine.kernels import triton_decode
from asyncrl.engine.kernels.cuda_build import SOURCES, build_extension

ENTRY = SOURCES / "paged_decode.cu"  # the torch entry; it includes the kernel, paged_decode_kernel.cuh
_DECLARATION = ("torch::Tensor paged_decode(torch::Tensor query, torch::Tensor key_cache, torch::Tensor value_cache, "
                "torch::Tensor block_tables, torch::Tensor context_lens, torch::Tensor new_key, "
                "torch::Tensor new_value, torch::Tensor write_slots, std::optional<torch::Tensor> row_order, "
                "std::optional<torch::Tensor> cos, std::optional<torch::Tensor> sin, int64_t warps, int64_t stages, "
                "bool programmatic);")
MAX_GROUP = 8  # query heads per KV head: the rows of one tensor-core fragment


@functools.cache
def _extension():
    return build_extension("asyncrl_paged_decode", ENTRY, _DECLARATION, ["paged_decode"])


def covers(query: Tensor, key_cache: Tensor, num_splits: int) -> bool:
    """Whether the CUDA kernel handles this call (else the Triton kernel does)."""
    num_heads, head_dim = query.shape[1], query.shape[2]
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    return (num_splits == 1 and query.dtype == torch.bfloat16 and key_cache.dtype == torch.bfloat16
            and head_dim in (64, 128) and cuda_decode_takes_block_size(block_size)
            and num_heads // num_kv_heads <= MAX_GROUP
            and query.stride(1) % 8 == 0 and query.stride(0) % 8 == 0)


def paged_decode_attention(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_tables: Tensor,
                           context_lens: Tensor, num_splits: int = 1, *, new_key: Tensor, new_value: Tensor,
                           write_slots: Tensor, row_order: Tensor | None = None,
                           rotary: tuple[Tensor, Tensor] | None = None, programmatic: bool = False,
                           num_warps: int = 4, num_stages: int = 3) -> Tensor:
    """`DecodeKernel`: the CUDA kernel where it `covers` the call, the Triton kernel elsewhere. With `rotary`
    the CUDA kernel rotates the query and the new key itself (no rotary kernel before it).

    `programmatic`: launch the CUDA kernel as a programmatic dependent launch. It then starts while the kernel
    before it finishes and requests its first tiles of the cache before waiting for it, so that kernel must not
    write the cache (in the engine it is the q/k/v product); a caller that has just written the cache leaves it
    False."""
    if not covers(query, key_cache, num_splits):
        return triton_decode.paged_decode_attention(query, key_cache, value_cache, block_tables, context_lens,
                                                     num_splits, new_key=new_key, new_value=new_value,
                                                     write_slots=write_slots, row_order=row_order, rotary=rotary,
                                                     programmatic=programmatic)
    cos, sin = (None, None) if rotary is None else rotary
    return _extension().paged_decode(query, key_cache, value_cache, block_tables, context_lens, new_key, new_value,
                                     write_slots, row_order, cos, sin, num_warps, num_stages, programmatic)


def load_decode_kernel() -> DecodeKernel:
    """The CUDA kernel, built now (a minute the first time on a machine)."""
    try:
        _extension()
    except Exception as error:  # no CUDA toolkit, a compiler error: say which, and what to set instead
        raise RuntimeError(f"the CUDA decode-attention kernel could not be built "
                           f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); "
                           f"engine.decode_attention='triton' does without it") from error
    return paged_decode_attention
