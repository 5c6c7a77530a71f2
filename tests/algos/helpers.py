"""Shared test helpers: padding with garbage, and float64 reference loops used by several test files."""

import math

import torch


def append_padding(tensor: torch.Tensor, num_columns: int, fill: float) -> torch.Tensor:
    """Appends ``num_columns`` columns of ``fill`` to a (B, T) tensor (bool tensors get False)."""
    shape = (tensor.shape[0], num_columns)
    if tensor.dtype == torch.bool:
        return torch.cat([tensor, torch.zeros(shape, dtype=torch.bool)], dim=1)
    return torch.cat([tensor, torch.full(shape, fill, dtype=tensor.dtype)], dim=1)


def fill_padding(tensor: torch.Tensor, mask: torch.Tensor, fill: float) -> torch.Tensor:
    """A copy of ``tensor`` with ``fill`` (e.g. nan) on the positions where ``mask`` is 0."""
    return torch.where(mask.bool(), tensor, torch.full_like(tensor, fill))


def valid_positions(mask: torch.Tensor) -> list[list[int]]:
    """For each row, the list of column indices where the mask is non-zero."""
    return [[t for t in range(mask.shape[1]) if mask[i, t] != 0] for i in range(mask.shape[0])]


def reference_whiten(matrix: list[list[float]], mask: torch.Tensor) -> list[list[float]]:
    """Whitening over the valid entries with the population variance and eps 1e-8, written as plain loops."""
    entries = [matrix[i][t] for i, row in enumerate(valid_positions(mask)) for t in row]
    mean = sum(entries) / len(entries)
    var = sum((x - mean) ** 2 for x in entries) / len(entries)
    result = [[0.0] * mask.shape[1] for _ in range(mask.shape[0])]
    for i, row in enumerate(valid_positions(mask)):
        for t in row:
            result[i][t] = (matrix[i][t] - mean) / math.sqrt(var + 1e-8)
    return result


def reference_aggregate(loss: list[list[float]], mask: torch.Tensor, mode: str, norm_length: int) -> float:
    """Loop version of aggregate_loss with local counts (empty sequences not counted)."""
    rows = [row for row in valid_positions(mask)]
    sums = [sum(loss[i][t] for t in row) for i, row in enumerate(rows)]
    num_tokens = sum(len(row) for row in rows)
    num_seqs = sum(1 for row in rows if row)
    if mode == "token-mean":
        return sum(sums) / max(num_tokens, 1)
    if mode == "seq-mean-token-sum":
        return sum(sums) / max(num_seqs, 1)
    if mode == "seq-mean-token-mean":
        return sum(s / len(row) for s, row in zip(sums, rows) if row) / max(num_seqs, 1)
    return sum(sums) / (max(num_seqs, 1) * norm_length)
