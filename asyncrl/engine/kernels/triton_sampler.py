"""The fused Gumbel-max sampler in Triton: one pass over the logits per (row, vocabulary split), then a merge.
On CUDA it is the fallback of our CUDA kernel (`cuda_sampler.py`), which runs the same race in fewer
instructions, where that cannot be built or does not cover the logits. Imported only when the engine runs on
CUDA; runs under Triton's interpreter on CPU (`TRITON_INTERPRET=1`,
`tests/engine/kernels/test_triton_kernels.py`)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice
from torch import Tensor

from asyncrl.engine.kernels.triton_decode import NEGATIVE_LARGE


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


NOISE_FLOOR = tl.constexpr(8.5e-8)  # just under -log2(1 - 2**-24) = 8.599e-8


@triton.jit
def _race_noise(key, vocab_ids, is_greedy, FAST_MATH: tl.constexpr):
    """Each logit's noise in the Gumbel race: -log2(u) (Exp(1) over ln 2; 1 on greedy rows), u from the same
    counter hash as `sampler.uniform_noise`. log2 is the hardware's approximate one (one MUFU.LG2, absolute
    error ~2**-22, so large relative errors next to 1: see below) on a GPU, libdevice's polynomial under the CPU interpreter, which lacks the fast functions."""
    bits = _mix_32(key + vocab_ids.to(tl.uint32) * 0x9E3779B9)
    uniform = ((bits >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07  # 2**-23: `sampler.uniform_from_bits`
    if FAST_MATH:
        log2 = libdevice.fast_log2f(uniform)
    else:
        log2 = tl.log2(uniform)
    # Never below the exact noise of the largest u, -log2(1 - 2**-24): CUDA bounds the approximate log2's
    # absolute error only (~2**-22), which would allow a zero or negative noise next to 1, a certain win. On an
    # H200 it is never >= 0, but for the largest u it is 86% low, which the floor lifts to within 1.2% (probed at
    # every u = 1 - j 2**-24, j < 4,096).
    return tl.where(is_greedy, 1.0, tl.maximum(-log2, NOISE_FLOOR))


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
    logit: the kernel is bound by instructions, ~45 per logit)."""
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
