"""Lay a batch out over data-parallel ranks, and put per-rank results back in batch order.

For updates, global mini-batch k is split evenly over the ranks, and rank r's shard is the concatenation
of its parts of every mini-batch, so chunk k of each shard belongs to mini-batch k and the union over
ranks is exactly what a single process would train on. Mini-batches whose row count does not divide by
the number of ranks get padding rows (response mask 0: they add nothing to any loss), because every rank
must run the same number of forward passes for FSDP's collectives to line up.
"""

from __future__ import annotations

import torch
from torch import Tensor

from asyncrl.train.batch import TrainBatch


def shard_layout(num_rows: int, num_ranks: int, num_mini_batches: int) -> list[list[int]]:
    """Row indices per rank; -1 marks a padding row."""
    shards: list[list[int]] = [[] for _ in range(num_ranks)]
    for chunk in torch.tensor_split(torch.arange(num_rows), num_mini_batches):
        rows = chunk.tolist()
        rows += [-1] * (-len(rows) % num_ranks)
        per_rank = len(rows) // num_ranks
        for rank in range(num_ranks):
            shards[rank].extend(rows[rank * per_rank:(rank + 1) * per_rank])
    return shards


def shard_batch(batch: TrainBatch, num_ranks: int, num_mini_batches: int = 1) -> tuple[list[TrainBatch], list[list[int]]]:
    """Per-rank shards and the layout (row index per shard row, -1 for padding)."""
    layout = shard_layout(batch.num_rows, num_ranks, num_mini_batches)
    shards = []
    for rows in layout:
        shard = batch.select([max(row, 0) for row in rows])
        is_padding = torch.tensor([row < 0 for row in rows])
        if bool(is_padding.any()):
            shard = shard.replace(response_mask=torch.where(is_padding[:, None], 0.0, shard.response_mask))
        shards.append(shard)
    return shards, layout


def gather_rows(parts: list[Tensor], layout: list[list[int]], num_rows: int) -> Tensor:
    """Inverse of `shard_batch` for per-row results (num_rows, R): padding rows are dropped."""
    width = max(part.shape[1] for part in parts)
    output = torch.zeros(num_rows, width, dtype=parts[0].dtype)
    for part, rows in zip(parts, layout):
        for local, row in enumerate(rows):
            if row >= 0:
                output[row, :part.shape[1]] = part[local]
    return output
