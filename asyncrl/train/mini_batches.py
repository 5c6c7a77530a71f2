"""The order of optimizer steps over a rank's shard: epochs of mini-batches.

The driver lays out the batch so that, in the first epoch, chunk k of every rank's shard is that rank's
part of global mini-batch k; the union over ranks is then exactly the mini-batch a single process would
take. Later epochs reshuffle within each shard (seeded by the spec's seed and the epoch).
"""

from __future__ import annotations

import torch
from torch import Tensor


def mini_batch_plan(num_rows: int, num_mini_batches: int, num_epochs: int, shuffle: bool,
                    seed: int) -> list[Tensor]:
    """Row-index tensors, one per optimizer step, in execution order."""
    plan = []
    for epoch in range(num_epochs):
        if epoch == 0 or not shuffle:
            order = torch.arange(num_rows)
        else:
            order = torch.randperm(num_rows, generator=torch.Generator().manual_seed(seed + epoch))
        plan.extend(chunk for chunk in torch.tensor_split(order, num_mini_batches) if len(chunk))
    return plan
