"""Embedding rows whose gradient is added into a given float32 tensor (`asyncrl/train/fast/embedding_lookup.py`)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from asyncrl.train.fast.embedding_lookup import embedding_rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_equal_the_embedding_and_their_gradient_lands_in_the_given_tensor(dtype):
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(50, 8, generator=generator).to(dtype).requires_grad_()
    input_ids = torch.tensor([3, 7, 3, 49, 0, 3])  # repeated ids sum their rows' gradients
    upstream = torch.randn(6, 8, generator=generator).to(dtype)
    # Summed in float32, not rounded to the weight's dtype first: the reference is the float32 embedding's.
    weight32 = weight.detach().float().requires_grad_()
    expected, = torch.autograd.grad((F.embedding(input_ids, weight32) * upstream.float()).sum(), weight32)
    into = torch.full((50, 8), 0.5)
    rows = embedding_rows(weight, input_ids, into)
    assert torch.equal(rows, F.embedding(input_ids, weight))
    tied_use = (weight * 2.0).sum()  # as a tied LM head's: its own gradient still reaches the weight
    grad_weight, = torch.autograd.grad((rows * upstream).sum() + tied_use, weight)
    assert torch.equal(grad_weight, torch.full_like(weight, 2.0))
    torch.testing.assert_close(into, expected + 0.5, atol=1e-6, rtol=1e-6)
    assert into[1].eq(0.5).all()  # rows no id looked up are untouched


def test_bad_inputs_name_what_is_wrong():
    weight = torch.randn(10, 4, requires_grad=True)
    with pytest.raises(ValueError, match="input_ids must be flattened"):
        embedding_rows(weight, torch.zeros(2, 3, dtype=torch.int64), torch.zeros(10, 4))
    with pytest.raises(ValueError, match="grad_into must be float32 of shape"):
        embedding_rows(weight, torch.zeros(3, dtype=torch.int64), torch.zeros(10, 4, dtype=torch.bfloat16))
