"""The paged `AttentionBackend` of one engine step.

`PagedAttention.attend` writes the step's new keys/values into the KV cache and attends:
- CPU (and any device without Triton): `torch_paged_attention` gathers each row's cached context through
  its block table and runs masked SDPA; exact in fp32, handles cached context of any length.
- CUDA prefill: where every prefill row starts at position 0, attention needs only the new tokens:
  `dense_prefill_attention` runs the variable-length flash kernel on them (bf16) or causal SDPA on padded
  rows. A prefill with a row that starts past a cached prefix (the prefix cache) takes the torch path, which
  reads the cached context through the block tables.
- CUDA decode: a `DecodeKernel` (the CUDA C++ kernel of `kernels/cuda_decode.py`, or the Triton kernel of
  `kernels/triton_decode.py`: `EngineConfig.decode_attention`) stores the new keys/values itself
  and reads KV blocks through the block table without materialising padded KV.

A "row" is one computed token sequence: in a prefill the leader of a group, in a decode one sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from asyncrl.engine.kv_cache import KVCache
from asyncrl.models.attention import causal_attention, varlen_causal_attention


class DecodeKernel(Protocol):
    """The decode-attention kernels' calling convention (`kernels/triton_decode.py`, `kernels/cuda_decode.py`), as
    the engine uses it."""

    def __call__(self, query: Tensor, key_cache: Tensor, value_cache: Tensor, block_tables: Tensor,
                 context_lens: Tensor, num_splits: int, *, new_key: Tensor, new_value: Tensor,
                 write_slots: Tensor, row_order: Tensor | None, rotary: tuple[Tensor, Tensor] | None,
                 programmatic: bool) -> Tensor:
        """query (S, Hq, D); caches (num_blocks + 1, block_size, Hkv, D); block_tables (S, W) int32;
        context_lens (S,) int32 including the new token; new_key/new_value (S, Hkv, D) stored at write_slots
        (S,) by the kernel; row_order (S,) int32 the order the sequences' programs start in (None: as given);
        rotary None, or (cos, sin) (S, D) when query and new_key arrive before RoPE; programmatic: the kernel
        may start, and read the cache, before the kernel before it has finished -> (S, Hq, D)."""
        ...


@dataclass
class AttentionMetadata:
    """Where the step's tokens go in the cache and what each row attends to. R rows, N new tokens."""

    write_slots: Tensor  # (W,) int64 flat slots (block * block_size + offset) receiving new key/value rows
    write_rows: Tensor | None  # (W,) int64 rows of the new key/value to store; None = rows 0 .. W - 1
    block_tables: Tensor  # (R, max_blocks) int32 physical block ids, padded with the sink block
    context_lens: Tensor  # (R,) int32 cached tokens per row after this step's write (attended length)
    query_lens: Tensor  # (R,) int64 new tokens per row: the row's last query_lens positions
    # (N,) int64 index r * max_query_len + t of each new token in a right-padded (R, max_query_len) layout;
    # integer indices, not a boolean mask, because boolean indexing synchronises the device.
    query_token_indices: Tensor
    max_query_len: int
    max_context_len: int
    is_decode: bool  # every row has exactly one new token, the last of its context
    num_splits: int = 1  # context splits of the decode kernel (a static choice per CUDA-graph bucket)
    # (R,) int32 decode rows by descending context length: the decode kernel starts their programs in this
    # order, so the longest finish early enough (a batch's contexts differ by up to thousands of tokens).
    row_order: Tensor | None = None
    # (R + 1,) int32 cumulative query lengths of a prefill, whose rows' new tokens lie back to back in token
    # order: the variable-length attention kernel's row bounds. None for decodes.
    query_starts: Tensor | None = None
    # Some prefill row starts past position 0 (its prefix's KV came from the prefix cache): its new tokens attend
    # to cached context, which only the paged path reads.
    has_cached_context: bool = False


class PagedAttention:
    """`AttentionBackend` over a `KVCache` for one step; `decode_kernel` None selects the torch path.

    `rotary_in_decode_kernel`: a decode step hands RoPE to the decode kernel (`rotates`), which rotates the
    query and the new key as it loads them. The engine sets it for the CUDA kernel, where that saves the step
    one rotary kernel per layer; the Triton kernel would only rotate them by torch first.

    `programmatic_decode`: decode-kernel launches are programmatic dependent launches. The engine sets it where the
    fused decode layers run: their q/k/v product lets the kernel after it launch once past its own wait, so the
    kernel fetches its first cache tiles while q/k/v finishes (decode steps 3.6% faster on an H200). After the
    model's own layers nothing launches early, so there the kernel could only wait at its start: a programmatic
    launch measured 1.2% slower there."""

    def __init__(self, kv_cache: KVCache, metadata: AttentionMetadata, decode_kernel: DecodeKernel | None,
                 rotary_in_decode_kernel: bool = False, programmatic_decode: bool = False) -> None:
        self.kv_cache = kv_cache
        self.metadata = metadata
        self.decode_kernel = decode_kernel
        self.rotates = rotary_in_decode_kernel and decode_kernel is not None and metadata.is_decode
        self.programmatic_decode = programmatic_decode
        self.context_gather: ContextGather | None = None  # the torch path's, built by the first layer

    def attend(self, layer_index: int, query: Tensor, key: Tensor, value: Tensor,
               rotary: tuple[Tensor, Tensor] | None = None) -> Tensor:
        metadata = self.metadata
        if self.rotates != (rotary is not None):
            raise ValueError(f"PagedAttention (rotates={self.rotates}) was given rotary={rotary is not None}: "
                             f"cos/sin go with, and only with, a backend that rotates")
        key_cache, value_cache = self.kv_cache.layer(layer_index)
        if self.decode_kernel is not None and metadata.is_decode:
            # The kernel stores the new key/value itself: one launch per layer instead of three. The kernel before
            # it is the layer's q/k/v product, which writes no cache, so it may start early.
            return self.decode_kernel(query, key_cache, value_cache, metadata.block_tables, metadata.context_lens,
                                      metadata.num_splits, new_key=key, new_value=value,
                                      write_slots=metadata.write_slots, row_order=metadata.row_order,
                                      rotary=rotary, programmatic=self.programmatic_decode)
        self.kv_cache.write(layer_index, key, value, metadata.write_rows, metadata.write_slots)
        if self.decode_kernel is None or metadata.has_cached_context:
            if self.context_gather is None:
                self.context_gather = ContextGather.of(metadata, key_cache.shape[1])
            return torch_paged_attention(query, key_cache, value_cache, metadata, self.context_gather)
        return dense_prefill_attention(query, key, value, metadata)


