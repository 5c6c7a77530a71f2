"""Triton kernels of the CUDA path: paged decode attention and the fused Gumbel-max sampler.

Imported only when the engine runs on CUDA (CPU-only installs may lack triton). Both kernels run under
Triton's interpreter on CPU (`TRITON_INTERPRET=1`), which is how `tests/engine/test_triton_kernels.py`
checks them against the torch paths without a GPU.

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
from triton.language.extra import libdevice
from torch import Tensor

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
    PADDED_DIMS: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Positions start .. end - 1 of (sequence, kv head), read from the cache through the block table a tile
    of `TILE` positions at a time.

    TILE_IN_BLOCK (the block size a multiple of the tile, and `start` of a tile boundary): every tile lies in
    one block, whose id is one scalar load, and the tile's addresses are a fixed pattern around it. Otherwise
    each position looks up its own block (a gather). Measured on an H200 (0.5B shapes, 256 sequences,
    contexts 640-1,536): on a small cache of shuffled blocks 45 us per layer with 16-position blocks gathered,
    41 us with 128-position blocks read whole; inside the engine (a 110 GB cache, blocks handed out in order)
    both 45.6-45.8 us, so the engine keeps 16-position blocks by default.

    A whole-block tile's keys load without a position mask (the block belongs to the sequence, and the
    scores of positions from `end` on are replaced before the softmax, NaN included); its values keep the
    mask, since a stale NaN times a zero probability would still reach the output."""
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
        if PADDED_DIMS:
            value_mask = position_mask[:, None] & dim_mask[None, :]
            if TILE_IN_BLOCK:
                key = tl.load(key_cache_ptr + kv_offsets, mask=dim_mask[None, :], other=0.0)  # (TILE, D)
            else:
                key = tl.load(key_cache_ptr + kv_offsets, mask=value_mask, other=0.0)
        else:
            # An unpadded head dimension needs no mask along it.
            value_mask = position_mask[:, None]
            if TILE_IN_BLOCK:
                key = tl.load(key_cache_ptr + kv_offsets)
            else:
                key = tl.load(key_cache_ptr + kv_offsets, mask=value_mask, other=0.0)
        scores = tl.dot(query, tl.trans(key), input_precision=DOT_PRECISION) * scale  # (G, TILE) fp32
        scores = tl.where(position_mask[None, :], scores, NEGATIVE_LARGE)
        running_max, probs, running_sum, accumulator = _online_softmax_update(running_max, running_sum,
                                                                              accumulator, scores)
        value = tl.load(value_cache_ptr + kv_offsets, mask=value_mask, other=0.0)  # (TILE, D)
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
        stride_cache_head, BLOCK_SIZE, TILE, TILE_IN_BLOCK, HEAD_DIM != HEAD_PAD, DOT_PRECISION)
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


def paged_decode_attention(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_tables: Tensor,
                           context_lens: Tensor, num_splits: int = 1, tile: int | None = None, num_warps: int = 4,
                           num_stages: int = 3, new_key: Tensor | None = None, new_value: Tensor | None = None,
                           write_slots: Tensor | None = None, row_order: Tensor | None = None) -> Tensor:
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
    sequences with contexts 640-1536: 52 -> 43 us per layer)."""
    write_new = new_key is not None
    if write_new and (new_value is None or write_slots is None or new_key.stride(2) != 1 or new_value.stride(2) != 1):
        raise ValueError("paged_decode_attention: new_key and new_value (head dimension contiguous) and write_slots "
                         "come together")
    num_sequences, num_heads, head_dim = query.shape
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    if key_cache.stride(3) != 1 or query.stride(2) != 1:
        raise ValueError("paged_decode_attention needs the head dimension contiguous")
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
    )
    if num_splits > 1:
        _merge_splits_kernel[(num_sequences, num_heads)](
            output, partial_output, partial_max, partial_sum, output.stride(0), output.stride(1),
            NUM_HEADS=num_heads, HEAD_DIM=head_dim, HEAD_PAD=head_pad, NUM_SPLITS=num_splits,
            SPLIT_PAD=triton.next_power_of_2(num_splits),
        )
    return output


@triton.jit
def _mix_32(values):
    """murmur3's fmix32 on uint32 values. Triton's uint32 products wrap mod 2**32, so this equals
    `sampler.mix_32` (which splits the constants in 16-bit halves to stay exact in int64 on the host)
    bit for bit, at a fraction of the cost of 64-bit integer products on the GPU."""
    values = values ^ (values >> 16)
    values = values * 0x85EBCA6B
    values = values ^ (values >> 13)
    values = values * 0xC2B2AE35
    return values ^ (values >> 16)


@triton.jit
def _reduce_lanes(lane_max, lane_sum, lane_weight, lane_noise, lane_index, vocab_size):
    """The lanes of one (row, split) reduced to its logsumexp pieces (max, sum under that max) and its best
    candidate (score, vocabulary id). Scores are log(weight / noise) + max: the reference's x / T + g up to one
    constant shared by every lane, split and row (the noise is in base 2), which leaves the argmax alone."""
    split_max = tl.max(lane_max, 0)
    split_sum = tl.sum(lane_sum * tl.exp(lane_max - split_max), 0)
    lane_score = tl.where(lane_weight > 0.0, tl.log(tl.maximum(lane_weight / lane_noise, 1e-30)) + lane_max,
                          float("-inf"))
    best_score = tl.max(lane_score, 0)
    # Across lanes the lowest id among the best wins, as torch.argmax's first maximum (greedy rows tie).
    best_index = tl.min(tl.where(lane_score == best_score, lane_index, vocab_size), 0)
    best_index = tl.minimum(best_index, vocab_size - 1)  # a split with no candidate: any id, score -inf
    return split_max, split_sum, best_score, best_index


@triton.jit
def _race_noise(key, vocab_ids, is_greedy, FAST_MATH: tl.constexpr):
    """Each logit's noise in the Gumbel race: -log2(u) (Exp(1) over ln 2; 1 on greedy rows), u from the same
    counter hash as `sampler.uniform_noise`. log2 is the hardware's approximate one (one MUFU.LG2, relative
    error ~2**-22) on a GPU, libdevice's polynomial under the CPU interpreter, which lacks the fast functions."""
    bits = _mix_32(key + vocab_ids.to(tl.uint32) * 0x9E3779B9)
    uniform = ((bits >> 8).to(tl.float32) + 0.5) * 5.9604644775390625e-08  # 2**-24
    if FAST_MATH:
        log2 = libdevice.fast_log2f(uniform)
    else:
        log2 = tl.log2(uniform)
    return tl.where(is_greedy, 1.0, -log2)


