"""The LM head fused with temperature, log-softmax gather and entropy, chunk by chunk over tokens.

    log_probs, entropy = token_log_probs_and_entropy(hidden, model.lm_head.weight, target_ids, temperature,
                                                     with_entropy=True)   # (N,) each, float32

A vocabulary of 150k tokens makes the (N, V) float32 logits, their log-softmax and the entropy intermediates
the largest tensors of a training step, and autograd would keep them all for backward. Here only one chunk of
`chunk_size` tokens has softmax intermediates at a time, and backward works from the forward's logsumexp. It
recomputes each chunk's logits (one more LM-head matmul), except on the fused path when the step's logits fit in
`STORED_LOGITS_BYTES`: those are kept from forward instead. Matmuls run in the input dtype (bf16 on GPU, as
`CausalLM.compute_logits`), the softmax math in float32 (float64 for float64 input): torch's here
(`chunk_statistics`, `chunk_grad_logits`), or on the fused path `FusedChunkKernels` of the same math (on CUDA two
Triton kernels of one pass over the chunk's logits each, `fast/triton_lm_head.py`, chosen by `fast/selection.py`).

Math, per token, with z = W h / T, p = softmax(z), log p = z - lse(z), and the incoming gradients g_lp, g_H:
    log p_y = z_y - lse(z)                       d log p_y / dz = onehot(y) - p
    H = lse(z) - sum p z = -sum p log p          dH / dz = -p (z - E_p[z]) = -p (log p + H)
    dL/dz = g_lp onehot(y) - p (g_lp + g_H (log p + H))
    dL/dh = W^T dL/dz / T                        dL/dW = dL/dz h^T / T   (summed over tokens, in float32)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from asyncrl.models.linear_into import accumulate_matmul

# Bytes of one chunk's softmax buffer: float32 logits in the torch path, where backward holds about three such
# buffers at once (logits, probabilities, gradient); the bf16 logits in the fused path, whose gradient is
# written over them. Qwen2's vocabulary of 151,936 gives 883 tokens (torch) or 1,766 (fused, bf16); either
# path also holds the float32 weight-gradient accumulator.
LOGITS_CHUNK_BYTES = 512 * 2**20
# The fused path keeps a step's logits from forward to backward when they fit in this many bytes (Qwen2's
# vocabulary: 7,067 bf16 tokens), instead of recomputing each chunk's in backward: that LM-head matmul takes ~0.44 ms
# per 1,195-token chunk on an H200, 10 ms of a 0.29 s 0.5B update. Its gradient is then written over them.
STORED_LOGITS_BYTES = 2 * 2**30


@dataclass(frozen=True)
class FusedChunkKernels:
    """`chunk_statistics` and `chunk_grad_logits` as kernels of the same arguments that read a chunk's logits in
    their own dtype, once each; `gradient` writes dL/dlogits over the logits and returns them."""

    statistics: Callable[[Tensor, Tensor, float, bool], tuple[Tensor, Optional[Tensor], Tensor]]
    gradient: Callable[[Tensor, Tensor, Tensor, Tensor, Optional[Tensor], Optional[Tensor], float], Tensor]


def chunk_size_for_budget(vocab_size: int, budget_bytes: int = LOGITS_CHUNK_BYTES, item_size: int = 4) -> int:
    """Tokens per chunk so that a chunk's (chunk, V) logits of `item_size` bytes fit in `budget_bytes` (at
    least 1)."""
    return max(1, budget_bytes // (vocab_size * item_size))


def even_chunks(num_tokens: int, chunk_size: int) -> list[tuple[int, int]]:
    """(start, end) of the fewest chunks of at most `chunk_size` tokens, of equal length up to one token: a
    short last chunk would cost a whole pass over the (V, H) weight gradient for a few tokens."""
    count = max(1, -(-num_tokens // chunk_size))
    bounds = [num_tokens * index // count for index in range(count + 1)]
    return [(start, end) for start, end in zip(bounds, bounds[1:]) if end > start]


def token_log_probs_and_entropy(hidden: Tensor, weight: Tensor, target_ids: Tensor, temperature: float,
                                with_entropy: bool, chunk_size: Optional[int] = None,
                                fused_kernels: Optional[FusedChunkKernels] = None,
                                weight_grad_into: Optional[Tensor] = None) -> tuple[Tensor, Optional[Tensor]]:
    """log softmax(W h / T)[y] (N,) and, if asked, the entropy of softmax(W h / T) (N,); both differentiable.

    hidden (N, H) and weight (V, H) share a dtype; target_ids (N,) int64. Outputs are float32 (float64 for
    float64 input). `chunk_size` None picks it from `LOGITS_CHUNK_BYTES`. `fused_kernels` run each chunk's softmax
    math (not in float64), and the logits are kept for backward when a gradient will be taken and they fit in
    `STORED_LOGITS_BYTES`; then `chunk_size` None makes all tokens one chunk.

    `weight_grad_into` (a float32 tensor of the weight's shape, e.g. the fp32 master's gradient) makes backward add
    the weight's gradient into it, summed in fp32, and give the weight none: no (V, H) gradient is allocated,
    rounded to the weight's dtype and summed with a tied embedding's by autograd.
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
    fused = fused_kernels is not None
    if fused and hidden.dtype == torch.float64:
        raise ValueError("the fused LM-head kernels compute in float32; float64 needs fused_kernels=None")
    if weight_grad_into is not None and (weight_grad_into.shape != weight.shape
                                         or weight_grad_into.dtype != _softmax_dtype(weight.dtype)):
        raise ValueError(f"weight_grad_into must be {_softmax_dtype(weight.dtype)} of shape {tuple(weight.shape)}, "
                         f"got {weight_grad_into.dtype} of shape {tuple(weight_grad_into.shape)}")
    if chunk_size is not None and chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    needs_backward = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    store_logits = (fused and needs_backward
                    and hidden.shape[0] * weight.shape[0] * hidden.element_size() <= STORED_LOGITS_BYTES)
    if chunk_size is None and store_logits:
        # The whole (N, V) buffer exists anyway and the fused kernels need no other: one matmul each way instead
        # of one per chunk, so the float32 (V, H) weight gradient is read and written once, not once per chunk.
        chunk_size = max(1, hidden.shape[0])
    elif chunk_size is None:
        chunk_size = chunk_size_for_budget(weight.shape[0], item_size=hidden.element_size() if fused else 4)
    outputs = ChunkedLogProbEntropy.apply(hidden, weight, target_ids, float(temperature), chunk_size, with_entropy,
                                          fused_kernels, store_logits, weight_grad_into)
    return (outputs[0], outputs[1]) if with_entropy else (outputs, None)


