"""THE rollout contract: what every rollout backend does, whoever calls it.

    results = await rollout.generate(group)       # asynchronous callers: the fully-async rollouter, an agent loop
    pending = rollout.start_generate(requests)    # the driver's synchronous stages: dispatch now ...
    results = pending.results()                   # ... collect later (every wait named, with a timeout)
    partial = await rollout.abort()               # requests in flight end now, finish_reason "abort"
    await rollout.pause(); await rollout.wait_until_idle(); ...; await rollout.resume()
    rollout.sync_weights(version)                 # receive weights: equal to the trainer's, new tokens stamped
    await rollout.sleep(); await rollout.wake()   # release / take back the KV cache
    rollout.health(); rollout.activity(); rollout.close()

Every result carries its tokens' log-probs and the policy version that sampled each token. A backend is
built from a `RolloutContext` (`registry.py`) and registered next to its definition in `ROLLOUT_BACKENDS`.
How a backend receives weights is its own business: an in-process copy, a broadcast over a weight group, a
folder the trainer writes for a server to reload; the contract is only that after `sync_weights(v)` its
engines hold the trainer's weights and stamp `v` on every new token.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, Optional

from asyncrl.engine import GenerationRequest, GenerationResult
from asyncrl.rollout.gate import BusyClock


class RolloutError(RuntimeError):
    """A backend asked for something it cannot do (the message says what to use instead)."""


@dataclass(frozen=True)
class WorkerOutput:
    """What one worker (an engine host: a trainer rank, a replica, a server) returned for its share."""
    name: str                           # trainer/rank0, rollout/replica1, ...
    results: list[GenerationResult]
    seconds: float                      # its time spent generating them


@dataclass
class PendingGeneration:
    """Generation dispatched by `start_generate`; `results()` blocks until every worker answered."""
    requests: list[GenerationRequest]
    collect: Callable[[], list[WorkerOutput]]   # waits for the workers (named waits, with a timeout)
    started_s: float = field(default_factory=time.time)   # wall clock at dispatch
    outputs: list[WorkerOutput] = field(default_factory=list)   # filled by results()

    @classmethod
    def finished(cls, requests: list[GenerationRequest], outputs: list[WorkerOutput],
                 started_s: float) -> "PendingGeneration":
        """A generation that already ran (in process)."""
        return cls(list(requests), lambda: outputs, started_s)

    @property
    def generation_seconds(self) -> float:
        """The slowest worker's generation time (known after `results()`)."""
        return max((output.seconds for output in self.outputs), default=0.0)

    def results(self) -> list[GenerationResult]:
        """Results in request order."""
        self.outputs = self.collect()
        by_id = {result.request_id: result for output in self.outputs for result in output.results}
        return [by_id[request.request_id] for request in self.requests]


@dataclass(frozen=True)
class RolloutHealth:
    """How the backend's workers fare: which are out of rotation, and the faults survived so far."""
    num_workers: int
    unhealthy: tuple[str, ...] = ()     # died mid-request: out of rotation until a weight sync re-joins them
    num_restarts: int = 0               # workers Ray restarted that re-joined the weight group
    num_failures: int = 0               # workers taken out of rotation after dying mid-request
    num_requeued_requests: int = 0      # requests started again on another worker after theirs died
    num_retired: int = 0                # workers stopped for good after failing too often in a row
    num_resizes: int = 0                # times the set of workers grew or shrank on request (asyncrl scale)

    @property
    def needs_repair(self) -> bool:
        """A worker waits for a weight sync to bring it back."""
        return bool(self.unhealthy)

    def metrics(self) -> dict[str, float]:
        return {"faults/replica_restarts": float(self.num_restarts),
                "faults/replica_failures": float(self.num_failures),
                "faults/requeued_requests": float(self.num_requeued_requests),
                "faults/replicas_retired": float(self.num_retired),
                "rollout/num_replicas": float(self.num_workers), "rollout/num_resizes": float(self.num_resizes)}


