"""Entropy from logits (stability, chunking) and the clipped value loss with explained variance."""

import math

import pytest
import torch

from asyncrl.algos import LOSS_AGG_MODES, entropy_from_logits, explained_variance, value_loss

from .helpers import append_padding, fill_padding, reference_aggregate, valid_positions


def reference_entropy(row: list[float]) -> float:
    top = max(row)
    weights = [math.exp(z - top) for z in row]
    total = sum(weights)
    return -sum(w / total * math.log(w / total) for w in weights if w > 0)


def test_entropy_matches_loop_and_keeps_leading_shape():
    logits = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    entropy = entropy_from_logits(logits)
    assert entropy.shape == (2, 3) and entropy.dtype == torch.float64
    expected = torch.tensor([[reference_entropy(row) for row in block] for block in logits.tolist()],
                            dtype=torch.float64)
    torch.testing.assert_close(entropy, expected)


def test_entropy_is_stable_for_large_and_masked_logits():
    logits = torch.tensor([[1e4, 1e4, -1e4, 0.0], [0.0, 0.0, -math.inf, -math.inf]], requires_grad=True)
    entropy = entropy_from_logits(logits)
    torch.testing.assert_close(entropy, torch.tensor([math.log(2), math.log(2)]))
    (gradient,) = torch.autograd.grad(entropy.sum(), logits)
    assert torch.isfinite(gradient).all()
    bf16 = entropy_from_logits(torch.zeros(3, 5, dtype=torch.bfloat16))
    assert bf16.dtype == torch.float32
    torch.testing.assert_close(bf16, torch.full((3,), math.log(5)))


@pytest.mark.parametrize("chunk_size", [1, 3, 5, 100])
def test_chunked_entropy_equals_unchunked_with_gradients(chunk_size):
    logits = torch.randn(2, 5, 11, generator=torch.Generator().manual_seed(1), requires_grad=True)
    expected = entropy_from_logits(logits)
    (expected_gradient,) = torch.autograd.grad((expected * torch.arange(5.0)).sum(), logits)
    chunked = entropy_from_logits(logits, chunk_size=chunk_size)
    (gradient,) = torch.autograd.grad((chunked * torch.arange(5.0)).sum(), logits)
    torch.testing.assert_close(chunked, expected)
    torch.testing.assert_close(gradient, expected_gradient)
    with torch.no_grad():
        torch.testing.assert_close(entropy_from_logits(logits, chunk_size=chunk_size), expected.detach())
    with pytest.raises(ValueError, match="chunk_size"):
        entropy_from_logits(logits, chunk_size=0)


MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.float32)
VALUES = torch.tensor([[1.0, 0.2, -0.6, 0], [2.0, 0.0, 0, 0], [0, 0, 0, 0]], dtype=torch.float64)
OLD_VALUES = torch.tensor([[0.0, 0.0, 0.0, 0], [1.0, 0.1, 0, 0], [0, 0, 0, 0]], dtype=torch.float64)
RETURNS = torch.tensor([[2.0, 0.0, 0.0, 0], [0.0, 1.0, 0, 0], [0, 0, 0, 0]], dtype=torch.float64)


def reference_value_terms(clip: float):
    per_token, clipped_flags = [[0.0] * 4 for _ in range(3)], [[0.0] * 4 for _ in range(3)]
    for i, row in enumerate(valid_positions(MASK)):
        for t in row:
            value, old, target = float(VALUES[i, t]), float(OLD_VALUES[i, t]), float(RETURNS[i, t])
            clipped_value = old + min(max(value - old, -clip), clip)
            unclipped, clipped = (value - target) ** 2, (clipped_value - target) ** 2
            per_token[i][t] = max(unclipped, clipped)
            clipped_flags[i][t] = float(clipped > unclipped)
    return per_token, clipped_flags


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_value_loss_matches_loop(mode):
    per_token, clipped_flags = reference_value_terms(0.5)
    values = fill_padding(VALUES, MASK, math.nan).requires_grad_(True)
    loss, metrics = value_loss(values, fill_padding(OLD_VALUES, MASK, math.inf), fill_padding(RETURNS, MASK, math.nan),
                               MASK, cliprange_value=0.5, loss_agg_mode=mode)
    expected = 0.5 * reference_aggregate(per_token, MASK, mode, norm_length=4)
    assert loss.item() == pytest.approx(expected)
    assert metrics["vf_loss"] == pytest.approx(expected)
    assert metrics["vf_clipfrac"] == pytest.approx(reference_aggregate(clipped_flags, MASK, "token-mean", 4))
    assert 0 < metrics["vf_clipfrac"] < 1
    (gradient,) = torch.autograd.grad(loss, values)
    assert torch.isfinite(gradient).all() and (gradient[MASK == 0] == 0).all()


def test_value_loss_padding_and_global_counts():
    keywords = dict(cliprange_value=0.2, loss_agg_mode="seq-mean-token-sum-norm", num_tokens=50, num_seqs=4,
                    norm_length=8)
    loss, metrics = value_loss(VALUES, OLD_VALUES, RETURNS, MASK, **keywords)
    padded_loss, padded_metrics = value_loss(append_padding(VALUES, 2, math.nan), append_padding(OLD_VALUES, 2, 0.0),
                                             append_padding(RETURNS, 2, math.inf), append_padding(MASK, 2, 0.0),
                                             **keywords)
    per_token, _ = reference_value_terms(0.2)
    assert loss.item() == pytest.approx(0.5 * sum(map(sum, per_token)) / (4 * 8))
    torch.testing.assert_close(padded_loss, loss)
    assert padded_metrics == metrics


def test_explained_variance():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    returns = fill_padding(torch.tensor([[1.0, 2.0, 0], [3.0, 4.0, 5.0]]), mask, math.nan)
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    values = torch.full_like(returns, 3.0)  # the mean of the valid returns: explains nothing
    assert explained_variance(returns, values, mask) == pytest.approx(0.0)
    values = torch.tensor([[1.5, 2.0, 0], [3.0, 4.0, 4.0]])
    # Var(R) = 2, Var(R - V) = population variance of [-0.5, 0, 0, 0, 1] = 0.24
    assert explained_variance(returns, values, mask) == pytest.approx(1 - 0.24 / 2)
    assert explained_variance(torch.ones(2, 3), torch.zeros(2, 3), mask) == 0.0  # no variance to explain
