"""The decode step's matrix products: a Triton GEMM for few rows, as one opaque op inside compiled layers.

    y = decode_linear(x, weight, bias)      # x (M, K), weight (N, K), bias (N,) or None -> (M, N)

Why. A decode step multiplies at most `max_num_seqs` rows (256) by every weight matrix once, so each
product streams its weights from HBM and does little else. cuBLAS's kernels for these shapes tile the rows
128 or more at a time, leaving few programs in flight for narrow outputs (896 columns of 0.5B's o/down
projections) and long K loops; Inductor's autotuner measured Triton tiles of 64 rows x 32 or 128 columns x
128 of K 1.3-1.7x faster than cuBLAS on all four of 0.5B's layer shapes on an H200 (cold weights). Above
`MAX_ROWS` rows (prefill) the op calls `F.linear` (cuBLAS is right there), and off CUDA it always does.

The op is a `torch.library.custom_op`, so `torch.compile` keeps it as one opaque call (fake tensor: the
output shape) and the CUDA-graph capture records its kernel. Imported only where triton is (CUDA engines).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

MAX_ROWS = 256  # the decode buckets' largest batch by default; prefills are far above
BLOCK_M, BLOCK_K = 64, 128
WIDE_OUTPUT = 4096  # outputs this wide take 128-column tiles (enough programs), narrower ones 32


@triton.jit
def _decode_linear_kernel(x_ptr, weight_ptr, bias_ptr, out_ptr, num_rows, num_cols, depth, stride_x, stride_weight,
                          stride_out, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr):
    """One (BLOCK_M, BLOCK_N) tile of x @ weight^T (+ bias), accumulated in fp32 and rounded once."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    inner = tl.arange(0, BLOCK_K)
    accumulator = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for start in range(0, depth, BLOCK_K):
        ks = start + inner
        x = tl.load(x_ptr + rows[:, None] * stride_x + ks[None, :],
                    mask=(rows[:, None] < num_rows) & (ks[None, :] < depth), other=0.0)  # (BM, BK)
        weight = tl.load(weight_ptr + cols[None, :] * stride_weight + ks[:, None],
                         mask=(cols[None, :] < num_cols) & (ks[:, None] < depth), other=0.0)  # (BK, BN)
        accumulator = tl.dot(x, weight, accumulator)
    if HAS_BIAS:
        accumulator += tl.load(bias_ptr + cols, mask=cols < num_cols, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], accumulator.to(out_ptr.dtype.element_ty),
             mask=(rows[:, None] < num_rows) & (cols[None, :] < num_cols))


def triton_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """x (M, K) @ weight (N, K)^T + bias with the Triton kernel, whatever M (tests call it directly)."""
    num_rows, depth = x.shape
    num_cols = weight.shape[0]
    out = torch.empty((num_rows, num_cols), dtype=x.dtype, device=x.device)
    block_n = 128 if num_cols >= WIDE_OUTPUT else 32
    grid = (triton.cdiv(num_rows, BLOCK_M), triton.cdiv(num_cols, block_n))
    _decode_linear_kernel[grid](
        x, weight, bias if bias is not None else x, out, num_rows, num_cols, depth, x.stride(0), weight.stride(0),
        out.stride(0), HAS_BIAS=bias is not None, BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=BLOCK_K,
        num_warps=4, num_stages=3)
    return out


@torch.library.custom_op("asyncrl::decode_linear", mutates_args=())
def decode_linear_op(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    rows = x.reshape(-1, x.shape[-1])
    # Half precision only: fp32 inputs would go through tl.dot's TF32, coarser than F.linear's fp32.
    fits = (x.is_cuda and rows.shape[0] <= MAX_ROWS and rows.stride(-1) == 1 and weight.stride(-1) == 1
            and rows.dtype == weight.dtype and rows.dtype in (torch.bfloat16, torch.float16))
    if not fits:
        return F.linear(x, weight, bias)
    return triton_linear(rows, weight, bias).view(*x.shape[:-1], weight.shape[0])


@decode_linear_op.register_fake
def _decode_linear_shape(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def decode_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """`F.linear`'s signature and result (up to fp32 summation order), the Triton kernel at <= MAX_ROWS rows."""
    return decode_linear_op(x, weight, bias)
