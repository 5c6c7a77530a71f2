"""Token embeddings whose gradient goes straight into a float32 tensor, e.g. the embedding's fp32 master gradient.

    hidden = embedding_rows(weight, input_ids, grad_into=master.grad)   # (N, H) rows of weight (V, H)
    ...backward()                                                        # master.grad[input_ids] += dL/dhidden

Why. Autograd's gradient of an embedding lookup is a (V, H) tensor of the weight's dtype: zeros everywhere but
the looked-up rows. For Qwen2's 151,936 x 896 vocabulary a graphed step would zero that bf16 tensor, add the
rows into it and then add all of it into the fp32 master, per micro-batch: three passes over a (V, H) tensor to
deliver N rows. Here backward adds the N rows (in fp32) into `grad_into` and gives the weight
no gradient. Rows of repeated ids add in any order (atomic adds on CUDA): equal up to float rounding.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable


def embedding_rows(weight: Tensor, input_ids: Tensor, grad_into: Tensor) -> Tensor:
    """weight (V, H) rows at input_ids (N,) int64 -> (N, H) in the weight's dtype; backward adds dL/d rows into
    `grad_into` (float32 of the weight's shape) and returns none for the weight."""
    if input_ids.dim() != 1:
        raise ValueError(f"input_ids must be flattened (N,), got shape {tuple(input_ids.shape)}")
    if grad_into.shape != weight.shape or grad_into.dtype != torch.float32:
        raise ValueError(f"grad_into must be float32 of shape {tuple(weight.shape)}, "
                         f"got {grad_into.dtype} of shape {tuple(grad_into.shape)}")
    return EmbeddingRows.apply(weight, input_ids, grad_into)


class EmbeddingRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weight: Tensor, input_ids: Tensor, grad_into: Tensor) -> Tensor:
        ctx.save_for_backward(input_ids)
        ctx.grad_into = grad_into  # not saved: backward adds into it in place
        return weight.index_select(0, input_ids)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_rows: Tensor):
        input_ids, = ctx.saved_tensors
        ctx.grad_into.index_add_(0, input_ids, grad_rows.to(torch.float32))
        return None, None, None