@triton.jit
def _gumbel_sample_kernel(
    logits_ptr, temperatures_ptr, thresholds_ptr, keys_ptr,
    partial_max_ptr, partial_sum_ptr, partial_score_ptr, partial_scaled_ptr, partial_index_ptr,
    vocab_size, stride_logits, split_size, NUM_SPLITS: tl.constexpr, BLOCK_V: tl.constexpr,
    FAST_MATH: tl.constexpr,
):
    """One (row, vocabulary split): the split's logsumexp pieces and its best Gumbel score, for the merge.

    Each lane keeps its own running max, sum, best candidate and its id, so the loop only streams logits;
    the lanes are reduced once at the end (a cross-lane reduction per tile cost more than the arithmetic).
    The Gumbel race argmax(x / T + g), g = -log(E), E = -log(u), runs as argmax(exp(x / T - m) / E) against
    the lane's running max m: the same winner with one logarithm per logit instead of two, since the
    exponential is the one the logsumexp needs anyway. Fractions compare by cross products (no division per
    logit; the kernel is instruction-bound: ~45 instructions per logit, was ~80)."""
    row = tl.program_id(0)
    split = tl.program_id(1)
    temperature = tl.load(temperatures_ptr + row)
    is_greedy = temperature == 0.0
    divisor = tl.where(is_greedy, 1.0, temperature)
    threshold = tl.load(thresholds_ptr + row)
    key = tl.load(keys_ptr + row).to(tl.uint32)
    offsets = tl.arange(0, BLOCK_V)
    lane_max = tl.full([BLOCK_V], NEGATIVE_LARGE, tl.float32)
    lane_sum = tl.zeros([BLOCK_V], tl.float32)
    # The best candidate's exp(x / T - lane_max) (negative: none yet) and its noise.
    lane_weight = tl.full([BLOCK_V], -1.0, tl.float32)
    lane_noise = tl.full([BLOCK_V], 1.0, tl.float32)
    lane_index = tl.zeros([BLOCK_V], tl.int32)
    split_start = split * split_size
    split_stop = tl.minimum(split_start + split_size, vocab_size)
    for start in range(split_start, split_stop, BLOCK_V):
        vocab_ids = start + offsets
        vocab_mask = vocab_ids < split_stop
        # bf16 logits are widened here, exactly as a .float() copy would, without that copy's round trip.
        logits = tl.load(logits_ptr + row * stride_logits + vocab_ids, mask=vocab_mask,
                         other=float("-inf")).to(tl.float32)
        scaled = logits / divisor
        # One exp per logit: exp(-|x - m|) is the new term under the old max or the old max's decay.
        decay = tl.exp(-tl.abs(scaled - lane_max))
        is_new_max = scaled > lane_max
        lane_sum = tl.where(is_new_max, lane_sum * decay + 1.0, lane_sum + decay)
        lane_weight = tl.where(is_new_max, lane_weight * decay, lane_weight)  # rescaled to the new max
        lane_max = tl.maximum(lane_max, scaled)
        noise = _race_noise(key, vocab_ids, is_greedy, FAST_MATH)
        weight = tl.where(is_new_max, 1.0, decay)
        # weight / noise > lane_weight / lane_noise; strict: within a lane the lower vocabulary id wins a tie
        is_better = vocab_mask & (logits >= threshold) & (weight * lane_noise > lane_weight * noise)
        lane_weight = tl.where(is_better, weight, lane_weight)
        lane_noise = tl.where(is_better, noise, lane_noise)
        lane_index = tl.where(is_better, vocab_ids, lane_index)
    split_max, split_sum, best_score, best_index = _reduce_lanes(lane_max, lane_sum, lane_weight, lane_noise,
                                                                 lane_index, vocab_size)
    best_scaled = tl.load(logits_ptr + row * stride_logits + best_index).to(tl.float32) / divisor
    slot = row * NUM_SPLITS + split
    tl.store(partial_max_ptr + slot, split_max)
    tl.store(partial_sum_ptr + slot, split_sum)
    tl.store(partial_score_ptr + slot, best_score)
    tl.store(partial_scaled_ptr + slot, best_scaled)
    tl.store(partial_index_ptr + slot, best_index.to(tl.int64))


