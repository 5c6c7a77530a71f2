"""Rollout on separate devices (one-step-off and fully-async modes): replicas behind one handle.

    rollout = ReplicaRollout(replicas, trainers, config)
    rollout.connect_weights(host, port)          # once: the weight-sync group
    results = rollout.generate(requests)         # blocking
    pending = rollout.start_generate(requests)   # non-blocking; pending.results() later
    rollout.sync_weights(version)                # pause -> broadcast -> load -> version -> resume

Every wait names the replica or trainer rank that did not answer.
"""

from __future__ import annotations

from typing import Any

import ray
import torch

from asyncrl.config import AsyncRLConfig
from asyncrl.core.rollout import PendingGeneration, spread
from asyncrl.core.trainer_group import TrainerGroup
from asyncrl.distributed.remote import wait_for_all
from asyncrl.distributed.weight_transport import TransferPlan
from asyncrl.engine import GenerationRequest, GenerationResult
from asyncrl.models import CausalLM, read_config


def transfer_plan(config: AsyncRLConfig, engine_dtype: torch.dtype) -> TransferPlan:
    """The parameter list of the policy, from its config alone (a meta-device model: no weights)."""
    model_config, _ = read_config(config.model.path)
    with torch.device("meta"):
        model = CausalLM(model_config)
    named_shapes = [(name, tuple(parameter.shape)) for name, parameter in model.named_parameters()]
    return TransferPlan.build(named_shapes, engine_dtype, config.weight_sync.bucket_mb << 20)


class ReplicaRollout:
    def __init__(self, replicas: list[Any], trainers: TrainerGroup, config: AsyncRLConfig):
        self.replicas = replicas
        self.trainers = trainers
        self.config = config
        self.names = [f"rollout/replica{index}" for index in range(len(replicas))]
        self.timeout_s = config.ray.rpc_timeout_s
        self.sync_timeout_s = config.weight_sync.timeout_s
        self.version = 0

    def wait(self, refs: list, names: list[str], call: str, timeout_s: float | None = None) -> list:
        return wait_for_all(refs, names, call, timeout_s or self.timeout_s)

    def connect_weights(self, host: str, port: int, engine_dtype: torch.dtype) -> TransferPlan:
        """Form the weight-sync group: trainer rank 0 is rank 0, replica i is rank i + 1."""
        plan = transfer_plan(self.config, engine_dtype)
        world_size = len(self.replicas) + 1
        refs = [self.trainers.actors[0].join_weight_group.remote(host, port, world_size, plan, self.sync_timeout_s)]
        refs += [replica.join_weight_group.remote(host, port, index + 1, world_size, plan, self.sync_timeout_s)
                 for index, replica in enumerate(self.replicas)]
        self.wait(refs, [self.trainers.names[0]] + self.names, "join_weight_group", self.sync_timeout_s)
        return plan

    def start_generate(self, requests: list[GenerationRequest]) -> PendingGeneration:
        parts = spread(requests, len(self.replicas))
        refs, names = [], []
        for replica, name, part in zip(self.replicas, self.names, parts):
            if part:
                refs.append(replica.generate_batch.remote(part))
                names.append(name)
        return PendingGeneration(list(requests), refs, names, self.timeout_s)

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        return self.start_generate(requests).results()

    def pause(self) -> None:
        self.wait([replica.pause.remote() for replica in self.replicas], self.names, "pause")

    def resume(self) -> None:
        self.wait([replica.resume.remote() for replica in self.replicas], self.names, "resume")

    def sync_weights(self, version: int) -> None:
        """Pause, broadcast the trainer's weights into every replica, stamp `version`, resume."""
        self.pause()
        refs = [actor.send_weights.remote() for actor in self.trainers.actors]
        refs += [replica.receive_weights.remote(version) for replica in self.replicas]
        self.wait(refs, self.trainers.names + self.names, "sync_weights", self.sync_timeout_s)
        self.version = version
        self.resume()

    def engine_states(self) -> list[dict[str, Any]]:
        return self.wait([replica.engine_state.remote() for replica in self.replicas], self.names, "engine_state")

    def close(self) -> None:
        for replica in self.replicas:
            ray.kill(replica)
