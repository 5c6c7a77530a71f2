"""A linear layer whose weight gradient is added into a given float32 tensor instead of returned.

    y = linear_into(x, weight, into)   # x (..., K), weight (N, K) -> (..., N), as F.linear without bias
    ...backward()                      # into += dL/dy^T x (float32), and the weight gets no gradient

Why. The trainer's graphed step (`actor.cuda_graphs`) sums micro-batch gradients in the fp32 masters. With
autograd's weight gradients that is a bf16 (N, K) product per micro-batch, written, read back and added into the
master by a separate pass: 12 bytes of memory traffic per parameter per micro-batch, ~1 ms of an H200's time for
a 0.5B model, most of it the MLP's. Here backward's weight-gradient GEMM adds its float32 output straight into
the master (`accumulate_matmul`: cuBLAS's beta = 1), inside a kernel that is compute-bound at the trainer's
4,096-token micro-batches.

A `torch.library` custom op, so that Inductor compiles the layers around it (the trainer's compiled layer
halves) and calls it as one opaque kernel forward and backward, and a CUDA graph replays it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def accumulate_matmul(accumulator: Tensor, left: Tensor, right: Tensor) -> None:
    """accumulator += left @ right, the sum in the accumulator's dtype. On CUDA with bf16/fp16 inputs and a
    float32 accumulator, one GEMM whose float32 output adds into the accumulator (cuBLAS's beta = 1): no
    rounded product and no second pass over it. Elsewhere the product is rounded to the inputs' dtype, then
    added."""
    if left.dtype == accumulator.dtype:
        accumulator.addmm_(left, right)
    elif accumulator.is_cuda:
        torch.addmm(accumulator, left, right, out_dtype=accumulator.dtype, out=accumulator)
    else:
        accumulator.add_(torch.mm(left, right))


@torch.library.custom_op("asyncrl::linear_into", mutates_args=())
def linear_into(x: Tensor, weight: Tensor, into: Tensor) -> Tensor:
    """F.linear(x, weight); backward adds the weight's gradient into `into` (float32, the weight's shape)."""
    return F.linear(x, weight)


@linear_into.register_fake
def _linear_into_shape(x: Tensor, weight: Tensor, into: Tensor) -> Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.custom_op("asyncrl::add_weight_gradient", mutates_args=("into",))
def add_weight_gradient(into: Tensor, grad_output: Tensor, x: Tensor) -> None:
    """into += grad_output^T x over every leading dimension, summed in float32."""
    accumulate_matmul(into, grad_output.reshape(-1, grad_output.shape[-1]).t(), x.reshape(-1, x.shape[-1]))


@add_weight_gradient.register_fake
def _add_weight_gradient_shape(into: Tensor, grad_output: Tensor, x: Tensor) -> None:
    return None


def _save(ctx, inputs: tuple[Tensor, Tensor, Tensor], output: Tensor) -> None:
    x, weight, into = inputs
    ctx.save_for_backward(x, weight)
    ctx.into = into  # not saved: backward adds into it in place


def _backward(ctx, grad_output: Tensor):
    x, weight = ctx.saved_tensors
    add_weight_gradient(ctx.into, grad_output, x)
    return grad_output @ weight, None, None


linear_into.register_autograd(_backward, setup_context=_save)