@dataclass(frozen=True)
class ContextGather:
    """What the torch path's layers of one step share: the blocks of every row's context, flattened, and the
    causal mask over the gathered positions. Built once per step, not once per layer."""

    block_ids: Tensor  # (R * B,) int64 physical blocks, row by row: B = the blocks of the longest context
    mask: Tensor  # (R, 1, T, B * block_size) bool: query t of row r sees gathered position k

    @classmethod
    def of(cls, metadata: AttentionMetadata, block_size: int) -> "ContextGather":
        num_blocks = -(-metadata.max_context_len // block_size)
        block_ids = metadata.block_tables[:, :num_blocks].flatten().long()
        device = block_ids.device
        first_positions = metadata.context_lens.long() - metadata.query_lens  # (R,)
        query_positions = first_positions[:, None] + torch.arange(metadata.max_query_len, device=device)  # (R, T)
        key_positions = torch.arange(num_blocks * block_size, device=device)  # (K,)
        return cls(block_ids, (key_positions[None, None, :] <= query_positions[:, :, None])[:, None])


def torch_paged_attention(query: Tensor, key_cache: Tensor, value_cache: Tensor, metadata: AttentionMetadata,
                          gather: ContextGather | None = None) -> Tensor:
    """Reference paged attention: query (N, Hq, D) of the new tokens -> (N, Hq, D).

    Each row's context (its first `context_lens[r]` cached positions) is gathered block by block; the new
    tokens of a row are its last positions, so query t of a row with q new tokens and context c sits at
    position c - q + t and sees keys 0 .. c - q + t. `gather` is the step's `ContextGather` (built here when
    None). The blocks are gathered with `index_select` over the flat block ids: one contiguous copy per
    block, where advanced indexing of (R, B) ids took half as long again (a 3M-parameter model's CPU decode
    step spends most of its attention time in this copy)."""
    gather = gather or ContextGather.of(metadata, key_cache.shape[1])
    num_rows = metadata.block_tables.shape[0]
    keys = key_cache.index_select(0, gather.block_ids).view(num_rows, -1, *key_cache.shape[2:])  # (R, K, Hkv, D)
    values = value_cache.index_select(0, gather.block_ids).view(num_rows, -1, *value_cache.shape[2:])
    # A decode step's tokens are its rows, one each and in row order: no padding to add or remove.
    one_per_row = metadata.is_decode and query.shape[0] == num_rows
    padded_query = query[:, None] if one_per_row else pad_rows(query, metadata)  # (R, T, Hq, D)
    output = F.scaled_dot_product_attention(
        padded_query.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
        attn_mask=gather.mask, enable_gqa=query.shape[1] != keys.shape[2],
    ).transpose(1, 2)  # (R, T, Hq, D)
    return output[:, 0] if one_per_row else unpad_rows(output, metadata)


def pad_rows(tensor: Tensor, metadata: AttentionMetadata) -> Tensor:
    """(N, H, D) new tokens -> (R, T_max, H, D) right-padded rows (zeros in the padding)."""
    num_rows = metadata.block_tables.shape[0]
    padded = tensor.new_zeros(num_rows * metadata.max_query_len, *tensor.shape[1:])
    padded.index_copy_(0, metadata.query_token_indices, tensor)
    return padded.view(num_rows, metadata.max_query_len, *tensor.shape[1:])


def unpad_rows(padded: Tensor, metadata: AttentionMetadata) -> Tensor:
    """(R, T_max, H, D) -> (N, H, D) in token order."""
    return padded.reshape(-1, *padded.shape[2:]).index_select(0, metadata.query_token_indices)


def dense_prefill_attention(query: Tensor, key: Tensor, value: Tensor, metadata: AttentionMetadata) -> Tensor:
    """Causal attention among the new tokens of rows that all start at position 0: query (N, Hq, D),
    key/value (N, Hkv, D) -> (N, Hq, D). In bf16/fp16 by the variable-length flash kernel on the packed
    tokens; otherwise (fp32) computed on right-padded (R, T_max) rows."""
    if metadata.query_starts is not None and query.dtype in (torch.bfloat16, torch.float16):
        return varlen_causal_attention(query, key, value, metadata.query_starts, metadata.max_query_len)
    # Right padding is harmless under a causal mask: no real token sees a later padded one.
    output = causal_attention(pad_rows(query, metadata), pad_rows(key, metadata), pad_rows(value, metadata),
                              grouped=query.shape[1] != key.shape[1])
    return unpad_rows(output, metadata)
