"""`rollout.backend=vllm`: the replica set, with each replica a vLLM engine, and an optional check that every
replica loaded exactly the trainer's weights.

    rollout.backend=vllm rollout.vllm.verify_weights=true     # any mode; replicas on the rollout devices
"""

from __future__ import annotations

import torch

from asyncrl.remote import wait_for_all
from asyncrl.rollout.backend import RolloutError
from asyncrl.rollout.external_weights import weights_checksum
from asyncrl.rollout.registry import ROLLOUT_BACKENDS, RolloutContext
from asyncrl.rollout.replica_set import ReplicaSet
from asyncrl.rollout.vllm.engine_args import check_vllm
from asyncrl.rollout.vllm.replica import VllmReplicaActor


@ROLLOUT_BACKENDS.register("vllm", placement="separate", replica=VllmReplicaActor, check=check_vllm,
                           summary="one Ray actor per rollout device hosting a vLLM engine (rollout.vllm), weights "
                                   "broadcast from trainer rank 0 and loaded in place by vLLM's own loader; "
                                   "restarts and re-queueing as ray_replicas")
class VllmReplicaSet(ReplicaSet):
    applies_deltas = False   # vLLM loads whole tensors through its own loader
    def __init__(self, context: RolloutContext):
        super().__init__(context)
        self.verify = context.config.rollout.vllm.verify_weights
        self.transfer_dtype = context.engine_dtype

    def sync_weights(self, version: int) -> None:
        super().sync_weights(version)
        if self.verify:
            self.verify_weights(version)

    def verify_weights(self, version: int) -> None:
        """Every replica's checksum of the tensors it loaded equals the trainer's policy cast the same way."""
        policy = ((name, torch.tensor(values)) for name, values in self.trainers.policy_state().items())
        expected = weights_checksum(policy, self.transfer_dtype)
        checksums = wait_for_all([replica.weights_checksum.remote() for replica in self.replicas], self.names,
                                 "weights_checksum", self.timeout_s)
        wrong = [name for name, checksum in zip(self.names, checksums) if checksum != expected]
        if wrong:
            raise RolloutError(f"{', '.join(wrong)}: the weights loaded at version {version} differ from the "
                               f"trainer's (rollout.vllm.verify_weights)")
