"""Sampling with per-request, batch-independent random numbers, and the log-prob of each sampled token.

Randomness. The noise of request r at response position t for vocabulary entry v is a pure function of
(seed_r, t, v): a counter-based hash (murmur3's 32-bit finaliser over a Weyl sequence) computed with
vectorised integer ops on the device. Sampling is Gumbel-max: token = argmax_v(logits_v / T + g_v) over
the tokens that survive top-k / top-p, with g_v = -log(-log(u_v)) and u_v uniform from the hash. So a
request draws the same numbers alone or in any batch, and a resumed or recomputed request continues
with exactly the numbers an uninterrupted run would have used. There is no torch.Generator, no per-request
loop and no host round trip. All integer arithmetic stays below 2**63 (32-bit products are split in
16-bit halves), so the CPU path, the CUDA path and the Triton kernel compute the same bits.

Log-probs. The returned log-prob of a sampled token is log_softmax(logits / T)[token] over the FULL
vocabulary: temperature-scaled, before top-k / top-p truncation. That is what the trainer recomputes from
the same logits, so the rollout log-prob and the trainer's log-prob agree. Greedy rows (T == 0) return
the unscaled log_softmax(logits)[token].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

MASK32 = 0xFFFFFFFF
GOLDEN32 = 0x9E3779B9  # Weyl increment: consecutive vocabulary ids land far apart before hashing
SEED_SALT = 0x632BE5AB
POSITION_SALT = 0x85157AF5
UNIFORM_SCALE = 2.0**-23

# logits (S, V) fp32, temperatures (S,), thresholds (S,), row_keys (S,) int64 -> token ids (S,), log-probs (S,)
FusedSampleKernel = Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]


# The hash functions take int64 torch tensors or numpy arrays alike: they use only integer operators. The
# engine computes row keys on the host (S values, cheaper than ~50 tiny device kernels) and the (S, V)
# noise on the device.
IntArray = Tensor | np.ndarray


def multiply_32(values: IntArray, constant: int) -> IntArray:
    """values * constant mod 2**32 for int64 values in [0, 2**32); every intermediate stays below 2**49."""
    low = values * (constant & 0xFFFF)
    high = ((values * (constant >> 16)) & 0xFFFF) << 16
    return (low + high) & MASK32


def mix_32(values: IntArray) -> IntArray:
    """murmur3's 32-bit finaliser (fmix32) on int64 values in [0, 2**32)."""
    values = values ^ (values >> 16)
    values = multiply_32(values, 0x85EBCA6B)
    values = values ^ (values >> 13)
    values = multiply_32(values, 0xC2B2AE35)
    return values ^ (values >> 16)


def seed_keys(seeds: IntArray) -> IntArray:
    """The position-free half of `row_keys`: seeds (S,) int64 in [0, 2**63) -> (S,) 32-bit keys. The engine
    keeps it while a decode batch stays the same, hashing only the positions each step."""
    seed_low = seeds & MASK32
    seed_high = (seeds >> 32) & MASK32
    return mix_32(mix_32(seed_low ^ SEED_SALT) ^ seed_high)


def position_keys(keys_of_seeds: IntArray, positions: IntArray) -> IntArray:
    """row_keys from seed_keys(seeds) (S,) and response positions (S,)."""
    return mix_32(keys_of_seeds ^ mix_32((positions + POSITION_SALT) & MASK32))


def row_keys(seeds: IntArray, positions: IntArray) -> IntArray:
    """One 32-bit key per (seed, response position): seeds (S,) int64 in [0, 2**63), positions (S,) -> (S,)."""
    return position_keys(seed_keys(seeds), positions)


def uniform_from_bits(bits: Tensor) -> Tensor:
    """32 hashed bits (int64 in [0, 2**32)) -> uniform fp32 ((bits >> 9) + 0.5) 2**-23, in [2**-24, 1 - 2**-24].

    23 bits, so that every value is exact in fp32 and none is 1. With 24 bits the top value, (2**24 - 0.5) 2**-24,
    rounded to exactly 1.0: its Gumbel noise -log(-log 1) is +inf, so in ~0.9% of the rows of a 152k vocabulary
    some token would win the race whatever its logit."""
    return ((bits >> 9).to(torch.float32) + 0.5) * UNIFORM_SCALE


def uniform_noise(keys: Tensor, vocab_ids: Tensor) -> Tensor:
    """Uniform (0, 1) fp32 of shape keys x vocab_ids broadcast, from the counter hash (`uniform_from_bits`)."""
    return uniform_from_bits(mix_32((keys + multiply_32(vocab_ids, GOLDEN32)) & MASK32))


