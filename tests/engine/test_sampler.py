"""The sampler: counter-based noise, Gumbel-max frequencies, top-k / top-p thresholds, log-probs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from asyncrl.engine.sampler import (
    GOLDEN32,
    MASK32,
    Sampler,
    SamplingInputs,
    gumbel_noise,
    mix_32,
    multiply_32,
    row_keys,
    sample_reference,
    truncation_thresholds,
    uniform_from_bits,
)


def fmix32_python(value: int) -> int:
    """murmur3's finaliser with Python's unbounded ints, the specification of `mix_32`."""
    value ^= value >> 16
    value = (value * 0x85EBCA6B) & 0xFFFFFFFF
    value ^= value >> 13
    value = (value * 0xC2B2AE35) & 0xFFFFFFFF
    return value ^ (value >> 16)


def make_inputs(count: int, temperature: float = 1.0, top_k: int = -1, top_p: float = 1.0) -> SamplingInputs:
    """`count` rows with seeds 0 .. count - 1 at response position 0."""
    return SamplingInputs(
        temperatures=torch.full((count,), temperature), top_k=torch.full((count,), top_k, dtype=torch.int64),
        top_p=torch.full((count,), top_p),
        keys=row_keys(torch.arange(count), torch.zeros(count, dtype=torch.int64)),
        max_top_k=max(top_k, 0), use_top_p=top_p < 1.0)


def test_mix_32_equals_the_murmur3_finaliser():
    values = [0, 1, 2, 0x12345678, 0xFFFFFFFF, 0x80000000, 3141592653]
    mixed = mix_32(torch.tensor(values, dtype=torch.int64)).tolist()
    assert mixed == [fmix32_python(value) for value in values]
    assert mixed[0] == 0 and mixed[1] == 0x514E28B7  # published fmix32(1)


def test_noise_depends_only_on_seed_and_position():
    seeds, positions = [5, 5, 6, 2**62 + 5], [3, 4, 3, 3]
    keys = row_keys(torch.tensor(seeds), torch.tensor(positions))
    assert len(set(keys.tolist())) == 4  # seed, position and the high seed bits all matter
    # The host (numpy) computes the same keys as the device.
    assert row_keys(np.asarray(seeds, dtype=np.int64), np.asarray(positions, dtype=np.int64)).tolist() == keys.tolist()
    alone = gumbel_noise(keys[1:2], 50)
    in_batch = gumbel_noise(keys, 50)
    assert torch.equal(alone[0], in_batch[1])
    noise = gumbel_noise(row_keys(torch.arange(2000), torch.zeros(2000, dtype=torch.int64)), 64)
    # Standard Gumbel: mean 0.5772 (Euler's constant), variance pi^2 / 6.
    assert abs(noise.mean().item() - 0.5772) < 0.01
    assert abs(noise.var().item() - math.pi**2 / 6) < 0.03


def test_uniform_noise_is_exact_and_never_reaches_one():
    """The extreme hashes give 2**-24 and 1 - 2**-24 exactly, so every Gumbel noise is finite. (From 24 bits, the top
    value rounded to 1.0, whose noise is +inf: that token won the race whatever its logit, in ~0.9% of 152k-token
    rows.) A key whose top hash lands in a row, at a hopeless logit, does not win it."""
    extremes = uniform_from_bits(torch.tensor([0, 0xFFFFFFFF, 0xFFFFFC00, 0x1FF], dtype=torch.int64))
    assert extremes.tolist() == [2.0**-24, 1 - 2.0**-24, 1 - 3 * 2.0**-24, 2.0**-24]
    assert torch.isfinite(-torch.log(-torch.log(extremes))).all()
    # Find a (key, id) whose hash is the top one among 2**24 candidates: search keys against 1,024 ids at once.
    hashed_ids = multiply_32(torch.arange(1024), GOLDEN32)
    for start in range(0, 2**20, 4096):
        keys = torch.arange(start, start + 4096)
        hits = ((mix_32((keys[:, None] + hashed_ids[None, :]) & MASK32) >> 8) == 2**24 - 1).nonzero()
        if len(hits) > 0:
            key, token = int(keys[hits[0, 0]]), int(hits[0, 1])
            break
    else:
        pytest.fail("no key in 2**20 hashes to the top 24 bits at any of 1,024 ids")
    logits = torch.zeros(1, 1024)
    logits[0, token] = -30.0  # probability ~1e-13 / 1,024: never drawn
    token_ids, _ = sample_reference(logits, torch.ones(1), torch.full((1,), float("-inf")), torch.tensor([key]))
    assert token_ids.item() != token


def test_gumbel_max_frequencies_follow_the_tempered_softmax():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    num_draws, temperature = 20000, 0.7
    inputs = make_inputs(num_draws, temperature=temperature)
    token_ids, log_probs = Sampler()(logits.expand(num_draws, 4).contiguous(), inputs)
    frequencies = torch.bincount(token_ids, minlength=4).float() / num_draws
    expected = torch.softmax(logits / temperature, dim=0)
    assert (frequencies - expected).abs().max() < 0.01
    assert torch.allclose(log_probs, torch.log(expected)[token_ids])


def test_thresholds_of_top_k_and_top_p_by_hand():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 3))
    inputs = make_inputs(3)
    inputs.top_k = torch.tensor([2, -1, -1])
    inputs.top_p = torch.tensor([1.0, 0.8, 0.81])
    inputs.max_top_k, inputs.use_top_p = 2, True
    thresholds = truncation_thresholds(logits, inputs)
    # top_k=2 keeps {0.5, 0.3}; top_p=0.8 is reached by 0.5 + 0.3; 0.81 needs the third token.
    assert torch.allclose(thresholds, logits[0, [1, 1, 2]])


def test_top_p_uses_the_tempered_distribution_after_top_k():
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    inputs = make_inputs(1, top_k=2, top_p=0.6)
    # After top-k the kept mass is 0.4 / 0.7 = 0.571 < 0.6, so the second token stays.
    assert torch.allclose(truncation_thresholds(logits, inputs), logits[0, 1:2])
    # At temperature 0.25 the probabilities are proportional to p^4: 0.4^4 / (0.4^4 + 0.3^4 + ...) > 0.6.
    cold = make_inputs(1, temperature=0.25, top_p=0.6)
    assert torch.allclose(truncation_thresholds(logits, cold), logits[0, :1])


def test_sample_respects_truncation_and_reports_full_vocabulary_log_probs():
    logits = torch.tensor([[1.0, 0.9, 0.8, -5.0]]).expand(500, 4).contiguous()
    inputs = make_inputs(500, temperature=2.0, top_k=2)
    token_ids, log_probs = Sampler()(logits, inputs)
    assert set(token_ids.tolist()) == {0, 1}
    full = torch.log_softmax(logits[0] / 2.0, dim=0)
    assert torch.allclose(log_probs, full[token_ids])


def test_greedy_rows_take_the_argmax_with_unscaled_log_probs():
    logits = torch.tensor([[0.1, 3.0, 2.9], [5.0, -1.0, 0.0]])
    inputs = make_inputs(2, temperature=0.0)
    token_ids, log_probs = Sampler()(logits, inputs)
    assert token_ids.tolist() == [1, 0]
    assert torch.allclose(log_probs, torch.log_softmax(logits, dim=-1)[[0, 1], [1, 0]])


def test_reference_is_batch_independent_row_by_row():
    torch.manual_seed(0)
    logits = torch.randn(6, 300)
    temperatures = torch.tensor([1.0, 0.5, 0.0, 1.5, 1.0, 0.9])
    keys = row_keys(torch.arange(6) * 1000, torch.arange(6))
    thresholds = torch.full((6,), float("-inf"))
    batched = sample_reference(logits, temperatures, thresholds, keys)
    for row in range(6):
        alone = sample_reference(logits[row:row + 1], temperatures[row:row + 1], thresholds[row:row + 1],
                                 keys[row:row + 1])
        assert alone[0].item() == batched[0][row].item()
        assert alone[1].item() == batched[1][row].item()
