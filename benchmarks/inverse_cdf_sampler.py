"""Would an inverse-CDF sampler be cheaper than the engine's Gumbel race?

    python benchmarks/inverse_cdf_sampler.py

The engine's fused sampler (`asyncrl/engine/triton_sampler.py`) races every logit against its own noise: a
hash and a logarithm per logit, ~45 instructions each, 82 us for 256 x 151,936 bf16 logits on an H200 where
reading them takes ~16 us. Inverse-CDF sampling needs one uniform per row instead:
- pass 1, per (row, vocabulary split): the split's max and sum of exp(x / T - max) over the logits that pass
  the row's threshold, and its argmax (greedy rows);
- pass 2, per row: the splits merged into the row's logsumexp; the target u x Z placed in one split by the
  splits' sums; that split alone rescanned for the first id whose running sum reaches the target.

This script times both in CUDA graphs on the engine's shape and checks the new one: its frequencies against the
softmax over 20,000 draws of a 64-token row, its log-probs against torch's log-softmax. Not wired into the
engine: a different draw for the same seed would change every recorded sample, and the CPU reference would
have to follow.

Answer (one H200, 2026-12-04, docs/benchmarks.md, sixteenth round): 52.6 us at best against 82.8 us, ~1.4% of a
0.5B decode step; the first pass alone takes 42-48 us.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from asyncrl.bench.graph_timing import graph_replay_ms
from asyncrl.engine.triton_sampler import _mix_32, fused_sample


@triton.jit
def _split_stats_kernel(logits_ptr, temperatures_ptr, thresholds_ptr, split_max_ptr, split_sum_ptr, split_index_ptr, vocab_size, stride_logits, split_size,
                        NUM_SPLITS: tl.constexpr, BLOCK_V: tl.constexpr):
    row, split = tl.program_id(0), tl.program_id(1)
    temperature = tl.load(temperatures_ptr + row)
    divisor = tl.where(temperature == 0.0, 1.0, temperature)
    threshold = tl.load(thresholds_ptr + row)
    lane_max = tl.full([BLOCK_V], -1e30, tl.float32)
    lane_sum = tl.zeros([BLOCK_V], tl.float32)
    lane_index = tl.zeros([BLOCK_V], tl.int32)
    split_start = split * split_size
    split_stop = tl.minimum(split_start + split_size, vocab_size)
    for start in range(split_start, split_stop, BLOCK_V):
        vocab_ids = start + tl.arange(0, BLOCK_V)
        logits = tl.load(logits_ptr + row * stride_logits + vocab_ids, mask=vocab_ids < split_stop,
                         other=float("-inf")).to(tl.float32)
        scaled = tl.where(logits >= threshold, logits / divisor, float("-inf"))
        decay = tl.exp(-tl.abs(scaled - lane_max))
        is_new_max = scaled > lane_max
        lane_sum = tl.where(is_new_max, lane_sum * decay + 1.0, lane_sum + tl.where(scaled > -1e30, decay, 0.0))
        lane_index = tl.where(is_new_max, vocab_ids, lane_index)
        lane_max = tl.maximum(lane_max, scaled)
    best = tl.max(lane_max, 0)
    total = tl.sum(lane_sum * tl.exp(lane_max - best), 0)
    best_index = tl.min(tl.where(lane_max == best, lane_index, vocab_size), 0)
    slot = row * NUM_SPLITS + split
    tl.store(split_max_ptr + slot, best)
    tl.store(split_sum_ptr + slot, total)
    tl.store(split_index_ptr + slot, best_index)


@triton.jit
def _pick_kernel(logits_ptr, temperatures_ptr, thresholds_ptr, keys_ptr, split_max_ptr, split_sum_ptr,
                 split_index_ptr, token_ids_ptr, log_probs_ptr, vocab_size, stride_logits, split_size,
                 NUM_SPLITS: tl.constexpr, BLOCK_V: tl.constexpr):
    row = tl.program_id(0)
    temperature = tl.load(temperatures_ptr + row)
    divisor = tl.where(temperature == 0.0, 1.0, temperature)
    threshold = tl.load(thresholds_ptr + row)
    splits = tl.arange(0, NUM_SPLITS)
    maxima = tl.load(split_max_ptr + row * NUM_SPLITS + splits)
    row_max = tl.max(maxima, 0)
    sums = tl.load(split_sum_ptr + row * NUM_SPLITS + splits) * tl.exp(maxima - row_max)
    total = tl.sum(sums, 0)
    bits = _mix_32(tl.load(keys_ptr + row).to(tl.uint32))
    target = ((bits >> 8).to(tl.float32) + 0.5) * 5.9604644775390625e-08 * total
    before = tl.cumsum(sums, 0) - sums  # each split's start on the cumulative scale
    chosen = tl.max(tl.where(before < target, splits, 0), 0)
    running = tl.sum(tl.where(splits == chosen, before, 0.0), 0)
    split_start = chosen * split_size
    split_stop = tl.minimum(split_start + split_size, vocab_size)
    found = vocab_size
    last_valid = split_start  # a target past the split's rounded sum: its last id that can be drawn
    for start in range(split_start, split_stop, BLOCK_V):
        vocab_ids = start + tl.arange(0, BLOCK_V)
        logits = tl.load(logits_ptr + row * stride_logits + vocab_ids, mask=vocab_ids < split_stop,
                         other=float("-inf")).to(tl.float32)
        weights = tl.where(logits >= threshold, tl.exp(logits / divisor - row_max), 0.0)
        reached = (running + tl.cumsum(weights, 0) >= target) & (weights > 0.0)
        found = tl.minimum(found, tl.min(tl.where(reached, vocab_ids, vocab_size), 0))
        last_valid = tl.maximum(last_valid, tl.max(tl.where(weights > 0.0, vocab_ids, 0), 0))
        running += tl.sum(weights, 0)
    picked = tl.where(found < vocab_size, found, last_valid)
    greedy_index = tl.min(tl.where(maxima == row_max, tl.load(split_index_ptr + row * NUM_SPLITS + splits),
                                   vocab_size), 0)
    picked = tl.where(temperature == 0.0, greedy_index, picked)
    scaled = tl.load(logits_ptr + row * stride_logits + picked).to(tl.float32) / divisor
    tl.store(token_ids_ptr + row, picked.to(tl.int64))
    tl.store(log_probs_ptr + row, scaled - row_max - tl.log(total))


def inverse_cdf_sample(logits, temperatures, thresholds, keys, block_vocab: int = 1024, num_splits: int = 32,
                       passes: tuple[bool, bool] = (True, True), num_warps: int = 4):
    """Token ids and log-probs; `passes` leaves one of the two kernels out (timing only)."""
    num_rows, vocab_size = logits.shape
    split_size = -(-vocab_size // (num_splits * block_vocab)) * block_vocab
    split_max, split_sum = torch.empty((2, num_rows, num_splits), dtype=torch.float32, device=logits.device)
    split_index = torch.empty((num_rows, num_splits), dtype=torch.int32, device=logits.device)
    temperatures, thresholds = temperatures.float().contiguous(), thresholds.float().contiguous()
    _split_stats_kernel[(num_rows, num_splits)](logits, temperatures, thresholds, split_max, split_sum, split_index, vocab_size, logits.stride(0), split_size,
                                                NUM_SPLITS=num_splits, BLOCK_V=block_vocab)
    token_ids = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
    log_probs = torch.empty(num_rows, dtype=torch.float32, device=logits.device)
    if passes[1]:
        _pick_kernel[(num_rows,)](logits, temperatures, thresholds, keys, split_max, split_sum, split_index,
                                  token_ids, log_probs, vocab_size, logits.stride(0), split_size,
                                  NUM_SPLITS=num_splits, BLOCK_V=block_vocab, num_warps=num_warps)
    return token_ids, log_probs


def check_frequencies(draws: int = 20_000, vocab: int = 64) -> None:
    """One 64-token row drawn `draws` times at T = 0.8 with different keys, every other draw under a top-10
    threshold: frequencies against the softmax, log-probs against torch's, and greedy rows' argmax."""
    generator = torch.Generator(device="cuda").manual_seed(1)
    row = torch.randn(vocab, device="cuda", generator=generator) * 2
    logits = row.expand(draws, vocab).to(torch.bfloat16).contiguous()
    temperatures = torch.full((draws,), 0.8, device="cuda")
    thresholds = torch.full((draws,), -1e30, device="cuda")
    thresholds[0::2] = logits[0].float().sort(descending=True).values[9]
    keys = torch.randint(0, 2**31, (draws,), device="cuda", generator=generator)
    token_ids, log_probs = inverse_cdf_sample(logits, temperatures, thresholds, keys, block_vocab=16, num_splits=4)
    scaled = logits.float() / 0.8
    expected_log_probs = torch.log_softmax(torch.where(logits.float() >= thresholds[:, None], scaled, float("-inf")),
                                           -1)
    for name, rows in (("top-10", slice(0, None, 2)), ("full", slice(1, None, 2))):
        probabilities = expected_log_probs[rows][0].exp()
        drawn = token_ids[rows]
        frequencies = torch.bincount(drawn, minlength=vocab).float() / len(drawn)
        sigmas = (frequencies - probabilities).abs() / (probabilities * (1 - probabilities) / len(drawn)).sqrt()
        print(f"{name} rows: largest frequency error {(frequencies - probabilities).abs().max().item():.4f} "
              f"({sigmas.nan_to_num(0.0, posinf=1e9).max().item():.2f} sigma), draws outside the row's support: "
              f"{int((probabilities[drawn] == 0).sum())}")
    errors = (log_probs - expected_log_probs.gather(1, token_ids[:, None]).squeeze(1)).abs()
    greedy, _ = inverse_cdf_sample(logits[:4], torch.zeros(4, device="cuda"), thresholds[:4], keys[:4], 16, 4)
    print(f"log-probs within {errors.max().item():.2e} of torch's; greedy rows pick the argmax: "
          f"{bool((greedy == logits[0].float().argmax()).all())}")


def main() -> None:
    check_frequencies()
    rows, vocab = 256, 151_936
    generator = torch.Generator(device="cuda").manual_seed(0)
    logits = (torch.randn(rows, vocab, device="cuda", generator=generator) * 3).to(torch.bfloat16)
    temperatures = torch.ones(rows, device="cuda")
    thresholds = torch.full((rows,), -1e30, device="cuda")
    keys = torch.randint(0, 2**31, (rows,), device="cuda", generator=generator)
    gumbel_us = graph_replay_ms(lambda: fused_sample(logits, temperatures, thresholds, keys), replays=50) * 1e3
    print(f"{rows} x {vocab} bf16 logits: Gumbel race (engine) {gumbel_us:.1f} us")
    for block_vocab, num_splits in [(1024, 16), (1024, 32), (512, 64)]:
        for num_warps in (4, 8):
            times = [graph_replay_ms(lambda: inverse_cdf_sample(logits, temperatures, thresholds, keys, block_vocab,
                                                                num_splits, passes, num_warps), replays=50) * 1e3
                     for passes in ((True, True), (True, False), (False, True))]
            print(f"  inverse CDF, blocks of {block_vocab}, {num_splits} splits, {num_warps} warps: {times[0]:.1f} us "
                  f"(pass 1 alone {times[1]:.1f}, pass 2 alone {times[2]:.1f}, with the fill kernels standing in)")


if __name__ == "__main__":
    main()
