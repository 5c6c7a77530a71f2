"""The chunked LM head's fused (Triton) kernels against its torch chunk math, alone and inside the whole chunked op,
and the choice of them (`asyncrl/train/fast/triton_lm_head.py`, `fast/selection.py`). The kernels run on a GPU, or
on the CPU under Triton's interpreter, which `tests/conftest.py` turns on where no GPU is present:

    python -m pytest tests/train/fast/test_triton_lm_head.py -q
"""

from __future__ import annotations

import os

import pytest
import torch

from asyncrl.models import CausalLM, init_weights, tiny_config
from asyncrl.train import lm_head
from asyncrl.train.fast import selection
from asyncrl.train.forward import response_log_probs
from asyncrl.train.lm_head import even_chunks, token_log_probs_and_entropy

from ..helpers import make_batch
from ..test_lm_head import random_inputs


def test_a_compiled_model_on_cpu_keeps_the_torch_lm_head(monkeypatch):
    """The fused kernels are the GPU path: triton imports in the CPU test install and its interpreter is on, yet
    a compiled model's head on CPU tensors runs the torch chunks."""
    import triton  # noqa: F401 (the premise: present, so only the device decides)

    def triton_lm_head_kernels():
        raise AssertionError("the fused LM-head kernels ran on CPU tensors")

    monkeypatch.setattr(selection, "triton_lm_head_kernels", triton_lm_head_kernels)
    model = CausalLM(tiny_config("qwen2", num_layers=1, hidden_size=32))
    init_weights(model, seed=0, init_std=0.2)
    model.is_compiled = True  # what `compile_decoder_layers` sets; the flag alone picks the head
    log_probs, entropy = response_log_probs(model, make_batch(seed=2), 0.7, with_entropy=True)
    log_probs.sum().add(entropy.sum()).backward()
    assert model.lm_head.weight.grad.abs().sum() > 0


# The fused kernels run on a GPU, or on CPU tensors under Triton's interpreter.
FUSED_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"),
                                  reason="runs Triton kernels on a GPU or under TRITON_INTERPRET=1")


@needs_triton
@pytest.mark.parametrize("with_entropy", [True, False])
@pytest.mark.parametrize("vocab_size", [5000, 4096, 37])  # several blocks with a ragged last one; exact; < 1 block
def test_fused_chunk_kernels_match_the_torch_chunk_math(with_entropy, vocab_size):
    """The Triton statistics and gradient against `chunk_statistics` / `chunk_grad_logits` on the same float32
    logits (peaked rows, a temperature, a row whose target is its largest logit)."""
    from asyncrl.train.lm_head import chunk_grad_logits, chunk_statistics
    from asyncrl.train.fast.triton_lm_head import fused_chunk_grad_logits_, fused_chunk_statistics

    generator = torch.Generator().manual_seed(1)
    logits = (torch.randn(6, vocab_size, generator=generator) * torch.tensor([1.0, 4.0, 8.0, 0.1, 2.0, 30.0])[:, None])
    target_ids = torch.randint(0, vocab_size, (6,), generator=generator)
    target_ids[2] = logits[2].argmax()
    grad_log_probs, grad_entropy = torch.randn(2, 6, generator=generator)
    logits, target_ids = logits.to(FUSED_DEVICE), target_ids.to(FUSED_DEVICE)
    grad_log_probs, grad_entropy = grad_log_probs.to(FUSED_DEVICE), grad_entropy.to(FUSED_DEVICE)

    expected = chunk_statistics(logits, target_ids, 0.7, with_entropy)
    actual = fused_chunk_statistics(logits, target_ids, 0.7, with_entropy)
    for name, want, got in zip(("log_probs", "entropy", "lse"), expected, actual):
        if want is None:
            assert got is None
        else:
            torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5, msg=name)
    entropy = expected[1]
    expected_grad = chunk_grad_logits(logits, target_ids, expected[2], grad_log_probs,
                                      grad_entropy if with_entropy else None, entropy, 0.7)
    buffer = logits.clone()
    actual_grad = fused_chunk_grad_logits_(buffer, target_ids, expected[2], grad_log_probs,
                                           grad_entropy if with_entropy else None, entropy, 0.7)
    assert actual_grad.data_ptr() == buffer.data_ptr()  # written over the logits
    torch.testing.assert_close(actual_grad, expected_grad, atol=1e-6, rtol=1e-4)
    # The gradient of a log-prob sums to 0 over the vocabulary (softmax's rows sum to 1).
    if not with_entropy:
        assert actual_grad.sum(dim=1).abs().max().item() < 1e-4