@dataclass(frozen=True)
class SyncStats:
    """What one sync moved: `bytes` on the wire (headers included), `dense_bytes` what a dense sync moves, and
    the fraction of elements sent as changed (None when a dense sync did not compare)."""
    bytes: int
    dense_bytes: int
    changed_fraction: Optional[float] = None

    def metrics(self) -> dict[str, float]:
        metrics = {"weight_sync/bytes": float(self.bytes), "weight_sync/dense_bytes": float(self.dense_bytes)}
        if self.changed_fraction is not None:
            metrics["weight_sync/changed_fraction"] = self.changed_fraction
        return metrics


class RolloutBackend(ABC):
    """Where generation runs. Asynchronous methods are called from an event loop (a Ray asyncio actor, an
    agent loop, a server); the others from the driver's synchronous stages."""

    version: int   # the policy version new tokens are stamped with (set by `sync_weights`)

    # ---- generation -----------------------------------------------------------------------------------
    @abstractmethod
    async def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Generates `requests` together on one engine (a group shares its prompt's KV blocks); results in
        request order. Waits while paused; a request whose worker dies starts again on another."""

    def start_generate(self, requests: list[GenerationRequest]) -> PendingGeneration:
        """Dispatches a batch and returns at once; `results()` collects it. Not held by `pause` (the driver
        dispatches only between its own syncs). A backend with several workers spreads the batch over them;
        this default generates it in a private event loop before returning, so a backend whose `generate`
        must run on its host's own loop (hosted by an actor) overrides it."""
        started_s, started = time.time(), time.monotonic()
        results = asyncio.run(self.generate(list(requests)))
        return PendingGeneration.finished(requests, [WorkerOutput("rollout", results, time.monotonic() - started)],
                                          started_s)

    @abstractmethod
    async def abort(self) -> list[GenerationResult]:
        """Ends every request in flight now and returns their partial results (finish_reason "abort"), which
        their `generate` callers receive too; `GenerationRequest.resume` continues one later."""

    @abstractmethod
    async def pause(self) -> None:
        """From now on `generate` calls (new ones and re-queued ones) wait for `resume`; requests in flight
        go on (to their end, or to an `abort`)."""

    @abstractmethod
    async def resume(self) -> None:
        ...

    @abstractmethod
    async def wait_until_idle(self) -> None:
        """Returns once no request runs on any engine (after a pause it stays so until `resume`)."""

    # ---- weights and memory ---------------------------------------------------------------------------
    @abstractmethod
    def sync_weights(self, version: int) -> None:
        """Receives the trainer's weights: afterwards every engine's weights equal the trainer's and new
        tokens are stamped `version`. Requests in flight continue with the new weights."""

    @abstractmethod
    async def sleep(self) -> None:
        """Releases the KV cache (colocated engines give the memory to training); requests wait."""

    @abstractmethod
    async def wake(self) -> None:
        ...

    def sync_stats(self) -> Optional[SyncStats]:
        """What the last `sync_weights` moved, for a backend that sends weights over a weight group (None for
        one that copies them in process or has servers reload a folder)."""
        return None

    # ---- health -----------------------------------------------------------------------------------------
    @abstractmethod
    def health(self) -> RolloutHealth:
        ...

    @abstractmethod
    def activity(self) -> BusyClock:
        """When requests were generating (idle ratios, timeline spans)."""

    @abstractmethod
    def close(self) -> None:
        """Releases what the backend holds; it is not used afterwards."""


def spread(requests: list[GenerationRequest], num_parts: int) -> list[list[GenerationRequest]]:
    """Balance requests over parts by their worst-case token count (prompt + budget), largest first."""
    parts: list[list[GenerationRequest]] = [[] for _ in range(num_parts)]
    loads = [0] * num_parts
    for request in sorted(requests, key=lambda r: -(r.prompt_ids.size + r.params.max_new_tokens)):
        target = min(range(num_parts), key=loads.__getitem__)
        parts[target].append(request)
        loads[target] += request.prompt_ids.size + request.params.max_new_tokens
    return parts
