"""The LM head fused with temperature, log-softmax gather and entropy, chunk by chunk over tokens.

    log_probs, entropy = token_log_probs_and_entropy(hidden, model.lm_head.weight, target_ids, temperature,
                                                     with_entropy=True)   # (N,) each, float32

A vocabulary of 150k tokens makes the (N, V) float32 logits, their log-softmax and the entropy intermediates
the largest tensors of a training step, and autograd would keep them all for backward. Here only one chunk of
`chunk_size` tokens has logits at a time; backward recomputes each chunk's logits (one more LM-head matmul)
instead of storing them. Matmuls run in the input dtype (bf16 on GPU, as `CausalLM.compute_logits`), the
softmax math in float32 (float64 for float64 input).

Math, per token, with z = W h / T, p = softmax(z), log p = z - lse(z), and the incoming gradients g_lp, g_H:
    log p_y = z_y - lse(z)                       d log p_y / dz = onehot(y) - p
    H = lse(z) - sum p z = -sum p log p          dH / dz = -p (z - E_p[z]) = -p (log p + H)
    dL/dz = g_lp onehot(y) - p (g_lp + g_H (log p + H))
    dL/dh = W^T dL/dz / T                        dL/dW = dL/dz h^T / T   (summed over tokens, in float32)
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

# Bytes of one chunk's float32 logits; backward holds about three such buffers at once (logits, probabilities,
# gradient), plus the float32 weight-gradient accumulator. Qwen2's vocabulary of 151,936 gives 883 tokens.
LOGITS_CHUNK_BYTES = 512 * 2**20


def chunk_size_for_budget(vocab_size: int, budget_bytes: int = LOGITS_CHUNK_BYTES) -> int:
    """Tokens per chunk so that a chunk's (chunk, V) float32 logits fit in `budget_bytes` (at least 1)."""
    return max(1, budget_bytes // (vocab_size * 4))


def token_log_probs_and_entropy(hidden: Tensor, weight: Tensor, target_ids: Tensor, temperature: float,
                                with_entropy: bool, chunk_size: Optional[int] = None,
                                compiled: bool = False) -> tuple[Tensor, Optional[Tensor]]:
    """log softmax(W h / T)[y] (N,) and, if asked, the entropy of softmax(W h / T) (N,); both differentiable.

    hidden (N, H) and weight (V, H) share a dtype; target_ids (N,) int64. Outputs are float32 (float64 for
    float64 input). `chunk_size` None picks it from `LOGITS_CHUNK_BYTES`. `compiled` runs each chunk's softmax
    math through torch.compile (CUDA).
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden must be (N, H) and weight (V, H), got {tuple(hidden.shape)} and {tuple(weight.shape)}")
    if target_ids.shape != hidden.shape[:1]:
        raise ValueError(f"target_ids must have shape ({hidden.shape[0]},), got {tuple(target_ids.shape)}")
    if hidden.dtype != weight.dtype:
        raise ValueError(f"hidden and weight must share a dtype, got {hidden.dtype} and {weight.dtype}")
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if chunk_size is None:
        chunk_size = chunk_size_for_budget(weight.shape[0])
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    outputs = ChunkedLogProbEntropy.apply(hidden, weight, target_ids, float(temperature), chunk_size, with_entropy,
                                          compiled)
    return (outputs[0], outputs[1]) if with_entropy else (outputs, None)


class ChunkedLogProbEntropy(torch.autograd.Function):
    """Autograd op behind `token_log_probs_and_entropy`: outputs log_probs (N,), plus entropy (N,) if asked."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, target_ids: Tensor, temperature: float, chunk_size: int,
                with_entropy: bool, compiled: bool):
        num_tokens = hidden.shape[0]
        softmax_dtype = _softmax_dtype(hidden.dtype)
        log_probs = torch.empty(num_tokens, dtype=softmax_dtype, device=hidden.device)
        entropy = torch.empty(num_tokens, dtype=softmax_dtype, device=hidden.device) if with_entropy else None
        statistics = _compiled_statistics if compiled else chunk_statistics
        for start in range(0, num_tokens, chunk_size):
            end = min(start + chunk_size, num_tokens)
            logits = torch.mm(hidden[start:end], weight.t())  # (c, V) in the input dtype
            chunk_log_probs, chunk_entropy = statistics(logits, target_ids[start:end], temperature, with_entropy)
            log_probs[start:end] = chunk_log_probs
            if with_entropy:
                entropy[start:end] = chunk_entropy
        ctx.set_materialize_grads(False)
        ctx.temperature = temperature
        ctx.chunk_size = chunk_size
        ctx.compiled = compiled
        if with_entropy:
            ctx.save_for_backward(hidden, weight, target_ids, entropy)
            return log_probs, entropy
        ctx.save_for_backward(hidden, weight, target_ids)
        return log_probs

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_log_probs: Optional[Tensor], grad_entropy: Optional[Tensor] = None):
        hidden, weight, target_ids, *saved_entropy = ctx.saved_tensors
        needs_hidden, needs_weight = ctx.needs_input_grad[:2]
        num_tokens = hidden.shape[0]
        if grad_log_probs is None:  # only the entropy reaches the loss
            grad_log_probs = torch.zeros(num_tokens, dtype=_softmax_dtype(hidden.dtype), device=hidden.device)
        grad_hidden = torch.empty(hidden.shape, dtype=hidden.dtype, device=hidden.device) if needs_hidden else None
        # Always a tensor (zeros without tokens): under FSDP every rank must reduce the same set of gradients.
        grad_weight = torch.zeros(weight.shape, dtype=_softmax_dtype(weight.dtype),
                                  device=weight.device) if needs_weight else None
        gradient = _compiled_grad_logits if ctx.compiled else chunk_grad_logits
        for start in range(0, num_tokens, ctx.chunk_size):
            end = min(start + ctx.chunk_size, num_tokens)
            chunk_hidden = hidden[start:end]
            logits = torch.mm(chunk_hidden, weight.t())  # (c, V), recomputed rather than stored
            grad_logits = gradient(
                logits, target_ids[start:end], grad_log_probs[start:end],
                None if grad_entropy is None else grad_entropy[start:end],
                saved_entropy[0][start:end] if saved_entropy else None, ctx.temperature)  # (c, V) input dtype
            del logits
            if needs_hidden:
                torch.mm(grad_logits, weight, out=grad_hidden[start:end])
            if needs_weight:
                accumulate_matmul(grad_weight, grad_logits.t(), chunk_hidden)
        if needs_weight:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None, None