@triton.jit
def _merge_samples_kernel(
    partial_max_ptr, partial_sum_ptr, partial_score_ptr, partial_scaled_ptr, partial_index_ptr,
    token_ids_ptr, log_probs_ptr, NUM_SPLITS: tl.constexpr,
):
    row = tl.program_id(0)
    running_max = tl.full([], NEGATIVE_LARGE, tl.float32)
    running_sum = tl.zeros([], tl.float32)
    best_score = tl.full([], float("-inf"), tl.float32)
    best_scaled = tl.zeros([], tl.float32)
    best_index = tl.zeros([], tl.int64)
    for split in tl.static_range(NUM_SPLITS):
        slot = row * NUM_SPLITS + split
        split_max = tl.load(partial_max_ptr + slot)
        new_max = tl.maximum(running_max, split_max)
        running_sum = running_sum * tl.exp(running_max - new_max) + tl.load(partial_sum_ptr + slot) * tl.exp(
            split_max - new_max)
        running_max = new_max
        score = tl.load(partial_score_ptr + slot)
        is_better = score > best_score  # strict, in vocabulary order: the first maximum wins
        best_score = tl.where(is_better, score, best_score)
        best_scaled = tl.where(is_better, tl.load(partial_scaled_ptr + slot), best_scaled)
        best_index = tl.where(is_better, tl.load(partial_index_ptr + slot), best_index)
    tl.store(token_ids_ptr + row, best_index)
    tl.store(log_probs_ptr + row, best_scaled - (running_max + tl.log(running_sum)))


def fused_sample(logits: Tensor, temperatures: Tensor, thresholds: Tensor, keys: Tensor,
                 block_vocab: int = 512, num_splits: int = 16) -> tuple[Tensor, Tensor]:
    """The Triton twin of `sampler.sample_reference` in one pass over the logits: logits (S, V) fp32 or
    bf16, temperatures (S,) (0 = greedy), thresholds (S,) raw logits, keys (S,) int64 -> token ids (S,)
    int64, log-probs (S,) fp32. The vocabulary is cut into `num_splits` ranges run by separate programs
    (one program per row leaves most of an H200 idle at a few hundred rows), merged by a second kernel."""
    num_rows, vocab_size = logits.shape
    if logits.stride(1) != 1:
        raise ValueError("fused_sample needs logits contiguous along the vocabulary")
    block_vocab = min(block_vocab, triton.next_power_of_2(vocab_size))
    num_splits = max(1, min(num_splits, -(-vocab_size // block_vocab)))
    split_size = -(-vocab_size // (num_splits * block_vocab)) * block_vocab
    device = logits.device
    partial_max, partial_sum, partial_score, partial_scaled = torch.empty(
        (4, num_rows, num_splits), dtype=torch.float32, device=device)
    partial_index = torch.empty((num_rows, num_splits), dtype=torch.int64, device=device)
    _gumbel_sample_kernel[(num_rows, num_splits)](
        logits, temperatures.to(torch.float32).contiguous(), thresholds.to(torch.float32).contiguous(),
        keys.contiguous(), partial_max, partial_sum, partial_score, partial_scaled, partial_index,
        vocab_size, logits.stride(0), split_size, NUM_SPLITS=num_splits, BLOCK_V=block_vocab,
        FAST_MATH=logits.is_cuda,
    )
    token_ids = torch.empty(num_rows, dtype=torch.int64, device=device)
    log_probs = torch.empty(num_rows, dtype=torch.float32, device=device)
    _merge_samples_kernel[(num_rows,)](partial_max, partial_sum, partial_score, partial_scaled, partial_index,
                                       token_ids, log_probs, NUM_SPLITS=num_splits)
    return token_ids, log_probs
