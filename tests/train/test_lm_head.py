"""The chunked LM head (log-probs and entropies without full logits) against the plain full-logits computation:
outputs, gradients w.r.t. hidden states and weight (tied too), `response_log_probs` on a tiny model, and peak
memory measured from the profiler's allocation events (the fused kernels' tests: `fast/test_triton_lm_head.py`):

    python -m pytest tests/train/test_lm_head.py -q
"""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from asyncrl.algos import entropy_from_logits
from asyncrl.models import CausalLM, init_weights, tiny_config
from asyncrl.train.forward import dense_positions, response_log_probs
from asyncrl.models.linear_into import accumulate_matmul
from asyncrl.train.lm_head import chunk_size_for_budget, even_chunks, token_log_probs_and_entropy

from .helpers import make_batch

TOLERANCES = {torch.float32: 1e-5, torch.float64: 1e-10}


def plain_log_probs_and_entropy(hidden, weight, target_ids, temperature):
    """The straightforward version: full (N, V) logits, log_softmax, gather, entropy_from_logits."""
    logits = (hidden @ weight.t()).to(torch.promote_types(hidden.dtype, torch.float32)) / temperature
    log_probs = torch.log_softmax(logits, dim=-1).gather(1, target_ids[:, None]).squeeze(1)
    return log_probs, entropy_from_logits(logits)


def random_inputs(dtype, num_tokens=10, hidden_size=16, vocab_size=50, seed=0):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(num_tokens, hidden_size, generator=generator, dtype=dtype).requires_grad_()
    # Large enough weights for peaked distributions: entropies well below log V.
    weight = (torch.randn(vocab_size, hidden_size, generator=generator, dtype=dtype) * 0.7).requires_grad_()
    target_ids = torch.randint(0, vocab_size, (num_tokens,), generator=generator)
    coefficients = torch.randn(2, num_tokens, generator=generator, dtype=dtype)
    return hidden, weight, target_ids, coefficients


def outputs_and_gradients(function, hidden, weight, target_ids, coefficients, temperature):
    log_probs, entropy = function(hidden, weight, target_ids, temperature)
    loss = (coefficients[0] * log_probs).sum() + (coefficients[1] * entropy).sum()
    grad_hidden, grad_weight = torch.autograd.grad(loss, [hidden, weight])
    return log_probs, entropy, grad_hidden, grad_weight


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_size", [1, 3, 10, 64, None])
def test_matches_full_logits_outputs_and_gradients(dtype, temperature, chunk_size):
    inputs = random_inputs(dtype)
    expected = outputs_and_gradients(plain_log_probs_and_entropy, *inputs, temperature)

    def chunked(hidden, weight, target_ids, temperature):
        return token_log_probs_and_entropy(hidden, weight, target_ids, temperature, True, chunk_size)

    actual = outputs_and_gradients(chunked, *inputs, temperature)
    assert actual[0].dtype == actual[1].dtype == dtype
    tolerance = TOLERANCES[dtype]
    for name, got, want in zip(("log_probs", "entropy", "grad_hidden", "grad_weight"), actual, expected):
        torch.testing.assert_close(got, want, atol=tolerance, rtol=0, msg=name)
    assert expected[1].min() > 0.1 and expected[1].max() < 0.95 * torch.log(torch.tensor(50.0))  # not uniform


def test_bfloat16_matmuls_with_float32_softmax_and_weight_gradient():
    """The GPU path: bf16 inputs, float32 outputs, bf16 gradients summed over chunks in float32."""
    hidden, weight, target_ids, coefficients = random_inputs(torch.float32, num_tokens=37)
    hidden_bf16 = hidden.detach().bfloat16().requires_grad_()
    weight_bf16 = weight.detach().bfloat16().requires_grad_()

    def chunked(hidden, weight, target_ids, temperature):
        return token_log_probs_and_entropy(hidden, weight, target_ids, temperature, True, chunk_size=8)

    actual = outputs_and_gradients(chunked, hidden_bf16, weight_bf16, target_ids, coefficients, 0.7)
    expected = outputs_and_gradients(plain_log_probs_and_entropy, hidden_bf16, weight_bf16, target_ids,
                                     coefficients, 0.7)
    assert [tensor.dtype for tensor in actual] == [torch.float32, torch.float32, torch.bfloat16, torch.bfloat16]
    torch.testing.assert_close(actual[0], expected[0], atol=1e-5, rtol=0)  # same bf16 logits, float32 math
    torch.testing.assert_close(actual[1], expected[1], atol=1e-5, rtol=0)
    for got, want in zip(actual[2:], expected[2:]):  # bf16 rounding of per-chunk products vs one product
        torch.testing.assert_close(got.float(), want.float(), atol=1e-2 * want.float().abs().max().item(), rtol=0)