def gumbel_noise(keys: Tensor, vocab_size: int) -> Tensor:
    """keys (S,) -> Gumbel(0, 1) noise (S, V)."""
    vocab_ids = torch.arange(vocab_size, device=keys.device, dtype=torch.int64)
    uniform = uniform_noise(keys[:, None], vocab_ids[None, :])
    return -torch.log(-torch.log(uniform))


@dataclass
class SamplingInputs:
    """Per-sequence sampling knobs on the device, plus host flags that skip unused filters."""

    temperatures: Tensor  # (S,) fp32, 0 = greedy
    top_k: Tensor  # (S,) int64, -1 = off
    top_p: Tensor  # (S,) fp32, 1.0 = off
    keys: Tensor  # (S,) int64 row_keys(seed, response position of the token being sampled)
    max_top_k: int  # largest top_k of the batch, 0 when no row uses top-k
    use_top_p: bool


def truncation_thresholds(logits: Tensor, inputs: SamplingInputs) -> Tensor:
    """logits (S, V) -> (S,) smallest RAW logit a row may sample (-inf: no truncation).

    top-k keeps logits >= the k-th largest; top-p then keeps the smallest set of most likely tokens whose
    probability at the row's temperature (renormalised after top-k) reaches top_p. Ties at a threshold are
    kept. Thresholds are raw logits, not scaled ones, so that comparing them needs no division whose
    rounding could differ between the torch path and the kernel."""
    thresholds = torch.full_like(logits[:, 0], float("-inf"))
    if inputs.max_top_k > 0:
        num_kept = min(inputs.max_top_k, logits.shape[1])
        top_values = logits.topk(num_kept, dim=-1).values  # (S, k) descending
        kth = (inputs.top_k.clamp(1, num_kept) - 1)[:, None]
        thresholds = torch.where(inputs.top_k > 0, top_values.gather(1, kth).squeeze(1), thresholds)
    if inputs.use_top_p:
        masked = logits.masked_fill(logits < thresholds[:, None], float("-inf"))
        sorted_values = masked.sort(dim=-1, descending=True).values  # (S, V)
        divisors = torch.where(inputs.temperatures == 0, 1.0, inputs.temperatures)[:, None]
        probs = (sorted_values / divisors).softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        num_kept = (mass_before < inputs.top_p[:, None]).sum(dim=-1).clamp(min=1)  # (S,)
        top_p_thresholds = sorted_values.gather(1, (num_kept - 1)[:, None]).squeeze(1)
        thresholds = torch.where(inputs.top_p < 1.0, torch.maximum(thresholds, top_p_thresholds), thresholds)
    return thresholds


def sample_reference(logits: Tensor, temperatures: Tensor, thresholds: Tensor, keys: Tensor) -> tuple[Tensor, Tensor]:
    """The torch path: logits (S, V) fp32, thresholds (S,) raw logits -> token ids (S,) int64 and their
    log-probs (S,) fp32."""
    is_greedy = temperatures == 0
    scaled = logits / torch.where(is_greedy, 1.0, temperatures)[:, None]
    scores = torch.where(is_greedy[:, None], scaled, scaled + gumbel_noise(keys, logits.shape[1]))
    scores = scores.masked_fill(logits < thresholds[:, None], float("-inf"))
    token_ids = scores.argmax(dim=-1)
    log_probs = torch.log_softmax(scaled, dim=-1).gather(1, token_ids[:, None]).squeeze(1)
    return token_ids, log_probs


class Sampler:
    """Samples one token per row; `fused_kernel` (CUDA) replaces the noise + argmax + log-prob passes."""

    def __init__(self, fused_kernel: FusedSampleKernel | None = None) -> None:
        self.fused_kernel = fused_kernel

    def __call__(self, logits: Tensor, inputs: SamplingInputs) -> tuple[Tensor, Tensor]:
        """logits (S, V) in the model dtype -> token ids (S,) int64, log-probs (S,) fp32 (computed from the
        logits widened to fp32, which is exact, on every path)."""
        if inputs.max_top_k > 0 or inputs.use_top_p:
            thresholds = truncation_thresholds(logits.float(), inputs)
        else:
            thresholds = torch.full_like(inputs.temperatures, float("-inf"))
        return self.sample(logits, inputs.temperatures, thresholds, inputs.keys)

    def sample(self, logits: Tensor, temperatures: Tensor, thresholds: Tensor, keys: Tensor) -> tuple[Tensor, Tensor]:
        """Sampling with given truncation thresholds (S,) raw logits (-inf: none), as the decode graphs run it."""
        if self.fused_kernel is not None:
            return self.fused_kernel(logits, temperatures, thresholds, keys)
        return sample_reference(logits.float(), temperatures, thresholds, keys)
