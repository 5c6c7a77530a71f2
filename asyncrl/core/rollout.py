"""Where generation runs. The core's `generate` stage and `sync_weights` stage talk to a `Rollout`.

`ColocatedRollout` (sync mode) uses the engines inside the trainer ranks: requests are spread over the
ranks, and a weight sync copies the gathered policy into each rank's engine in process. The separated
modes use replicas on their own devices (`asyncrl.distributed.rollout_replicas`).
"""

from __future__ import annotations

from typing import Protocol

from asyncrl.core.trainer_group import TrainerGroup
from asyncrl.engine import GenerationRequest, GenerationResult


class Rollout(Protocol):
    version: int

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Results in request order."""
        ...

    def sync_weights(self, version: int) -> None:
        """Make every replica's weights equal the trainer's and stamp new tokens with `version`."""
        ...

    def close(self) -> None:
        ...


def spread(requests: list[GenerationRequest], num_parts: int) -> list[list[GenerationRequest]]:
    """Balance requests over parts by their worst-case token count (prompt + budget), largest first."""
    parts: list[list[GenerationRequest]] = [[] for _ in range(num_parts)]
    loads = [0] * num_parts
    for request in sorted(requests, key=lambda r: -(r.prompt_ids.size + r.params.max_new_tokens)):
        target = min(range(num_parts), key=loads.__getitem__)
        parts[target].append(request)
        loads[target] += request.prompt_ids.size + request.params.max_new_tokens
    return parts


class ColocatedRollout:
    def __init__(self, trainers: TrainerGroup):
        self.trainers = trainers
        self.version = 0

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        parts = spread(requests, self.trainers.world_size)
        refs = [actor.generate.remote(part) for actor, part in zip(self.trainers.actors, parts)]
        results = {result.request_id: result for part in self.trainers.wait(refs, "generate") for result in part}
        return [results[request.request_id] for request in requests]

    def sync_weights(self, version: int) -> None:
        refs = [actor.sync_local_engine.remote(version) for actor in self.trainers.actors]
        self.trainers.wait(refs, "sync_local_engine")
        self.version = version

    def close(self) -> None:
        """The engines live in the trainer ranks, which the runtime stops."""