def _softmax_dtype(dtype: torch.dtype) -> torch.dtype:
    """At least float32: float32 for bf16/fp16/fp32 inputs, float64 for float64."""
    return torch.promote_types(dtype, torch.float32)


def _scaled_log_softmax(logits: Tensor, temperature: float) -> Tensor:
    """log softmax(logits / T) (c, V) in at least float32: a fresh buffer, which callers may modify in place."""
    log_probs = logits.to(_softmax_dtype(logits.dtype)) / temperature  # scaled logits, then log-probs in place
    return log_probs.sub_(torch.logsumexp(log_probs, dim=-1, keepdim=True))


def chunk_statistics(logits: Tensor, target_ids: Tensor, temperature: float,
                     with_entropy: bool) -> tuple[Tensor, Optional[Tensor]]:
    """logits (c, V) of W h -> log softmax(logits / T)[y] (c,) and, if asked, the entropy (c,), in float32.

    In-place steps keep eager runs (CPU) at two (c, V) float32 buffers; compiled, they fuse anyway."""
    log_probs = _scaled_log_softmax(logits, temperature)  # (c, V)
    target_log_probs = log_probs.gather(1, target_ids[:, None]).squeeze(1)
    if not with_entropy:
        return target_log_probs, None
    # -sum p log p rather than lse - sum p z: no cancellation between two large terms.
    return target_log_probs, log_probs.exp().mul_(log_probs).sum(dim=-1).neg_()


def chunk_grad_logits(logits: Tensor, target_ids: Tensor, grad_log_probs: Tensor, grad_entropy: Optional[Tensor],
                      entropy: Optional[Tensor], temperature: float) -> Tensor:
    """dL/d(W h) (c, V) of one chunk in the logits' dtype, 1/T included: p (a + b log p) + onehot(y) g_lp / T,
    where a = -(g_lp + g_H H) / T and b = -g_H / T."""
    log_probs = _scaled_log_softmax(logits, temperature)  # (c, V)
    scaled_grad_log_probs = (grad_log_probs / temperature)[:, None]  # (c, 1)
    if grad_entropy is None:
        grad = log_probs.exp_().mul_(-scaled_grad_log_probs)
    else:
        offset = -(grad_log_probs + grad_entropy * entropy)[:, None] / temperature  # (c, 1)
        probs = log_probs.exp()
        grad = log_probs.mul_(-(grad_entropy / temperature)[:, None]).add_(offset).mul_(probs)
    return grad.scatter_add_(1, target_ids[:, None], scaled_grad_log_probs).to(logits.dtype)


# On CUDA each chunk's softmax passes (widening, logsumexp, gather, entropy; in backward the gradient) fuse
# into a few kernels that read the bf16 logits once or twice, instead of ~10 full (c, V) float32 passes.
# Chunks differ in length (the last one), hence dynamic shapes.
_compiled_statistics = torch.compile(chunk_statistics, dynamic=True, fullgraph=True)
_compiled_grad_logits = torch.compile(chunk_grad_logits, dynamic=True, fullgraph=True)


def accumulate_matmul(accumulator: Tensor, left: Tensor, right: Tensor) -> None:
    """accumulator += left @ right, the sum in the accumulator's dtype. On CUDA with bf16/fp16 inputs and a
    float32 accumulator, one GEMM whose float32 output adds into the accumulator (cuBLAS's beta = 1): no
    rounded (V, H) product and no second pass over it (Qwen2's 151,936 x 896 per LM-head chunk). Elsewhere
    the product is rounded to the inputs' dtype, then added."""
    if left.dtype == accumulator.dtype:
        accumulator.addmm_(left, right)
    elif accumulator.is_cuda:
        torch.addmm(accumulator, left, right, out_dtype=accumulator.dtype, out=accumulator)
    else:
        accumulator.add_(torch.mm(left, right))
