"""The fully-async rollouter's agent paths: a group's slots advanced as multi-turn trajectories
(rollout.multi_turn, `TrajectorySlots`) or as runs of your own agent (rollout.agent.path, `AgentRunSlots`).

    trajectories = TrajectorySlots.from_config(config, tokenizer, requests, counters)   # None without multi_turn
    results = await trajectories.generate(rollout, group, slots)     # one GenerationResult per slot, in order

    agent_runs = AgentRunSlots.from_config(config, tokenizer, requests)   # None without rollout.agent.path
    await agent_runs.start(rollout, version=lambda: rollouter.version)   # the recording endpoint, for the run
    results = await agent_runs.generate(group, slots)                 # group.agent_samples gets each run's samples
    scored = agent_runs.score(group.samples(), config)                 # the agent's own reward, shaped
    await agent_runs.stop()

Both survive a weight sync: a trajectory parked by an abort resumes its turn on the new weights, and an agent run's
completion aborted by the pause continues when generation resumes. Each slot's state lives on the `Group`, so a
checkpoint holds it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Optional

from asyncrl.config import AsyncRLConfig
from asyncrl.core.byo_agent import agent_samples, load_agent_runner, run_result, score_agent_samples
from asyncrl.core.records import Sample
from asyncrl.engine import GenerationResult
from asyncrl.recipes.fully_async.group import Group, SlotRequests
from asyncrl.rollout import RolloutBackend
from asyncrl.rollout.agent import Trajectory
from asyncrl.rollout.agent.loop import AgentLoop

if TYPE_CHECKING:   # the serving room needs the agents extra, which only a run with rollout.agent.path imports
    from asyncrl.serving.agent_runner import AgentPool, AgentRunner


class TrajectorySlots:
    """rollout.multi_turn: each slot of a group is a trajectory of turns and tool calls (`group.trajectories`)."""

    def __init__(self, agent: AgentLoop, requests: SlotRequests, counters: dict[str, int]):
        self.agent = agent
        self.requests = requests
        self.counters = counters   # the rollouter's: resumed_responses

    @classmethod
    def from_config(cls, config: AsyncRLConfig, tokenizer: Any, requests: SlotRequests,
                    counters: dict[str, int]) -> Optional["TrajectorySlots"]:
        """The multi-turn slots of the run, or None without rollout.multi_turn.enable."""
        if not config.rollout.multi_turn.enable:
            return None
        return cls(AgentLoop.from_config(config.rollout.multi_turn, tokenizer), requests, counters)

    async def generate(self, rollout: RolloutBackend, group: Group, slots: list[int]) -> list[GenerationResult]:
        """Every slot's trajectory advances through the agent loop at once (each turn its own call); a trajectory
        parked by an abort resumes its turn, one restored mid-tool runs its calls again. A running tool is never
        interrupted: a pause only holds the trajectory's next turn."""
        return list(await asyncio.gather(*(self.advance(rollout, group, slot) for slot in slots)))

    async def advance(self, rollout: RolloutBackend, group: Group, slot: int) -> GenerationResult:
        if slot == group.greedy_slot:
            request, params = self.requests.greedy(group), self.requests.greedy_params
        else:
            request = self.requests.sampled(group, slot)
            params = request.params
        trajectory = group.trajectories.setdefault(slot, Trajectory.start(request.request_id, request.prompt_ids))
        self.counters["resumed_responses"] += trajectory.partial is not None   # the greedy slot's too, once
        await self.agent.run(rollout, trajectory, params, group.prompt.record.extra_info)
        return trajectory.as_result()


class AgentRunSlots:
    """rollout.agent.path: each slot of a group is one run of your agent against a recording endpoint over the
    run's rollout backend, served for the whole run; a run gives as many samples as it recorded histories."""

    def __init__(self, runner: "AgentRunner", requests: SlotRequests):
        self.runner = runner
        self.requests = requests
        self.serving = contextlib.AsyncExitStack()
        self.pool: "AgentPool | None" = None   # serving between `start` and `stop`

    @classmethod
    def from_config(cls, config: AsyncRLConfig, tokenizer: Any, requests: SlotRequests) -> Optional["AgentRunSlots"]:
        """The agent runs of the run (your agent loaded), or None without rollout.agent.path."""
        runner = load_agent_runner(config, tokenizer)
        return None if runner is None else cls(runner, requests)

    async def start(self, rollout: RolloutBackend, version: Callable[[], int]) -> None:
        """Serve the recording endpoint over `rollout`; its responses report the policy version `version()`."""
        self.pool = await self.serving.enter_async_context(self.runner.pool(rollout, version))

    async def stop(self) -> None:
        await self.serving.aclose()

    async def generate(self, group: Group, slots: list[int]) -> list[GenerationResult]:
        """One run per slot, all at once. A weight sync during a run does not stop it: a completion aborted by the
        pause continues on the new weights when generation resumes (the versions show both)."""
        async def run(slot: int) -> GenerationResult:
            request = self.requests.sampled(group, slot)
            outcome = await self.pool.run(request, group.prompt.record)
            group.agent_samples[slot] = agent_samples(group.prompt, 0, slot, outcome)
            return run_result(request, outcome)

        return list(await asyncio.gather(*(run(slot) for slot in slots)))

    def score(self, samples: list[Sample], config: AsyncRLConfig) -> list[Sample]:
        """The samples scored by their run's own reward (shaped like every training reward)."""
        scored, _ = score_agent_samples(samples, config, validation=False)
        return scored

    def metrics(self) -> dict[str, float]:
        return self.runner.counters.metrics()
