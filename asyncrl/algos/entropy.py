"""Entropy of the categorical distributions given by logits.

H = logsumexp(z) - sum_v softmax(z)_v z_v, computed on z - max(z), which never exponentiates a large logit and
never subtracts two large numbers (stable for any scale).
A vocabulary of 150k tokens makes the (N, V) float32 intermediates large, so the rows can be processed in
chunks; with autograd on, each chunk is recomputed in the backward pass (activation checkpointing), so the
peak memory is that of one chunk in both passes.
"""

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint


def _entropy_rows(logits: Tensor) -> Tensor:
    """(N, V) -> (N,) in at least float32."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    # Entropy is shift-invariant; shifting by the (detached) row max keeps both terms small, so their difference
    # does not cancel catastrophically when logits are large (1e4 + log 2 is not representable in float32).
    logits = logits - logits.detach().amax(dim=-1, keepdim=True)
    # A logit of -inf (a token excluded from the vocabulary) has probability 0 and adds nothing; replacing it
    # by 0 before the product avoids 0 * -inf = nan in the forward and in the backward pass.
    finite_logits = torch.where(logits == -torch.inf, 0.0, logits)
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * finite_logits).sum(dim=-1)


def entropy_from_logits(logits: Tensor, chunk_size: int | None = None) -> Tensor:
    """Entropy of softmax(logits) over the last dimension: (..., V) -> (...), float32 (float64 for float64 input).

    ``chunk_size`` (rows of the flattened leading dimensions) bounds the memory of the intermediates.
    """
    if chunk_size is not None and chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    leading_shape = logits.shape[:-1]
    rows = logits.reshape(-1, logits.shape[-1])  # (N, V)
    if chunk_size is None or rows.shape[0] <= chunk_size:
        return _entropy_rows(rows).reshape(leading_shape)
    use_checkpoint = torch.is_grad_enabled() and rows.requires_grad
    chunks = []
    for chunk in rows.split(chunk_size, dim=0):
        if use_checkpoint:
            chunks.append(checkpoint(_entropy_rows, chunk, use_reentrant=False))
        else:
            chunks.append(_entropy_rows(chunk))
    return torch.cat(chunks).reshape(leading_shape)
