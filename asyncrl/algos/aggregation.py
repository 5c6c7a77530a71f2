"""Loss aggregation: from a per-token loss matrix (B, T) to the scalar that is back-propagated.

Modes (X = loss matrix, M = mask, s_i = sum_t X_it over the valid tokens of sequence i, n_i = its valid count):

    token-mean               sum_i s_i / num_tokens
    seq-mean-token-sum       sum_i s_i / num_seqs
    seq-mean-token-mean      sum_i (s_i / n_i) / num_seqs
    seq-mean-token-sum-norm  sum_i s_i / (num_seqs * norm_length)       (Dr.GRPO constant normaliser)

Gradient accumulation and data parallelism: ``num_tokens`` / ``num_seqs`` are the GLOBAL counts of the whole
mini-batch (all micro-batches of all data-parallel ranks). The results of the micro-batches then SUM to the loss
of the whole mini-batch, with the same gradient, whatever the split. A data-parallel trainer whose gradient
all-reduce averages over ranks must multiply its loss by the number of ranks. When a count is None, the local
count of this call is used (correct for a single micro-batch on a single rank).

Choices:
- A sequence with no valid token is not counted in the local ``num_seqs`` (it contributes nothing to the
  numerator either), so empty responses do not dilute the seq-mean modes. Global counts passed by the trainer
  should follow the same rule: ``count_sequences(mask)``.
- ``seq-mean-token-sum-norm`` divides by the number of sequences AND by ``norm_length`` (default: T, the padded
  length of this call). The reference system changed this between versions (one release did not divide by
  the number of sequences); we follow the Dr.GRPO paper, which averages over sequences. Because T depends on
  padding, a trainer should pass ``norm_length`` explicitly (e.g. the maximum response length) so that the
  loss does not depend on how a batch was padded or split.
- A count of 0 (nothing valid) is treated as 1: the loss is then 0, never nan.
"""

import torch
from torch import Tensor

from asyncrl.algos.masked import as_bool_mask, count_valid, fill_invalid
from asyncrl.registry import Entry, Registry

# Every mode: fn(sequence_sums (B,), mask (B, T), *, num_tokens, num_seqs, norm_length) -> scalar loss.
LOSS_AGG_MODES: Registry[Entry] = Registry("loss aggregation mode", Entry)


def count_sequences(mask: Tensor) -> Tensor:
    """Number of sequences (rows of the (B, T) mask) with at least one valid token; a float32 scalar."""
    return as_bool_mask(mask).any(dim=-1).to(torch.float32).sum()


def _denominator(count: float | int | Tensor | None, local: Tensor, like: Tensor) -> Tensor | float:
    """The global count when given, the local one otherwise, at least 1: a number stays a Python float (a
    device tensor made from it would be a blocking host-to-device copy, which on a GPU waits for every
    queued kernel, once per loss term and micro-batch); a tensor becomes a scalar of ``like``'s dtype."""
    chosen = local if count is None else count
    if isinstance(chosen, Tensor):
        return chosen.to(dtype=like.dtype, device=like.device).clamp_min(1.0)
    return max(float(chosen), 1.0)


@LOSS_AGG_MODES.register("token-mean", summary="sum over the valid tokens / their number")
def token_mean(sequence_sums: Tensor, mask: Tensor, *, num_tokens=None, num_seqs=None, norm_length=None) -> Tensor:
    return sequence_sums.sum() / _denominator(num_tokens, count_valid(mask), sequence_sums)


@LOSS_AGG_MODES.register("seq-mean-token-sum", summary="sum of each sequence's tokens, mean over sequences")
def seq_mean_token_sum(sequence_sums: Tensor, mask: Tensor, *, num_tokens=None, num_seqs=None,
                       norm_length=None) -> Tensor:
    return sequence_sums.sum() / _denominator(num_seqs, count_sequences(mask), sequence_sums)


@LOSS_AGG_MODES.register("seq-mean-token-mean", summary="mean of each sequence's tokens, mean over sequences")
def seq_mean_token_mean(sequence_sums: Tensor, mask: Tensor, *, num_tokens=None, num_seqs=None,
                        norm_length=None) -> Tensor:
    lengths = count_valid(mask, dim=-1).to(sequence_sums.dtype).clamp_min(1.0)  # (B,)
    return (sequence_sums / lengths).sum() / _denominator(num_seqs, count_sequences(mask), sequence_sums)


@LOSS_AGG_MODES.register(
    "seq-mean-token-sum-norm",
    summary="Dr.GRPO's constant normaliser: sum over the valid tokens / (sequences x the maximum response length)")
def seq_mean_token_sum_norm(sequence_sums: Tensor, mask: Tensor, *, num_tokens=None, num_seqs=None,
                            norm_length=None) -> Tensor:
    if norm_length is not None and norm_length <= 0:
        raise ValueError(f"norm_length must be positive, got {norm_length}")
    length = max(mask.shape[-1], 1) if norm_length is None else norm_length
    return sequence_sums.sum() / (_denominator(num_seqs, count_sequences(mask), sequence_sums) * length)


def aggregate_loss(
    loss_matrix: Tensor,  # (B, T) per-token loss; padded positions may hold anything
    mask: Tensor,  # (B, T) float or bool, 1 on valid tokens
    mode: str,
    *,
    num_tokens: float | int | Tensor | None = None,
    num_seqs: float | int | Tensor | None = None,
    norm_length: float | int | None = None,
) -> Tensor:
    """Aggregates ``loss_matrix`` over the valid tokens of ``mask`` with ``mode`` (see the module docstring).

    Returns a scalar tensor that keeps the gradient of ``loss_matrix``.
    """
    aggregate = LOSS_AGG_MODES[mode]
    if loss_matrix.shape != mask.shape or loss_matrix.dim() != 2:
        raise ValueError(
            f"loss_matrix and mask must both be (B, T), got {tuple(loss_matrix.shape)} and {tuple(mask.shape)}"
        )
    sequence_sums = fill_invalid(loss_matrix, mask).sum(dim=-1)  # (B,)
    return aggregate(sequence_sums, mask, num_tokens=num_tokens, num_seqs=num_seqs, norm_length=norm_length)
