"""The replica set as the one owner of its replicas, with stand-in replica actors (no engine): a replica that
dies mid-request is taken out of rotation, the request starts again on a healthy one and is answered there,
and the set's health says who is out, that a sync must repair it, and what was re-queued; a batch the driver
dispatches goes only to healthy replicas, and with none left it fails naming them. A replica that fails K times
in a row, or that Ray will not restart, is retired at the next sync, naming it; a scale request grows the set
(new replicas join the weight group and receive the version before any request) and shrinks it."""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import ray
import torch

from asyncrl.cli import main
from asyncrl.config import load_config
from asyncrl.engine import GenerationRequest, GenerationResult, SamplingParams
from asyncrl.models import build_tiny_model
from asyncrl.remote import RemoteUnavailableError
from asyncrl.rollout import ReplicaSet, RolloutContext
from asyncrl.rollout.elastic import read_scale_request


class StandIn:
    """Answers like a rollout replica; each response is one token: the replica's index. One told to die exits
    its process in the middle of every generate call (a restarted one too: the flag is an argument)."""

    def __init__(self, index: int, dies: bool):
        self.index = index
        self.dies = dies
        self.incarnation = uuid.uuid4().hex
        self.versions: list[int] = []
        self.num_joins = 0

    async def ping(self) -> tuple[int, str]:
        return self.index, self.incarnation

    async def join_weight_group(self, *args: Any) -> None:
        self.num_joins += 1

    async def receive_weights(self, version: int) -> int:
        self.versions.append(version)
        return 0

    async def num_in_flight(self) -> int:
        return 0

    async def history(self) -> tuple[int, list[int]]:
        """(weight groups joined, versions received) by this process."""
        return self.num_joins, self.versions

    async def generate(self, requests: list[GenerationRequest]) -> tuple[list[GenerationResult], float]:
        if self.dies:
            os._exit(1)
        one = np.array([self.index], dtype=np.int32)
        return [GenerationResult(request.request_id, request.prompt_ids, one, np.zeros(1, np.float32),
                                 np.zeros(1, np.int32), "length") for request in requests], 0.0


StandInReplica = ray.remote(num_cpus=0)(StandIn)
RestartedStandIn = ray.remote(num_cpus=0, max_restarts=5, max_task_retries=0)(StandIn)


@ray.remote(num_cpus=0)
class StandInTrainer:
    async def join_weight_group(self, *args: Any) -> None:
        return None

    async def send_weights(self) -> None:
        return None


@dataclass
class StandInTrainers:
    actors: list[Any]
    names: list[str]
    timeout_s: float = 60.0


def requests(prefix: str, count: int) -> list[GenerationRequest]:
    return [GenerationRequest(f"{prefix}/{index}", np.array([1, 2], np.int32), SamplingParams(max_new_tokens=1))
            for index in range(count)]


def stand_in_set(tmp_path, replicas: list[Any], *overrides: str) -> tuple[ReplicaSet, Any]:
    config = load_config(None, [f"model.path={build_tiny_model(tmp_path / 'model')}", "trainer.device=cpu",
                                "trainer.mode=one_step_off", "rollout.n_gpus_per_node=2", "ray.rpc_timeout_s=60",
                                f"trainer.output_dir={tmp_path / 'run'}", *overrides])
    trainer = StandInTrainer.remote()
    rollout = ReplicaSet(RolloutContext(config, StandInTrainers([trainer], ["trainer/rank0"]), replicas,
                                        torch.float32, lambda: ("127.0.0.1", 0),
                                        lambda index: StandInReplica.remote(index, dies=False)))
    return rollout, trainer


@pytest.fixture()
def replica_set(tmp_path, ray_session):
    rollout, trainer = stand_in_set(tmp_path, [StandInReplica.remote(0, dies=True), StandInReplica.remote(1, dies=False)])
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
                                "faults/requeued_requests": 4.0, "faults/replicas_retired": 0.0,
                                "rollout/num_replicas": 2.0, "rollout/num_resizes": 0.0}
    # The driver's dispatch skips the replica out of rotation.
    pending = replica_set.start_generate(requests("batch", 6))
    assert {int(result.response_ids[0]) for result in pending.results()} == {1}
    assert [output.name for output in pending.outputs] == ["rollout/replica1"]