def test_tied_weight_gets_both_gradients():
    """The head weight doubles as the embedding that produced the hidden states (tie_word_embeddings)."""
    generator = torch.Generator().manual_seed(1)
    embedding = torch.randn(40, 8, generator=generator, dtype=torch.float64).requires_grad_()
    mixing = torch.randn(8, 8, generator=generator, dtype=torch.float64)
    input_ids = torch.randint(0, 40, (9,), generator=generator)
    target_ids = torch.randint(0, 40, (9,), generator=generator)
    coefficients = torch.randn(2, 9, generator=generator, dtype=torch.float64)

    def gradient(function):
        hidden = torch.tanh(embedding[input_ids] @ mixing)
        log_probs, entropy = function(hidden, embedding, target_ids, 0.7)
        loss = (coefficients[0] * log_probs).sum() + (coefficients[1] * entropy).sum()
        return torch.autograd.grad(loss, embedding)[0]

    chunked = gradient(lambda *args: token_log_probs_and_entropy(*args, with_entropy=True, chunk_size=4))
    torch.testing.assert_close(chunked, gradient(plain_log_probs_and_entropy), atol=1e-10, rtol=0)


def test_one_output_alone_and_no_tokens():
    hidden, weight, target_ids, _ = random_inputs(torch.float64)
    plain_log_probs, plain_entropy = plain_log_probs_and_entropy(hidden, weight, target_ids, 0.7)
    # Log-probs only (with_entropy=False), then entropy only (the log-probs are not in the loss).
    log_probs, entropy = token_log_probs_and_entropy(hidden, weight, target_ids, 0.7, False, chunk_size=3)
    assert entropy is None
    for got, want in zip(torch.autograd.grad(log_probs.sum(), [hidden, weight]),
                         torch.autograd.grad(plain_log_probs.sum(), [hidden, weight], retain_graph=True)):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=0)
    _, entropy = token_log_probs_and_entropy(hidden, weight, target_ids, 0.7, True, chunk_size=3)
    for got, want in zip(torch.autograd.grad(entropy.sum(), [hidden, weight]),
                         torch.autograd.grad(plain_entropy.sum(), [hidden, weight])):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=0)
    # A micro-batch without valid tokens (data-parallel padding rows) still gives the weight a gradient (zeros),
    # so every FSDP rank reduces the same gradients.
    empty = hidden[:0]
    log_probs, entropy = token_log_probs_and_entropy(empty, weight, target_ids[:0], 0.7, True)
    assert log_probs.shape == entropy.shape == (0,)
    (grad_weight,) = torch.autograd.grad((log_probs.sum() + entropy.sum()), weight)
    assert torch.equal(grad_weight, torch.zeros_like(weight))


def plain_response_log_probs(model, batch, temperature):
    """The former `response_log_probs`: (B, R, V) logits over the padded grid, then masking."""
    hidden = model(batch.input_ids, dense_positions(batch.input_ids))
    index = batch.response_positions() - 1
    hidden = torch.gather(hidden, 1, index[:, :, None].expand(-1, -1, hidden.shape[-1]))  # (B, R, H)
    logits = model.lm_head(hidden) / temperature  # (B, R, V); compute_logits would round float64 to float32
    log_probs = torch.log_softmax(logits, -1).gather(2, batch.response_ids()[:, :, None]).squeeze(-1)
    valid = batch.response_mask > 0
    zeros = torch.zeros_like(log_probs)
    return torch.where(valid, log_probs, zeros), torch.where(valid, entropy_from_logits(logits), zeros)


def test_response_log_probs_match_the_padded_grid_version():
    model = CausalLM(tiny_config("qwen2", num_layers=1, hidden_size=32)).double()
    init_weights(model, seed=0, init_std=0.2)
    batch = make_batch(seed=2)
    # A masked token inside a response (and a whole masked row) must read 0, like padding.
    mask = batch.response_mask.clone()
    mask[0, 0] = 0.0
    mask[3] = 0.0
    batch = batch.replace(response_mask=mask)
    coefficients = torch.randn(2, *mask.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)

    def outputs_and_gradients(function):
        log_probs, entropy = function(model, batch, 0.7)
        loss = (coefficients[0] * log_probs).sum() + (coefficients[1] * entropy).sum()
        return [log_probs, entropy, *torch.autograd.grad(loss, list(model.parameters()))]

    expected = outputs_and_gradients(plain_response_log_probs)
    actual = outputs_and_gradients(lambda *args: response_log_probs(*args, with_entropy=True))
    assert actual[0].shape == mask.shape and (actual[0][mask == 0] == 0).all() and (actual[1][mask == 0] == 0).all()
    for got, want in zip(actual, expected):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=0)
    no_entropy = response_log_probs(model, batch, 0.7, with_entropy=False)
    assert no_entropy[1] is None
    torch.testing.assert_close(no_entropy[0], expected[0], atol=1e-10, rtol=0)