@needs_triton
@pytest.mark.parametrize("with_entropy", [True, False])
@pytest.mark.parametrize("vocab_size, segments", [(13000, 4), (5000, 4), (37, 2), (20000, 8)])
def test_statistics_split_over_vocabulary_segments_equal_the_one_program_per_row_kernel(with_entropy, vocab_size,
                                                                                         segments):
    """Rows split among `segments` programs and merged (ragged last segments, empty ones, more rows than one merge
    program takes) give the one-program-per-row statistics and the torch chunk math."""
    from asyncrl.train.lm_head import chunk_statistics
    from asyncrl.train.fast.triton_lm_head import fused_chunk_statistics

    generator = torch.Generator().manual_seed(2)
    scales = torch.tensor([0.1, 1.0, 4.0, 30.0]).repeat(18)[:70, None]
    logits = (torch.randn(70, vocab_size, generator=generator) * scales).to(FUSED_DEVICE)
    target_ids = torch.randint(0, vocab_size, (70,), generator=generator).to(FUSED_DEVICE)
    single = fused_chunk_statistics(logits, target_ids, 0.7, with_entropy, segments=1)
    split = fused_chunk_statistics(logits, target_ids, 0.7, with_entropy, segments=segments)
    expected = chunk_statistics(logits, target_ids, 0.7, with_entropy)
    for name, one, many, want in zip(("log_probs", "entropy", "lse"), single, split, expected):
        if want is None:
            assert one is None and many is None
            continue
        torch.testing.assert_close(many, one, atol=2e-5, rtol=1e-5, msg=name)
        torch.testing.assert_close(many, want, atol=2e-5, rtol=1e-5, msg=name)
    with pytest.raises(ValueError, match="power of two"):
        fused_chunk_statistics(logits, target_ids, 0.7, with_entropy, segments=3)


@needs_triton
@pytest.mark.parametrize("chunk_size", [128, None], ids=["chunks", "default"])
@pytest.mark.parametrize("store_logits", [True, False], ids=["stored", "recomputed"])
@pytest.mark.parametrize("with_entropy", [True, False])
def test_fused_lm_head_matches_the_torch_lm_head(with_entropy, store_logits, chunk_size, monkeypatch):
    """The whole chunked op with the fused kernels against the torch path: outputs and both gradients, with
    chunks of uneven token counts (bf16 on a GPU, float32 under the interpreter). With the default chunk size
    and stored logits the fused op makes all tokens one chunk; the torch path keeps its byte budget."""
    from asyncrl.train.fast.triton_lm_head import TRITON_CHUNK_KERNELS

    dtype = torch.bfloat16 if FUSED_DEVICE == "cuda" else torch.float32
    # The step's logits kept from forward to backward, or recomputed there per chunk (over the byte budget).
    monkeypatch.setattr(lm_head, "STORED_LOGITS_BYTES", 2**40 if store_logits else 0)
    hidden, weight, target_ids, coefficients = random_inputs(torch.float32, 300, 64, 5000)
    hidden = hidden.detach().to(FUSED_DEVICE, dtype).requires_grad_()
    weight = weight.detach().to(FUSED_DEVICE, dtype).requires_grad_()
    target_ids, coefficients = target_ids.to(FUSED_DEVICE), coefficients.to(FUSED_DEVICE, torch.float32)

    monkeypatch.setattr(lm_head, "chunk_size_for_budget", lambda *args, **kwargs: 100)  # the byte budget's
    splits = []
    monkeypatch.setattr(lm_head, "even_chunks", lambda *args: splits.append(args) or even_chunks(*args))

    def run(fused):
        log_probs, entropy = token_log_probs_and_entropy(hidden, weight, target_ids, 0.7, with_entropy,
                                                         chunk_size=chunk_size,
                                                         fused_kernels=TRITON_CHUNK_KERNELS if fused else None)
        loss = (coefficients[0] * log_probs).sum()
        if with_entropy:
            loss = loss + (coefficients[1] * entropy).sum()
        return (log_probs, *torch.autograd.grad(loss, [hidden, weight]))

    tolerance = 1e-2 if dtype == torch.bfloat16 else 1e-5
    eager_results = run(False)
    eager_splits, splits[:] = splits[:], []
    fused_results = run(True)
    one_chunk = chunk_size is None and store_logits
    assert {size for _, size in eager_splits} == {chunk_size or 100}
    assert {size for _, size in splits} == ({300} if one_chunk else {chunk_size or 100})
    for eager, fused in zip(eager_results, fused_results):
        scale = eager.float().abs().max().item()
        assert (eager.float() - fused.float()).abs().max().item() <= tolerance * max(scale, 1.0)
