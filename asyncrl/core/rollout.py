"""Where generation runs. The core's `generate` stage and `sync_weights` stage talk to a `Rollout`.

`ColocatedRollout` (sync mode) uses the engines inside the trainer ranks: requests are spread over the
ranks, and a weight sync copies the gathered policy into each rank's engine in process. The separated
modes use replicas on their own devices (`asyncrl.distributed.rollout_replicas`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from asyncrl.core.trainer_group import TrainerGroup
from asyncrl.distributed.remote import wait_for_all
from asyncrl.engine import GenerationRequest, GenerationResult


@dataclass
class PendingGeneration:
    """Generation running in the background (the remote calls are already dispatched)."""
    requests: list[GenerationRequest]
    refs: list[Any]
    names: list[str]
    timeout_s: float
    started_s: float = field(default_factory=time.time)   # wall clock at dispatch
    generation_seconds: float = 0.0   # the slowest worker's generation time, known after results()
    worker_seconds: list[float] = field(default_factory=list)

    def results(self) -> list[GenerationResult]:
        """Results in request order (blocks until every worker answered)."""
        parts = wait_for_all(self.refs, self.names, "generate", self.timeout_s)
        self.worker_seconds = [seconds for _, seconds in parts]
        self.generation_seconds = max(self.worker_seconds, default=0.0)
        by_id = {result.request_id: result for results, _ in parts for result in results}
        return [by_id[request.request_id] for request in self.requests]


class Rollout(Protocol):
    version: int

    def start_generate(self, requests: list[GenerationRequest]) -> PendingGeneration:
        """Dispatch generation and return at once."""
        ...

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Results in request order."""
        ...

    def sync_weights(self, version: int) -> None:
        """Make every replica's weights equal the trainer's and stamp new tokens with `version`."""
        ...

    def fault_metrics(self) -> dict[str, float]:
        """Counters of faults the rollout survived (`faults/*`)."""
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

    def start_generate(self, requests: list[GenerationRequest]) -> PendingGeneration:
        parts = spread(requests, self.trainers.world_size)
        # Every rank gets a call (maybe empty): generation is not collective, but keeping ranks in step is simpler.
        refs = [actor.generate.remote(part) for actor, part in zip(self.trainers.actors, parts)]
        return PendingGeneration(list(requests), refs, list(self.trainers.names), self.trainers.timeout_s)

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        return self.start_generate(requests).results()

    def sync_weights(self, version: int) -> None:
        refs = [actor.sync_local_engine.remote(version) for actor in self.trainers.actors]
        self.trainers.wait(refs, "sync_local_engine")
        self.version = version

    def fault_metrics(self) -> dict[str, float]:
        return {}  # the engines live in the trainer ranks: a dead one is a dead trainer rank

    def close(self) -> None:
        """The engines live in the trainer ranks, which the runtime stops."""