class ChunkedLogProbEntropy(torch.autograd.Function):
    """Autograd op behind `token_log_probs_and_entropy`: outputs log_probs (N,), plus entropy (N,) if asked."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, target_ids: Tensor, temperature: float, chunk_size: int,
                with_entropy: bool, fused_kernels: Optional[FusedChunkKernels], store_logits: bool,
                weight_grad_into: Optional[Tensor]):
        num_tokens = hidden.shape[0]
        softmax_dtype = _softmax_dtype(hidden.dtype)
        log_probs = torch.empty(num_tokens, dtype=softmax_dtype, device=hidden.device)
        lse = torch.empty(num_tokens, dtype=softmax_dtype, device=hidden.device)
        entropy = torch.empty(num_tokens, dtype=softmax_dtype, device=hidden.device) if with_entropy else None
        # (N, V) in the input dtype, kept for backward; else each chunk's logits are recomputed there.
        stored = torch.empty(num_tokens, weight.shape[0], dtype=hidden.dtype,
                             device=hidden.device) if store_logits else None
        statistics = chunk_statistics if fused_kernels is None else fused_kernels.statistics
        for start, end in even_chunks(num_tokens, chunk_size):
            logits = torch.mm(hidden[start:end], weight.t(),
                              out=None if stored is None else stored[start:end])  # (c, V) in the input dtype
            chunk_log_probs, chunk_entropy, chunk_lse = statistics(logits, target_ids[start:end], temperature,
                                                                   with_entropy)
            log_probs[start:end] = chunk_log_probs
            lse[start:end] = chunk_lse
            if with_entropy:
                entropy[start:end] = chunk_entropy
        ctx.set_materialize_grads(False)
        ctx.temperature = temperature
        ctx.chunk_size = chunk_size
        ctx.fused_kernels = fused_kernels
        ctx.weight_grad_into = weight_grad_into  # not saved: backward adds into it in place
        ctx.save_for_backward(hidden, weight, target_ids, lse, entropy, stored)
        return (log_probs, entropy) if with_entropy else log_probs

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_log_probs: Optional[Tensor], grad_entropy: Optional[Tensor] = None):
        hidden, weight, target_ids, lse, entropy, stored = ctx.saved_tensors
        needs_hidden, needs_weight = ctx.needs_input_grad[:2]
        num_tokens = hidden.shape[0]
        if grad_log_probs is None:  # only the entropy reaches the loss
            grad_log_probs = torch.zeros(num_tokens, dtype=_softmax_dtype(hidden.dtype), device=hidden.device)
        grad_hidden = torch.empty(hidden.shape, dtype=hidden.dtype, device=hidden.device) if needs_hidden else None
        into = ctx.weight_grad_into
        if into is not None:
            grad_weight = into
        elif needs_weight:
            # Always a tensor (zeros without tokens): under FSDP every rank must reduce the same set of gradients.
            grad_weight = torch.zeros(weight.shape, dtype=_softmax_dtype(weight.dtype), device=weight.device)
        else:
            grad_weight = None
        gradient = chunk_grad_logits if ctx.fused_kernels is None else ctx.fused_kernels.gradient
        for start, end in even_chunks(num_tokens, ctx.chunk_size):
            chunk_hidden = hidden[start:end]
            # (c, V): the forward's, or recomputed (the same matmul, so the same values)
            logits = torch.mm(chunk_hidden, weight.t()) if stored is None else stored[start:end]
            grad_logits = gradient(
                logits, target_ids[start:end], lse[start:end], grad_log_probs[start:end],
                None if grad_entropy is None else grad_entropy[start:end],
                None if entropy is None else entropy[start:end], ctx.temperature)  # (c, V) input dtype
            del logits
            if needs_hidden:
                torch.mm(grad_logits, weight, out=grad_hidden[start:end])
            if grad_weight is not None:
                accumulate_matmul(grad_weight, grad_logits.t(), chunk_hidden)
        if into is not None:
            grad_weight = None  # added where the caller asked
        elif needs_weight:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None, None, None, None


def _softmax_dtype(dtype: torch.dtype) -> torch.dtype:
    """At least float32: float32 for bf16/fp16/fp32 inputs, float64 for float64."""
    return torch.promote_types(dtype, torch.float32)


def _scaled_logits(logits: Tensor, temperature: float) -> Tensor:
    """logits / T (c, V) in at least float32: a fresh buffer, which callers may modify in place."""
    return logits.to(_softmax_dtype(logits.dtype)) / temperature


def chunk_statistics(logits: Tensor, target_ids: Tensor, temperature: float,
                     with_entropy: bool) -> tuple[Tensor, Optional[Tensor], Tensor]:
    """logits (c, V) of W h -> log softmax(logits / T)[y] (c,), the entropy (c,) if asked and the logsumexp of
    logits / T (c,), in float32. In-place steps keep it at two (c, V) float32 buffers."""
    log_probs = _scaled_logits(logits, temperature)
    lse = torch.logsumexp(log_probs, dim=-1)
    log_probs.sub_(lse[:, None])  # (c, V)
    target_log_probs = log_probs.gather(1, target_ids[:, None]).squeeze(1)
    if not with_entropy:
        return target_log_probs, None, lse
    # -sum p log p rather than lse - sum p z: no cancellation between two large terms.
    return target_log_probs, log_probs.exp().mul_(log_probs).sum(dim=-1).neg_(), lse


def chunk_grad_logits(logits: Tensor, target_ids: Tensor, lse: Tensor, grad_log_probs: Tensor,
                      grad_entropy: Optional[Tensor], entropy: Optional[Tensor], temperature: float) -> Tensor:
    """dL/d(W h) (c, V) of one chunk in the logits' dtype, 1/T included, from the forward's `lse`:
    p (a + b log p) + onehot(y) g_lp / T, where a = -(g_lp + g_H H) / T and b = -g_H / T."""
    log_probs = _scaled_logits(logits, temperature).sub_(lse[:, None])  # (c, V)
    scaled_grad_log_probs = (grad_log_probs / temperature)[:, None]  # (c, 1)
    if grad_entropy is None:
        grad = log_probs.exp_().mul_(-scaled_grad_log_probs)
    else:
        offset = -(grad_log_probs + grad_entropy * entropy)[:, None] / temperature  # (c, 1)
        probs = log_probs.exp()
        grad = log_probs.mul_(-(grad_entropy / temperature)[:, None]).add_(offset).mul_(probs)
    return grad.scatter_add_(1, target_ids[:, None], scaled_grad_log_probs).to(logits.dtype)
