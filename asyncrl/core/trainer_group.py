"""The driver's handle on the trainer ranks: data-parallel dispatch by plain method calls.

    group = TrainerGroup(actors, timeout_s=600)
    log_probs, entropy = group.compute_log_prob(batch)     # split over ranks, results back in batch order
    metrics = group.update_actor(batch, spec)               # mini-batch layout kept across ranks

Every wait goes through `wait_for_all`, so a dead or stuck rank raises an error naming it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from asyncrl.remote import wait_for_all, worker_name
from asyncrl.train import CriticUpdateSpec, PolicyUpdateSpec, TrainBatch, gather_rows, shard_batch


class TrainerGroup:
    def __init__(self, actors: list[Any], timeout_s: float):
        self.actors = actors
        self.timeout_s = timeout_s
        self.names = [worker_name("trainer", rank) for rank in range(len(actors))]

    @property
    def world_size(self) -> int:
        return len(self.actors)

    def wait(self, refs: list, call: str) -> list:
        return wait_for_all(refs, self.names, call, self.timeout_s)

    def per_row(self, batch: TrainBatch, call: str, method_of) -> tuple[list, list[list[int]]]:
        """Shard rows over ranks, call `method_of(actor)(arrays)` on each; (results, layout)."""
        shards, layout = shard_batch(batch, self.world_size)
        refs = [method_of(actor).remote(shard.to_numpy()) for actor, shard in zip(self.actors, shards)]
        return self.wait(refs, call), layout

    def compute_log_prob(self, batch: TrainBatch, use_snapshot: bool = False) -> tuple[Tensor, Tensor]:
        """Log-probs and entropies under the live policy, or under the snapshot taken by `snapshot_policy`."""
        method = (lambda actor: actor.compute_log_prob_snapshot) if use_snapshot else \
            (lambda actor: actor.compute_log_prob)
        results, layout = self.per_row(batch, "compute_log_prob", method)
        log_probs = gather_rows([tensor_of(log_prob) for log_prob, _ in results], layout, batch.num_rows)
        entropy = gather_rows([tensor_of(entropy) for _, entropy in results], layout, batch.num_rows)
        return log_probs, entropy

    def snapshot_policy(self) -> None:
        self.wait([actor.snapshot_policy.remote() for actor in self.actors], "snapshot_policy")

    def compute_ref_log_prob(self, batch: TrainBatch) -> Tensor:
        results, layout = self.per_row(batch, "compute_ref_log_prob", lambda actor: actor.compute_ref_log_prob)
        return gather_rows([tensor_of(result) for result in results], layout, batch.num_rows)

    def compute_values(self, batch: TrainBatch) -> Tensor:
        results, layout = self.per_row(batch, "compute_values", lambda actor: actor.compute_values)
        return gather_rows([tensor_of(result) for result in results], layout, batch.num_rows)

    def update_actor(self, batch: TrainBatch, spec: PolicyUpdateSpec) -> dict[str, float]:
        shards, _ = shard_batch(batch, self.world_size, spec.num_mini_batches)
        refs = [actor.update_actor.remote(shard.to_numpy(), spec) for actor, shard in zip(self.actors, shards)]
        return self.wait(refs, "update_actor")[0]  # metrics are reduced over ranks already

    def update_critic(self, batch: TrainBatch, spec: CriticUpdateSpec) -> dict[str, float]:
        shards, _ = shard_batch(batch, self.world_size, spec.num_mini_batches)
        refs = [actor.update_critic.remote(shard.to_numpy(), spec) for actor, shard in zip(self.actors, shards)]
        return self.wait(refs, "update_critic")[0]

    def save_checkpoint(self, folder: str) -> None:
        self.wait([actor.save_checkpoint.remote(folder) for actor in self.actors], "save_checkpoint")

    def load_checkpoint(self, folder: str) -> None:
        self.wait([actor.load_checkpoint.remote(folder) for actor in self.actors], "load_checkpoint")

    def export_policy(self, folder: str) -> None:
        self.wait([actor.export_policy.remote(folder) for actor in self.actors], "export_policy")

    def policy_state(self) -> dict[str, np.ndarray]:
        return self.wait([actor.policy_state.remote() for actor in self.actors], "policy_state")[0]


def tensor_of(array: np.ndarray) -> Tensor:
    """A tensor of a rank's result. Arrays Ray hands back from its object store are read-only views, and a
    tensor must own writable memory (torch warns otherwise): those are copied, the others shared."""
    return torch.from_numpy(array if array.flags.writeable else array.copy())
