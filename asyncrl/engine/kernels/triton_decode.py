"""The Triton paged decode-attention kernel of the CUDA path (the fused Gumbel-max sampler is in
`triton_sampler.py`).

Imported only when the engine runs on CUDA (CPU-only installs may lack triton). It runs under Triton's
interpreter on CPU (`TRITON_INTERPRET=1`), which is how `tests/engine/kernels/test_triton_kernels.py` checks it
against the torch paths without a GPU.

Paged decode: one program per (sequence, kv head, context split). It loads the GQA group's query heads
(padded to 16 rows for `tl.dot`), walks its share of the context in tiles of `TILE` positions, gathers
each tile's keys/values through the block table, and keeps an online softmax in fp32. With one split it
writes the normalised output; with several, a second kernel merges the splits' (max, sum, accumulator).
Given the step's new keys/values, split 0 also stores them in the cache and attends to them from registers
(the engine's decode path: no separate cache-write kernels).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from asyncrl.models.rope import apply_rotary

MIN_DOT_SIZE = 16  # tl.dot needs every dimension >= 16
NEGATIVE_LARGE = tl.constexpr(-1.0e30)  # a finite -inf: exp(NEGATIVE_LARGE - m) is 0 without inf - inf = NaN


@triton.jit
def _online_softmax_update(running_max, running_sum, accumulator, scores):
    """Folds scores (G, N) into the online softmax (max, sum, accumulator) of G query heads. Returns the new
    max, the probabilities (G, N) of `scores` under it, the new sum and the rescaled accumulator, to which
    the caller adds the probabilities times the N positions' values."""
    new_max = tl.maximum(running_max, tl.max(scores, 1))
    correction = tl.exp(running_max - new_max)
    probs = tl.exp(scores - new_max[:, None])
    return new_max, probs, running_sum * correction + tl.sum(probs, 1), accumulator * correction[:, None]


