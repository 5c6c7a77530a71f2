"""One AdamW step over flat float32 buffers as one Triton kernel (`FlatAdamW`'s CUDA step).

    adamw_step_(params, grads, exp_avg, exp_avg_sq, step, lr, betas, eps, weight_decay, found_inf, grad_scale)

The math of torch's fused AdamW kernel, element by element: the gradient divided by `grad_scale` (a 0-dim
float32 tensor: 1 / the clip coefficient), nothing written when `found_inf` (a 0-dim float32 flag) is 1, decoupled
weight decay, the moments, the bias corrections from `step` (a 0-dim float32 tensor holding the step being taken).
torch's fused kernel walks a 0.5B model's 290 tensors in 25 multi-tensor launches at ~3.0 TB/s (4.6 ms of a 0.25 s
update on an H200); one launch over flat memory, 28 bytes per parameter, has ~3.5 ms at 4 TB/s as its goal.

Imported only on CUDA (CPU installs may lack triton); the kernel also runs under Triton's interpreter
(`TRITON_INTERPRET=1`, `tests/train/fast/test_flat_adamw.py`).
"""

from __future__ import annotations

import math
from typing import Optional

import triton
import triton.language as tl
from torch import Tensor

BLOCK = 2048
NUM_WARPS = 8


@triton.jit
def _adamw_kernel(params_ptr, grads_ptr, exp_avg_ptr, exp_avg_sq_ptr, step_ptr, found_inf_ptr, grad_scale_ptr,
                  numel, lr, beta1, beta2, log2_beta1, log2_beta2, eps, weight_decay,
                  HAS_FOUND_INF: tl.constexpr, HAS_GRAD_SCALE: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    if HAS_FOUND_INF:  # a skipped step touches nothing: every load and store masked off
        numel = tl.where(tl.load(found_inf_ptr) == 0.0, numel, 0)
    inside = offsets < numel
    param = tl.load(params_ptr + offsets, mask=inside, other=0.0)
    grad = tl.load(grads_ptr + offsets, mask=inside, other=0.0)
    exp_avg = tl.load(exp_avg_ptr + offsets, mask=inside, other=0.0)
    exp_avg_sq = tl.load(exp_avg_sq_ptr + offsets, mask=inside, other=0.0)
    if HAS_GRAD_SCALE:
        grad = grad / tl.load(grad_scale_ptr)
    step = tl.load(step_ptr)
    # beta ** step from log2(beta) taken in double on the host: log2 of fp32 0.999 would be off by 1e-5
    # relative, and the step multiplies the error.
    bias_correction1 = 1.0 - tl.exp2(step * log2_beta1)
    bias_correction2_sqrt = tl.sqrt(1.0 - tl.exp2(step * log2_beta2))
    param = param * (1.0 - lr * weight_decay)
    exp_avg = beta1 * exp_avg + (1.0 - beta1) * grad
    exp_avg_sq = beta2 * exp_avg_sq + (1.0 - beta2) * grad * grad
    denom = tl.sqrt(exp_avg_sq) / bias_correction2_sqrt + eps
    param = param - (lr / bias_correction1) * exp_avg / denom
    tl.store(params_ptr + offsets, param, mask=inside)
    tl.store(exp_avg_ptr + offsets, exp_avg, mask=inside)
    tl.store(exp_avg_sq_ptr + offsets, exp_avg_sq, mask=inside)


def adamw_step_(params: Tensor, grads: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, step: Tensor, lr: float,
                betas: tuple[float, float], eps: float, weight_decay: float, found_inf: Optional[Tensor],
                grad_scale: Optional[Tensor]) -> None:
    """Updates `params`, `exp_avg` and `exp_avg_sq` (flat float32, one length) in place."""
    numel = params.numel()
    for name, tensor in (("grads", grads), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
        if tensor.numel() != numel or not tensor.is_contiguous():
            raise ValueError(f"adamw_step_: {name} must be contiguous with {numel} elements, got "
                             f"{tuple(tensor.shape)}")
    if numel:
        _adamw_kernel[(triton.cdiv(numel, BLOCK),)](
            params, grads, exp_avg, exp_avg_sq, step, step if found_inf is None else found_inf,
            step if grad_scale is None else grad_scale, numel, lr, betas[0], betas[1], math.log2(betas[0]),
            math.log2(betas[1]), eps, weight_decay,
            HAS_FOUND_INF=found_inf is not None, HAS_GRAD_SCALE=grad_scale is not None, BLOCK=BLOCK,
            num_warps=NUM_WARPS)
