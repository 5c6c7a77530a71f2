"""Masked reductions over padded (B, T) batches, and the conversion of metric tensors to floats.

B = number of responses (rows), T = padded response length. A mask is float or bool (B, T) with 1 on
valid response tokens. Padded positions may hold anything, including inf and nan (a log-prob computed on a
pad token), so every helper selects with ``torch.where`` before it reduces: multiplying by a 0 mask would
turn ``nan * 0`` into nan and leak it into the result and into the gradients.
"""

import torch
from torch import Tensor


def as_bool_mask(mask: Tensor) -> Tensor:
    """Returns the mask as bool (same shape); any non-zero entry counts as valid."""
    return mask if mask.dtype == torch.bool else mask != 0


def fill_invalid(values: Tensor, mask: Tensor, fill: float = 0.0) -> Tensor:
    """Returns ``values`` with every position where ``mask`` is 0 replaced by ``fill`` (no nan leaks)."""
    return torch.where(as_bool_mask(mask), values, fill)


def count_valid(mask: Tensor, dim: int | None = None) -> Tensor:
    """Number of valid positions, in total (scalar) or along ``dim``; float32 so it can divide."""
    valid = as_bool_mask(mask).to(torch.float32)
    return valid.sum() if dim is None else valid.sum(dim)


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``values`` over valid positions, in total (scalar) or along ``dim``."""
    clean = fill_invalid(values, mask)
    return clean.sum() if dim is None else clean.sum(dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean over valid positions; 0 where there is no valid position (never nan)."""
    total = masked_sum(values, mask, dim)
    return total / count_valid(mask, dim).to(total.dtype).clamp_min(1.0)


def masked_var(values: Tensor, mask: Tensor) -> Tensor:
    """Population variance (divides by the count, not count - 1) over all valid positions; a scalar."""
    mean = masked_mean(values, mask)
    return masked_mean((values - mean) ** 2, mask)


def masked_whiten(values: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """(x - mean) / sqrt(var + eps) over all valid positions (population variance); 0 on padding."""
    clean = fill_invalid(values, mask)
    mean = masked_mean(clean, mask)
    var = masked_var(clean, mask)
    return fill_invalid((clean - mean) * torch.rsqrt(var + eps), mask)


def metrics_to_floats(metrics: dict[str, Tensor | float]) -> dict[str, float]:
    """Converts scalar metric tensors to plain python floats with one device-to-host copy."""
    names = [name for name, value in metrics.items() if isinstance(value, Tensor)]
    result = {name: float(value) for name, value in metrics.items() if not isinstance(value, Tensor)}
    if names:
        # One stacked copy instead of one .item() (and one GPU sync) per metric.
        stacked = torch.stack([metrics[name].detach().to(torch.float64).reshape(()) for name in names])
        result.update(zip(names, stacked.cpu().tolist()))
    return {name: result[name] for name in metrics}