@triton.jit
def _attend_cached_tiles(
    query, scale, running_max, running_sum, accumulator, key_cache_ptr, value_cache_ptr, block_tables_ptr,
    sequence, kv_head, start, end, dims, dim_mask, stride_table_sequence, stride_cache_block, stride_cache_token,
    stride_cache_head, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, TILE_IN_BLOCK: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Positions start .. end - 1 of (sequence, kv head), read from the cache through the block table a tile
    of `TILE` positions at a time.

    TILE_IN_BLOCK (the block size a multiple of the tile, and `start` of a tile boundary): every tile lies in
    one block, whose id is one scalar load, and the tile's addresses are a fixed pattern around it. Otherwise
    each position looks up its own block (a gather). Measured on an H200 (0.5B shapes, 256 sequences,
    contexts 640-1,536): on a small cache of shuffled blocks 45 us per layer with 16-position blocks gathered,
    41 us with 128-position blocks read whole; inside the engine (a 110 GB cache, blocks handed out in order)
    both 45.6-45.8 us, so the engine keeps 16-position blocks by default. Dropping the loads' masks did not
    change either number."""
    tile_offsets = tl.arange(0, TILE)
    in_tile_offsets = (tile_offsets * stride_cache_token)[:, None] + dims[None, :]  # (TILE, D), loop-invariant
    for tile_start in range(start, end, TILE):
        positions = tile_start + tile_offsets
        position_mask = positions < end
        if TILE_IN_BLOCK:
            block_id = tl.load(block_tables_ptr + sequence * stride_table_sequence + tile_start // BLOCK_SIZE)
            tile_base = (block_id.to(tl.int64) * stride_cache_block + kv_head * stride_cache_head
                         + (tile_start % BLOCK_SIZE) * stride_cache_token)
            kv_offsets = tile_base + in_tile_offsets
        else:
            block_ids = tl.load(block_tables_ptr + sequence * stride_table_sequence + positions // BLOCK_SIZE,
                                mask=position_mask, other=0).to(tl.int64)
            token_offsets = (block_ids * stride_cache_block + (positions % BLOCK_SIZE) * stride_cache_token
                             + kv_head * stride_cache_head)
            kv_offsets = token_offsets[:, None] + dims[None, :]
        # Masked by position in both paths: a whole-block tile also covers slots past `end`, which may hold NaN
        # written long ago, and a NaN times a zero probability would reach the output.
        kv_mask = position_mask[:, None] & dim_mask[None, :]
        key = tl.load(key_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)  # (TILE, D)
        scores = tl.dot(query, tl.trans(key), input_precision=DOT_PRECISION) * scale  # (G, TILE) fp32
        scores = tl.where(position_mask[None, :], scores, NEGATIVE_LARGE)
        running_max, probs, running_sum, accumulator = _online_softmax_update(running_max, running_sum,
                                                                              accumulator, scores)
        value = tl.load(value_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)  # (TILE, D)
        accumulator += tl.dot(probs.to(value.dtype), value, input_precision=DOT_PRECISION)
    return running_max, running_sum, accumulator


@triton.jit
def _store_and_attend_new_token(
    query, scale, running_max, running_sum, accumulator, new_key_ptr, new_value_ptr, write_slots_ptr,
    key_cache_ptr, value_cache_ptr, sequence, kv_head, dims, dim_mask, stride_key_sequence, stride_key_head,
    stride_value_sequence, stride_value_head, stride_cache_block, stride_cache_token, stride_cache_head,
    BLOCK_SIZE: tl.constexpr,
):
    """Stores the step's new key/value of (sequence, kv head) at its slot and folds it into the online
    softmax from registers: no program reads that slot in this launch, so no ordering is needed."""
    key_offsets = sequence * stride_key_sequence + kv_head * stride_key_head + dims
    value_offsets = sequence * stride_value_sequence + kv_head * stride_value_head + dims
    key = tl.load(new_key_ptr + key_offsets, mask=dim_mask, other=0.0).to(key_cache_ptr.dtype.element_ty)
    value = tl.load(new_value_ptr + value_offsets, mask=dim_mask, other=0.0).to(value_cache_ptr.dtype.element_ty)
    slot = tl.load(write_slots_ptr + sequence)
    slot_offsets = ((slot // BLOCK_SIZE) * stride_cache_block + (slot % BLOCK_SIZE) * stride_cache_token
                    + kv_head * stride_cache_head + dims)
    tl.store(key_cache_ptr + slot_offsets, key, mask=dim_mask)
    tl.store(value_cache_ptr + slot_offsets, value, mask=dim_mask)
    scores = tl.sum(query.to(tl.float32) * key.to(tl.float32)[None, :], 1)[:, None] * scale  # (G, 1)
    running_max, probs, running_sum, accumulator = _online_softmax_update(running_max, running_sum, accumulator,
                                                                          scores)
    return running_max, running_sum, accumulator + probs * value.to(tl.float32)[None, :]


@triton.jit
def _paged_decode_kernel(
    query_ptr, key_cache_ptr, value_cache_ptr, block_tables_ptr, context_lens_ptr,
    output_ptr, partial_output_ptr, partial_max_ptr, partial_sum_ptr,
    new_key_ptr, new_value_ptr, write_slots_ptr, row_order_ptr, stride_key_sequence, stride_key_head,
    stride_value_sequence,
    stride_value_head, scale, stride_query_sequence, stride_query_head,
    stride_cache_block, stride_cache_token, stride_cache_head,
    stride_table_sequence, stride_output_sequence, stride_output_head,
    NUM_HEADS: tl.constexpr, GROUP_SIZE: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, TILE_IN_BLOCK: tl.constexpr,
    NUM_SPLITS: tl.constexpr, DOT_PRECISION: tl.constexpr, WRITE_NEW: tl.constexpr, ORDERED: tl.constexpr,
):
    # Programs start in launch order, the first grid axis fastest: a sequence's (head, split) programs are
    # adjacent, and with a row order the longest contexts start first (no long program starts last).
    kv_head, split, sequence = tl.program_id(0) // NUM_SPLITS, tl.program_id(0) % NUM_SPLITS, tl.program_id(1)
    if ORDERED:
        sequence = tl.load(row_order_ptr + sequence)
    context_len = tl.load(context_lens_ptr + sequence)
    cached_len = context_len - 1 if WRITE_NEW else context_len  # the newest position comes from registers
    tiles_per_split = tl.cdiv(tl.cdiv(cached_len, TILE), NUM_SPLITS)
    start = split * tiles_per_split * TILE
    end = tl.minimum(start + tiles_per_split * TILE, cached_len)

    group = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_PAD)
    heads = kv_head * GROUP_SIZE + group
    head_mask = group < GROUP_SIZE
    dim_mask = dims < HEAD_DIM
    row_mask = head_mask[:, None] & dim_mask[None, :]  # (G, D): the real heads and dimensions
    query_offsets = sequence * stride_query_sequence + heads[:, None] * stride_query_head + dims[None, :]
    query = tl.load(query_ptr + query_offsets, mask=row_mask, other=0.0)  # (G, D)

    running_max, running_sum, accumulator = _attend_cached_tiles(
        query, scale, tl.full([GROUP_PAD], NEGATIVE_LARGE, tl.float32), tl.zeros([GROUP_PAD], tl.float32),
        tl.zeros([GROUP_PAD, HEAD_PAD], tl.float32), key_cache_ptr, value_cache_ptr, block_tables_ptr, sequence,
        kv_head, start, end, dims, dim_mask, stride_table_sequence, stride_cache_block, stride_cache_token,
        stride_cache_head, BLOCK_SIZE, TILE, TILE_IN_BLOCK, DOT_PRECISION)
    if WRITE_NEW:
        if split == 0:
            running_max, running_sum, accumulator = _store_and_attend_new_token(
                query, scale, running_max, running_sum, accumulator, new_key_ptr, new_value_ptr, write_slots_ptr,
                key_cache_ptr, value_cache_ptr, sequence, kv_head, dims, dim_mask, stride_key_sequence,
                stride_key_head, stride_value_sequence, stride_value_head, stride_cache_block, stride_cache_token,
                stride_cache_head, BLOCK_SIZE)

    if NUM_SPLITS == 1:
        output = accumulator / running_sum[:, None]
        output_offsets = sequence * stride_output_sequence + heads[:, None] * stride_output_head + dims[None, :]
        tl.store(output_ptr + output_offsets, output.to(output_ptr.dtype.element_ty), mask=row_mask)
    else:
        partial_index = (sequence * NUM_HEADS + heads) * NUM_SPLITS + split  # (G,)
        tl.store(partial_max_ptr + partial_index, running_max, mask=head_mask)
        tl.store(partial_sum_ptr + partial_index, running_sum, mask=head_mask)
        tl.store(partial_output_ptr + partial_index[:, None] * HEAD_PAD + dims[None, :], accumulator, mask=row_mask)


@triton.jit
def _merge_splits_kernel(
    output_ptr, partial_output_ptr, partial_max_ptr, partial_sum_ptr, stride_output_sequence, stride_output_head,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, NUM_SPLITS: tl.constexpr,
    SPLIT_PAD: tl.constexpr,
):
    sequence = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, SPLIT_PAD)
    dims = tl.arange(0, HEAD_PAD)
    split_mask = splits < NUM_SPLITS
    index = (sequence * NUM_HEADS + head) * NUM_SPLITS + splits  # (P,)
    split_max = tl.load(partial_max_ptr + index, mask=split_mask, other=NEGATIVE_LARGE)
    split_sum = tl.load(partial_sum_ptr + index, mask=split_mask, other=0.0)
    partial = tl.load(partial_output_ptr + index[:, None] * HEAD_PAD + dims[None, :], mask=split_mask[:, None],
                      other=0.0)  # (P, D)
    weights = tl.exp(split_max - tl.max(split_max, 0))  # empty splits: exp(-1e30 - m) = 0
    output = tl.sum(weights[:, None] * partial, 0) / tl.sum(weights * split_sum, 0)
    output_offsets = sequence * stride_output_sequence + head * stride_output_head + dims
    tl.store(output_ptr + output_offsets, output.to(output_ptr.dtype.element_ty), mask=dims < HEAD_DIM)


# Positions per tile x head dimension: each tile loads 8192 key elements (16 KB in bf16). Measured on an H200
# with shuffled blocks (a long-running cache): head_dim 64 (0.5B) 48 us per layer at 128 positions vs 61 us
# at 64; head_dim 128 (1.5B) best at 64 positions.
TILE_ELEMENTS = 8192


def _check_decode_layouts(query: Tensor, key_cache: Tensor, new_key: Tensor | None, new_value: Tensor | None,
                          write_slots: Tensor | None) -> None:
    """The kernel's loads need every head dimension contiguous, and the new-token arguments come together."""
    if new_key is not None and (new_value is None or write_slots is None or new_key.stride(2) != 1
                                or new_value.stride(2) != 1):
        raise ValueError("paged_decode_attention: new_key and new_value (head dimension contiguous) and write_slots "
                         "come together")
    if key_cache.stride(3) != 1 or query.stride(2) != 1:
        raise ValueError("paged_decode_attention needs the head dimension contiguous")


def paged_decode_attention(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_tables: Tensor,
                           context_lens: Tensor, num_splits: int = 1, tile: int | None = None, num_warps: int = 4,
                           num_stages: int = 3, new_key: Tensor | None = None, new_value: Tensor | None = None,
                           write_slots: Tensor | None = None, row_order: Tensor | None = None,
                           rotary: tuple[Tensor, Tensor] | None = None, max_registers: int | None = None,
                           programmatic: bool = False) -> Tensor:
    """query (S, Hq, D) of each sequence's newest token; key/value caches (num_blocks, block_size, Hkv, D);
    block_tables (S, W) int32; context_lens (S,) int32 (>= 1) -> (S, Hq, D) in the query's dtype.
    `num_splits` divides each context among that many programs (more parallelism for small batches);
    `tile` (positions per step of a program) defaults to `TILE_ELEMENTS` // head dimension. A block size that
    is a multiple of the tile reads each tile from one block (one block-id load per tile, not per position).

    With new_key/new_value (S, Hkv, D) and write_slots (S,) int64, the kernel also stores the step's new
    key/value at their slots (the last of each context) and attends to them from registers: one launch per
    layer instead of a cache write (two copies) and an attention launch.

    `row_order` (S,) int32, a permutation of the sequences, is the order their programs start in: longest
    context first keeps a mixed batch's longest programs from starting last (measured on an H200 at 256
    sequences with contexts 640-1536: 52 -> 43 us per layer).

    `rotary` (cos, sin), each (S, D): the query and new key arrive before RoPE; `_rotated` rotates them first.

    `max_registers` caps the registers per thread (ptx .maxnreg), for sweeps only: on an H200 every cap from
    48 to 128 measured slower than the compiler's choice (0.5B: 43.5-55.5 us against 41.0 us per layer).

    `programmatic` is the `DecodeKernel` convention's (the CUDA kernel's early start); a Triton launch is always a
    plain one, so it changes nothing here."""
    query, new_key = _rotated(query, new_key, rotary)
    _check_decode_layouts(query, key_cache, new_key, new_value, write_slots)
    write_new = new_key is not None
    num_sequences, num_heads, head_dim = query.shape
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    group_size = num_heads // num_kv_heads
    head_pad = max(MIN_DOT_SIZE, triton.next_power_of_2(head_dim))
    tile = max(MIN_DOT_SIZE, tile if tile is not None else TILE_ELEMENTS // head_pad)
    output = torch.empty_like(query)
    partial_output = partial_max = partial_sum = output  # unused placeholders when there is one split
    if num_splits > 1:
        partial_max = torch.empty((num_sequences, num_heads, num_splits), dtype=torch.float32, device=query.device)
        partial_sum = torch.empty_like(partial_max)
        partial_output = torch.empty((*partial_max.shape, head_pad), dtype=torch.float32, device=query.device)
    new_key, new_value, write_slots = (new_key, new_value, write_slots) if write_new else (query, query, context_lens)
    _paged_decode_kernel[(num_kv_heads * num_splits, num_sequences)](
        query, key_cache, value_cache, block_tables, context_lens,
        output, partial_output, partial_max, partial_sum,
        new_key, new_value, write_slots, row_order if row_order is not None else context_lens,
        new_key.stride(0), new_key.stride(1), new_value.stride(0), new_value.stride(1),
        head_dim**-0.5, query.stride(0), query.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        block_tables.stride(0), output.stride(0), output.stride(1),
        NUM_HEADS=num_heads, GROUP_SIZE=group_size,
        GROUP_PAD=max(MIN_DOT_SIZE, triton.next_power_of_2(group_size)),
        HEAD_DIM=head_dim, HEAD_PAD=head_pad, BLOCK_SIZE=block_size, TILE=tile, TILE_IN_BLOCK=block_size % tile == 0,
        NUM_SPLITS=num_splits, DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32", WRITE_NEW=write_new,
        ORDERED=row_order is not None, num_warps=num_warps, num_stages=num_stages,
        **({} if max_registers is None else {"maxnreg": max_registers}),
    )
    if num_splits > 1:
        _merge_splits(output, partial_output, partial_max, partial_sum, num_splits)
    return output


def _rotated(query: Tensor, new_key: Tensor | None,
             rotary: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor | None]:
    """The query and new key after RoPE by torch, for a call that hands RoPE to the kernel (`rotary` not None).
    This kernel does not rotate; the CUDA kernel, which the engine folds RoPE into, hands it the calls it does
    not cover."""
    if rotary is None:
        return query, new_key
    return apply_rotary(query, *rotary), None if new_key is None else apply_rotary(new_key, *rotary)


def _merge_splits(output: Tensor, partial_output: Tensor, partial_max: Tensor, partial_sum: Tensor,
                  num_splits: int) -> None:
    """The context splits' partial softmax states merged into `output` (S, Hq, D), in place."""
    num_sequences, num_heads, head_dim = output.shape
    _merge_splits_kernel[(num_sequences, num_heads)](
        output, partial_output, partial_max, partial_sum, output.stride(0), output.stride(1),
        NUM_HEADS=num_heads, HEAD_DIM=head_dim, HEAD_PAD=partial_output.shape[-1], NUM_SPLITS=num_splits,
        SPLIT_PAD=triton.next_power_of_2(num_splits),
    )
