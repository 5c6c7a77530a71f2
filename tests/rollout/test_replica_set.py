"""The replica set as the one owner of its replicas, with stand-in replica actors (no engine): a replica that
dies mid-request is taken out of rotation, the request starts again on a healthy one and is answered there,
and the set's health says who is out, that a sync must repair it, and what was re-queued; a batch the driver
dispatches goes only to healthy replicas, and with none left it fails naming them."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import ray
import torch

from asyncrl.config import load_config
from asyncrl.engine import GenerationRequest, GenerationResult, SamplingParams
from asyncrl.models import build_tiny_model
from asyncrl.remote import RemoteUnavailableError
from asyncrl.rollout import ReplicaSet, RolloutContext


@ray.remote(num_cpus=0)
class StandInReplica:
    """Answers like a rollout replica; each response is one token: the replica's index. One told to die exits
    its process in the middle of its first generate call."""

    def __init__(self, index: int, dies: bool):
        self.index = index
        self.dies = dies

    async def ping(self) -> tuple[int, str]:
        return self.index, "first"

    async def join_weight_group(self, *args: Any) -> None:
        return None

    async def generate(self, requests: list[GenerationRequest]) -> tuple[list[GenerationResult], float]:
        if self.dies:
            os._exit(1)
        one = np.array([self.index], dtype=np.int32)
        return [GenerationResult(request.request_id, request.prompt_ids, one, np.zeros(1, np.float32),
                                 np.zeros(1, np.int32), "length") for request in requests], 0.0


@ray.remote(num_cpus=0)
class StandInTrainer:
    async def join_weight_group(self, *args: Any) -> None:
        return None


@dataclass
class StandInTrainers:
    actors: list[Any]
    names: list[str]
    timeout_s: float = 60.0


def requests(prefix: str, count: int) -> list[GenerationRequest]:
    return [GenerationRequest(f"{prefix}/{index}", np.array([1, 2], np.int32), SamplingParams(max_new_tokens=1))
            for index in range(count)]


@pytest.fixture()
def replica_set(tmp_path, ray_session):
    config = load_config(None, [f"model.path={build_tiny_model(tmp_path / 'model')}", "trainer.device=cpu",
                                "trainer.mode=one_step_off", "rollout.n_gpus_per_node=2", "ray.rpc_timeout_s=60"])
    replicas = [StandInReplica.remote(0, dies=True), StandInReplica.remote(1, dies=False)]
    trainer = StandInTrainer.remote()
    rollout = ReplicaSet(RolloutContext(config, StandInTrainers([trainer], ["trainer/rank0"]), replicas,
                                        torch.float32, lambda: ("127.0.0.1", 0)))
    yield rollout
    rollout.close()
    ray.kill(trainer)


def test_a_replica_dying_mid_request_is_taken_out_and_its_requests_answered_elsewhere(replica_set):
    assert replica_set.names == ["rollout/replica0", "rollout/replica1"]
    assert not replica_set.health().needs_repair
    # Both are idle, so the first replica gets the group; it dies in the middle of the call.
    results = asyncio.run(replica_set.generate(requests("group", 4)))
    assert [result.request_id for result in results] == [f"group/{index}" for index in range(4)]
    assert {int(result.response_ids[0]) for result in results} == {1}
    health = replica_set.health()
    assert health.unhealthy == ("rollout/replica0",) and health.needs_repair
    assert health.metrics() == {"faults/replica_restarts": 0.0, "faults/replica_failures": 1.0,
                                "faults/requeued_requests": 4.0}
    # The driver's dispatch skips the replica out of rotation.
    pending = replica_set.start_generate(requests("batch", 6))
    assert {int(result.response_ids[0]) for result in pending.results()} == {1}
    assert [output.name for output in pending.outputs] == ["rollout/replica1"]


def test_with_every_replica_out_the_driver_dispatch_fails_naming_them(replica_set):
    replica_set.is_healthy = [False, False]
    with pytest.raises(RemoteUnavailableError, match=r"rollout/replica0, rollout/replica1: every rollout replica "
                                                     r"died mid-request and waits for a weight sync"):
        replica_set.start_generate(requests("batch", 2))
