"""The colocated backend with stand-in trainer ranks (no trainer, no engine): a batch is spread over every
rank and each part is named by its rank, groups generated concurrently go to different ranks, a sync reaches
every rank with the version, and an abort is refused, naming the backend to use instead."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import ray
import torch

from asyncrl.config import load_config
from asyncrl.engine import GenerationRequest, GenerationResult, SamplingParams
from asyncrl.rollout import ColocatedRollout, RolloutContext, RolloutError


@ray.remote(num_cpus=0)
class StandInRank:
    """Answers a trainer rank's engine calls; each response is one token: the rank."""

    def __init__(self, rank: int):
        self.rank = rank
        self.versions: list[int] = []

    def generate(self, requests: list[GenerationRequest]) -> tuple[list[GenerationResult], float]:
        one = np.array([self.rank], dtype=np.int32)
        return [GenerationResult(request.request_id, request.prompt_ids, one, np.zeros(1, np.float32),
                                 np.zeros(1, np.int32), "length") for request in requests], 0.5

    def sync_local_engine(self, version: int) -> int:
        self.versions.append(version)
        return 0

    def synced_versions(self) -> list[int]:
        return self.versions


@dataclass
class StandInTrainers:
    actors: list[Any]
    names: list[str]
    timeout_s: float = 60.0


def requests(prefix: str, count: int) -> list[GenerationRequest]:
    return [GenerationRequest(f"{prefix}/{index}", np.array([1, 2], np.int32), SamplingParams(max_new_tokens=1))
            for index in range(count)]


@pytest.fixture()
def colocated(ray_session):
    ranks = [StandInRank.remote(0), StandInRank.remote(1)]
    trainers = StandInTrainers(ranks, ["trainer/rank0", "trainer/rank1"])
    yield ColocatedRollout(RolloutContext(load_config(None, []), trainers, [], torch.float32, lambda: ("127.0.0.1", 0)))
    for rank in ranks:
        ray.kill(rank)


def test_the_colocated_backend_spreads_over_the_ranks_syncs_each_and_refuses_to_abort(colocated):
    pending = colocated.start_generate(requests("batch", 4))
    results = pending.results()
    assert [result.request_id for result in results] == [f"batch/{index}" for index in range(4)]
    assert sorted(int(result.response_ids[0]) for result in results) == [0, 0, 1, 1]
    assert [(output.name, output.seconds) for output in pending.outputs] == [("trainer/rank0", 0.5),
                                                                            ("trainer/rank1", 0.5)]

    async def two_groups() -> list[list[GenerationResult]]:
        return await asyncio.gather(colocated.generate(requests("a", 2)), colocated.generate(requests("b", 2)))

    first, second = asyncio.run(two_groups())
    assert {int(result.response_ids[0]) for result in first} == {0}   # each group on one rank ...
    assert {int(result.response_ids[0]) for result in second} == {1}  # ... the least loaded one
    colocated.sync_weights(3)
    assert colocated.version == 3
    assert ray.get([rank.synced_versions.remote() for rank in colocated.trainers.actors]) == [[3], [3]]
    with pytest.raises(RolloutError, match=r"rollout\.backend=colocated: .* partial rollout needs a backend on its "
                                           r"own devices \(ray_replicas\)"):
        asyncio.run(colocated.abort())
