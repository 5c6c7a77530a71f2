"""Multi-turn generation for the driver's synchronous stages (sync and one_step_off modes).

    pending = start_agent_generation(rollout, agent, requests, extra_infos, timeout_s)   # returns at once
    results = pending.results()          # GenerationResults in request order (whole trajectories)
    pending.trajectories                 # the Trajectory of each request, same order

The trajectories run concurrently in an event loop of their own (a thread), so one_step_off still trains
while the next batch's agents generate and call tools. Their turns are gathered into shared `generate` calls
(`TurnBatcher`): a backend whose worker runs one call at a time (colocated engines in the trainer ranks)
then still decodes many trajectories together, while a trajectory whose tools run does not hold the others.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Optional

from asyncrl.engine import GenerationRequest, GenerationResult
from asyncrl.rollout.agent.loop import AgentLoop, Generator
from asyncrl.rollout.agent.trajectory import Trajectory
from asyncrl.rollout.backend import PendingGeneration, RolloutBackend, RolloutError, WorkerOutput
from asyncrl.rollout.threaded_batch import ThreadedBatch

BATCH_WINDOW_S = 0.02   # how long a turn waits for others before its batch goes out


class TurnBatcher:
    """A `generate` that gathers the turns of concurrent trajectories into one call to `rollout`: a batch goes
    out once every trajectory still running waits for a turn, or `window_s` after its first turn arrived."""

    def __init__(self, rollout: Generator, num_running: int, window_s: float = BATCH_WINDOW_S):
        self.rollout = rollout
        self.num_running = num_running
        self.window_s = window_s
        self.waiting: list[tuple[list[GenerationRequest], asyncio.Future]] = []
        self.timer: Optional[asyncio.TimerHandle] = None
        self.sending: set[asyncio.Task] = set()

    async def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        future = asyncio.get_running_loop().create_future()
        self.waiting.append((requests, future))
        self.flush_if_all_wait()
        if self.waiting and self.timer is None:
            self.timer = asyncio.get_running_loop().call_later(self.window_s, self.flush)
        return await future

    def finished(self) -> None:
        """A trajectory ended: the others no longer wait for its turn."""
        self.num_running -= 1
        self.flush_if_all_wait()

    def flush_if_all_wait(self) -> None:
        if self.waiting and len(self.waiting) >= self.num_running:
            self.flush()

    def flush(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        batch, self.waiting = self.waiting, []
        if batch:
            task = asyncio.ensure_future(self.send(batch))
            self.sending.add(task)
            task.add_done_callback(self.sending.discard)

    async def send(self, batch: list[tuple[list[GenerationRequest], asyncio.Future]]) -> None:
        requests = [request for part, _ in batch for request in part]
        try:
            results = await self.rollout.generate(requests)
        except Exception as error:   # every waiting trajectory sees the backend's error
            for _, future in batch:
                future.set_exception(error)
            return
        start = 0
        for part, future in batch:
            future.set_result(results[start:start + len(part)])
            start += len(part)


@dataclass
class AgentGeneration(PendingGeneration):
    """A PendingGeneration whose results are whole trajectories; `trajectories` is filled by `results()`."""
    trajectories: list[Trajectory] = field(default_factory=list)


class DispatchedTurns:
    """The driver stages' way into a backend: each batch of turns is dispatched with `start_generate` and
    collected in a worker thread, the path a single-turn batch takes. The awaitable `generate` waits at the
    backend's pause gate instead, which the fully-async rollouter holds closed during its syncs and after the
    last step, while the driver still validates."""

    def __init__(self, rollout: RolloutBackend):
        self.rollout = rollout

    async def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        return await asyncio.to_thread(lambda: self.rollout.start_generate(requests).results())


async def run_trajectories(rollout: Generator, agent: AgentLoop, requests: list[GenerationRequest],
                           extra_infos: list[dict[str, Any]]) -> list[Trajectory]:
    batcher = TurnBatcher(rollout, len(requests))

    async def one(request: GenerationRequest, extra_info: dict[str, Any]) -> Trajectory:
        try:
            trajectory = await agent.run(batcher, Trajectory.start(request.request_id, request.prompt_ids),
                                         request.params, extra_info)
        finally:
            batcher.finished()
        if trajectory.finish_reason is None:
            raise RolloutError(f"trajectory {request.request_id} was aborted mid-turn; the driver's stages run "
                               "each generation to its end (partial rollout is fully_async's)")
        return trajectory

    return list(await asyncio.gather(*(one(request, info) for request, info in zip(requests, extra_infos))))


def start_agent_generation(rollout: RolloutBackend, agent: AgentLoop, requests: list[GenerationRequest],
                           extra_infos: list[dict[str, Any]], timeout_s: float) -> AgentGeneration:
    """Runs the trajectories in a thread with its own event loop and returns at once; `results()` waits at
    most `timeout_s` and names the agent loop when it runs past."""
    batch = ThreadedBatch("asyncrl-agent-loop", lambda: run_trajectories(DispatchedTurns(rollout), agent,
                                                                          list(requests), extra_infos))
    pending = AgentGeneration(list(requests), lambda: [])

    def collect() -> list[WorkerOutput]:
        pending.trajectories, seconds = batch.join(
            timeout_s, f"agent loop: {len(requests)} multi-turn trajectories", "ray.rpc_timeout_s")
        return [WorkerOutput("agent", [trajectory.as_result() for trajectory in pending.trajectories], seconds)]

    pending.collect = collect
    pending.started_s = batch.started_s
    return pending