def test_with_every_replica_out_the_driver_dispatch_fails_naming_them(replica_set):
    for member in replica_set.members:
        member.is_healthy = False
    with pytest.raises(RemoteUnavailableError, match=r"rollout/replica0, rollout/replica1: every rollout replica "
                                                     r"died mid-request and waits for a weight sync"):
        replica_set.start_generate(requests("batch", 2))


def test_a_replica_ray_does_not_restart_is_retired_at_the_next_sync_naming_it(replica_set, caplog):
    asyncio.run(replica_set.generate(requests("group", 2)))   # replica0 dies for good (no restarts allowed)
    with caplog.at_level(logging.WARNING, logger="asyncrl.rollout.replica_set"):
        replica_set.sync_weights(1)
    assert replica_set.names == ["rollout/replica1"]
    assert any("rollout/replica0 retired: it died and Ray does not restart it" in line for line in caplog.messages)
    health = replica_set.health()
    assert health.num_workers == 1 and health.num_retired == 1 and not health.needs_repair
    results = asyncio.run(replica_set.generate(requests("after", 2)))
    assert {int(result.response_ids[0]) for result in results} == {1}


def test_a_replica_failing_k_times_in_a_row_is_retired_and_the_rest_go_on(tmp_path, ray_session, caplog):
    """Ray restarts replica0 every time it dies (it dies in every generate): the first failure is repaired by the
    sync (restarted, re-joined), the second in a row retires it (rollout.max_replica_failures=2)."""
    rollout, trainer = stand_in_set(tmp_path, [RestartedStandIn.remote(0, dies=True),
                                               StandInReplica.remote(1, dies=False)],
                                    "rollout.max_replica_failures=2")
    try:
        for version in (1, 2):
            results = asyncio.run(rollout.generate(requests(f"group{version}", 2)))
            assert {int(result.response_ids[0]) for result in results} == {1}   # answered by the other
            with caplog.at_level(logging.WARNING, logger="asyncrl.rollout.replica_set"):
                rollout.sync_weights(version)
            assert len(rollout.members) == (2 if version == 1 else 1)
        assert rollout.health().num_restarts == 1 and rollout.health().num_retired == 1
        assert any("rollout/replica0 retired: it failed 2 times in a row (rollout.max_replica_failures=2)" in line
                   for line in caplog.messages)
    finally:
        rollout.close()
        ray.kill(trainer)


def test_a_scale_request_grows_the_set_with_synced_replicas_then_drains_it_back(tmp_path, ray_session):
    rollout, trainer = stand_in_set(tmp_path, [StandInReplica.remote(0, dies=False)])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("{}\n")
    try:
        rollout.sync_weights(1)
        assert rollout.names == ["rollout/replica0"]
        assert main(["scale", str(run_dir), "--replicas", "3"]) == 0
        rollout.sync_weights(2)
        assert rollout.names == ["rollout/replica0", "rollout/replica1", "rollout/replica2"]
        # The new replicas joined the new group and received version 2, the first they ever got, before any request.
        histories = ray.get([replica.history.remote() for replica in rollout.replicas])
        assert histories == [(2, [1, 2]), (1, [2]), (1, [2])]
        pending = rollout.start_generate(requests("batch", 6))
        assert {int(result.response_ids[0]) for result in pending.results()} == {0, 1, 2}
        assert rollout.health().num_resizes == 1 and rollout.health().num_restarts == 0   # joined, not restarted
        assert main(["scale", str(run_dir), "--replicas", "1"]) == 0
        rollout.sync_weights(3)
        assert rollout.names == ["rollout/replica0"]   # the newest left first
        assert rollout.health().num_resizes == 2 and rollout.health().metrics()["rollout/num_replicas"] == 1.0
    finally:
        rollout.close()
        ray.kill(trainer)


def test_scale_refuses_a_folder_that_is_not_a_run_and_a_count_below_one(tmp_path, capsys):
    assert main(["scale", str(tmp_path), "--replicas", "2"]) == 2
    assert "is not a run folder (no config.yaml)" in capsys.readouterr().err
    (tmp_path / "config.yaml").write_text("{}\n")
    assert main(["scale", str(tmp_path), "--replicas", "0"]) == 2
    assert "--replicas must be at least 1, got 0" in capsys.readouterr().err
    (tmp_path / "scale.json").write_text("{\"replicas\": \"two\"}")
    assert read_scale_request(tmp_path) is None   # logged and ignored: the run goes on as it is