def test_chunk_size_from_budget():
    assert chunk_size_for_budget(151_936, 512 * 2**20) == 883  # Qwen2's vocabulary
    assert chunk_size_for_budget(50_000, 2 * 2**20) == 10
    assert chunk_size_for_budget(50_000, 1000) == 1


def peak_allocated_bytes(function) -> int:
    """Peak of live CPU allocations while `function` runs: a running sum of the profiler's allocation events
    (+bytes when allocated, -bytes when freed), in time order."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        function()
    events = [event for event in profiler.profiler.kineto_results.events() if event.name() == "[memory]"]
    live = peak = 0
    for event in sorted(events, key=lambda event: event.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
    return peak


def test_peak_memory_stays_near_one_chunk_of_logits():
    num_tokens, hidden_size, vocab_size = 512, 32, 40_000
    hidden, weight, target_ids, coefficients = random_inputs(torch.float32, num_tokens, hidden_size, vocab_size)
    full_logits_bytes = num_tokens * vocab_size * 4  # 82 MB
    budget = 4 * 2**20
    chunk_size = chunk_size_for_budget(vocab_size, budget)  # 26 tokens: 20 chunks

    def chunked():
        outputs_and_gradients(
            lambda *args: token_log_probs_and_entropy(*args, with_entropy=True, chunk_size=chunk_size),
            hidden, weight, target_ids, coefficients, 0.7)

    def plain():
        outputs_and_gradients(plain_log_probs_and_entropy, hidden, weight, target_ids, coefficients, 0.7)

    chunked_peak, plain_peak = peak_allocated_bytes(chunked), peak_allocated_bytes(plain)
    # The measurement sees the full logits (and their copies) of the plain version...
    assert plain_peak > 2 * full_logits_bytes
    # ...and the chunked one holds a few chunk-sized buffers besides the float32 weight gradient and its result.
    weight_gradient_bytes = 2 * weight.numel() * 4
    assert chunked_peak < weight_gradient_bytes + 4 * budget, (chunked_peak, plain_peak)
    assert chunked_peak < plain_peak / 20


@pytest.mark.parametrize("with_entropy", [True, False])
def test_weight_gradient_is_added_where_asked_and_not_returned(with_entropy):
    """`weight_grad_into`: the LM head's weight gradient lands in the given fp32 tensor, on top of what it held,
    and autograd gets none for the weight from this op (a tied use elsewhere still gets its own)."""
    hidden, weight, target_ids, coefficients = random_inputs(torch.float32, 40, 16, 300)

    def loss_of(log_probs, entropy):
        loss = (coefficients[0] * log_probs).sum()
        return loss + (coefficients[1] * entropy).sum() if with_entropy else loss

    expected_hidden, expected_weight = torch.autograd.grad(
        loss_of(*token_log_probs_and_entropy(hidden, weight, target_ids, 0.7, with_entropy, chunk_size=16)),
        [hidden, weight])
    into = torch.full(weight.shape, 0.25)
    log_probs, entropy = token_log_probs_and_entropy(hidden, weight, target_ids, 0.7, with_entropy, chunk_size=16,
                                                     weight_grad_into=into)
    tied_use = (weight * 3.0).sum()  # as an embedding's: its gradient (3 everywhere) still reaches the weight
    grad_hidden, grad_weight = torch.autograd.grad(loss_of(log_probs, entropy) + tied_use, [hidden, weight])
    torch.testing.assert_close(grad_hidden, expected_hidden, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(grad_weight, torch.full(weight.shape, 3.0))
    torch.testing.assert_close(into, expected_weight + 0.25, atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="weight_grad_into must be"):
        token_log_probs_and_entropy(hidden, weight, target_ids, 0.7, with_entropy, weight_grad_into=into[:, :3])


def test_even_chunks_split_tokens_into_the_fewest_near_equal_chunks():
    assert even_chunks(3584, 1766) == [(0, 1194), (1194, 2389), (2389, 3584)]
    assert even_chunks(10, 10) == [(0, 10)]
    assert even_chunks(11, 10) == [(0, 5), (5, 11)]
    assert even_chunks(0, 10) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_weight_gradient_accumulates_in_place_from_one_float32_output_gemm_on_cuda():
    generator = torch.Generator(device="cuda").manual_seed(0)
    left = torch.randn(300, 40, device="cuda", generator=generator).bfloat16()
    right = torch.randn(40, 24, device="cuda", generator=generator).bfloat16()
    accumulator = torch.randn(300, 24, device="cuda", generator=generator)
    expected = accumulator.double() + left.double() @ right.double()
    pointer = accumulator.data_ptr()
    accumulate_matmul(accumulator, left, right)
    assert accumulator.data_ptr() == pointer and accumulator.dtype == torch.float32
    # Within float32 rounding of the exact sum: the product was never rounded to bf16 (which errs by ~1e-2).
    torch.testing.assert_close(accumulator.double(), expected, atol=1e-4, rtol=1e-5)
