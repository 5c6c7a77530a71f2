"""Critic loss (clipped value loss of PPO) and the explained-variance diagnostic."""

import torch
from torch import Tensor

from asyncrl.algos.aggregation import aggregate_loss
from asyncrl.algos.masked import as_bool_mask, fill_invalid, masked_mean, masked_var, metrics_to_floats


def value_loss(
    values: Tensor,  # (B, T) current critic predictions, with gradient
    old_values: Tensor,  # (B, T) predictions of the critic that computed the advantages
    returns: Tensor,  # (B, T) regression targets
    response_mask: Tensor,  # (B, T)
    *,
    cliprange_value: float,
    loss_agg_mode: str,
    num_tokens: float | int | Tensor | None = None,
    num_seqs: float | int | Tensor | None = None,
    norm_length: float | int | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """0.5 * agg(max((v - R)^2, (v_clip - R)^2)) with v_clip = old + clamp(v - old, -c, c).

    The max keeps the critic from moving a prediction further than ``cliprange_value`` when that would lower
    the loss (a pessimistic bound, like PPO's clip). Counts as in ``aggregate_loss``.
    Metrics: ``vf_loss``, ``vf_clipfrac`` (fraction of valid tokens where the clipped term is larger).
    """
    valid = as_bool_mask(response_mask)
    values = fill_invalid(values, valid)
    old_values = fill_invalid(old_values.detach(), valid)
    returns = fill_invalid(returns.detach(), valid)
    clipped_values = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
    unclipped_loss = (values - returns).square()
    clipped_loss = (clipped_values - returns).square()
    per_token_loss = torch.maximum(unclipped_loss, clipped_loss)
    loss = 0.5 * aggregate_loss(
        per_token_loss, valid, loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs, norm_length=norm_length
    )
    with torch.no_grad():
        clipfrac = masked_mean((clipped_loss > unclipped_loss).float(), valid)
    return loss, metrics_to_floats({"vf_loss": loss.detach(), "vf_clipfrac": clipfrac})


def explained_variance(returns: Tensor, values: Tensor, mask: Tensor) -> float:
    """1 - Var(R - V) / Var(R) over valid tokens (population variances); 1 is perfect, 0 is no better than the
    mean. Returns 0.0 when the returns have no variance (nothing to explain), so the metric is never nan."""
    with torch.no_grad():
        returns = fill_invalid(returns.detach().double(), mask)
        values = fill_invalid(values.detach().double(), mask)
        returns_var = float(masked_var(returns, mask))
        if returns_var == 0.0:
            return 0.0
        return 1.0 - float(masked_var(returns - values, mask)) / returns_var
