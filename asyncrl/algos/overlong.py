"""DAPO's soft overlong punishment (Yu et al., 2025): a reward penalty that rises linearly over the last tokens of the
response budget, so the policy learns to finish before the hard cut instead of being cut mid-answer.

    penalties = overlong_penalty(response_lengths, max_response_length=64, buffer_length=16, penalty_factor=1.0)
    rewards = scores + penalties

With L the response length (its EOS included), M the budget and b the buffer: no penalty up to M - b tokens, then
-(L - (M - b)) / b x factor, which reaches -factor at L = M. The reference system's DAPO reward manager computes
the same, min(-(L - (M - b)) / b x factor, 0), and adds it to the score.
"""

import torch
from torch import Tensor


def overlong_penalty(
    response_lengths: Tensor,  # (B,) integer: valid response tokens of each row
    *,
    max_response_length: int,
    buffer_length: int,
    penalty_factor: float,
) -> Tensor:
    """The penalty of each row, (B,) float32, <= 0 (0 up to ``max_response_length - buffer_length`` tokens)."""
    if not 0 < buffer_length <= max_response_length:
        raise ValueError(f"buffer_length must be within 1 .. max_response_length ({max_response_length}), "
                         f"got {buffer_length}")
    if penalty_factor < 0:
        raise ValueError(f"penalty_factor must be >= 0, got {penalty_factor}")
    if response_lengths.dim() != 1:
        raise ValueError(f"response_lengths must be (B,), got {tuple(response_lengths.shape)}")
    exceed = response_lengths.to(torch.float32) - (max_response_length - buffer_length)
    # A literal 0 within the budget: negating a clamped 0 would give -0.0 there.
    return torch.where(exceed > 0, -exceed / buffer_length * penalty_factor, 0.0)
