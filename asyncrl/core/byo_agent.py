"""Bring your own agent in the core's stages (`rollout.agent.path`, docs/byo-agent.md): each request of a batch
is one run of the user's `async def rollout(client, sample)` against a recording endpoint over the run's rollout
backend, and each run gives the samples its recorded completions assemble to, scored with its reward.

    runner = load_agent_runner(config, tokenizer)                   # None without rollout.agent.path
    pending = start_agent_runs(runner, rollout, requests, records, timeout_s)   # returns at once
    pending.results(); pending.outcomes                              # one AgentOutcome per request
    samples = agent_samples(prompt, group_index, sample_index, outcome)          # 0, 1 or more per run
    samples, metrics = score_agent_samples(samples, config, validation=False)   # reward shaping only

The driver's stages (sync, one_step_off, and validation in every mode) run a batch's agents in a thread with an
event loop of its own, the endpoint serving there while they run, so one_step_off trains while the next batch's
agents talk to it; their completions are gathered into shared calls (`TurnBatcher`) dispatched as the stages'
own generation is (`start_generate`: a fully-async pause does not hold it, so validation after the last sync
runs). The fully-async rollouter runs them in
its own loop, one endpoint for the whole run. The serving room brings fastapi, uvicorn and openai (the
`agents` extra), which a run without an agent never imports: `load_agent_runner` is the one place that does.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np

from asyncrl.config import AsyncRLConfig, ConfigError
from asyncrl.config.agent_path import AGENTS_EXTRA
from asyncrl.core.records import Sample
from asyncrl.core.training_reward import extra_means, shape_rewards, shaping_metrics
from asyncrl.data.records import PromptRecord, TokenizedPrompt
from asyncrl.engine import GenerationRequest, GenerationResult
from asyncrl.models import read_config
from asyncrl.rollout.agent.generation import DispatchedTurns, TurnBatcher
from asyncrl.rollout.agent.recorded import AgentOutcome
from asyncrl.rollout.backend import PendingGeneration, RolloutBackend, WorkerOutput
from asyncrl.rollout.threaded_batch import ThreadedBatch

if TYPE_CHECKING:
    from asyncrl.serving.agent_runner import AgentRunner


def load_agent_runner(config: AsyncRLConfig, tokenizer: Any) -> Optional["AgentRunner"]:
    """The run's agent runner (the user's function loaded, its limits), or None without rollout.agent.path."""
    if not config.rollout.agent.path:
        return None
    try:   # here, not at the top: a run without an agent must not need the agents extra
        from asyncrl.serving.agent_runner import AgentRunner
    except ImportError as error:
        raise ConfigError(f"rollout.agent.path needs the {error.name} package: "
                          f"pip install 'asyncrl[{AGENTS_EXTRA}]'") from None
    return AgentRunner.from_config(config, tokenizer, read_config(config.model.path)[0])


def run_result(request: GenerationRequest, outcome: AgentOutcome) -> GenerationResult:
    """The request's place in a generation's results: the run's first trajectory, or nothing when it recorded
    none (its samples come from `agent_samples`, never from this)."""
    if outcome.trajectories:
        return replace(outcome.trajectories[0].as_result(), request_id=request.request_id)
    empty = np.zeros(0, np.int32)
    return GenerationResult(request.request_id, request.prompt_ids, empty, np.zeros(0, np.float32), empty, "stop")


def agent_samples(prompt: TokenizedPrompt, group_index: int, sample_index: int, outcome: AgentOutcome,
                  empty: Optional[GenerationResult] = None) -> list[Sample]:
    """One scored sample per trajectory of the run, each with the run's reward. A run that recorded nothing gives
    no sample to train, or, given `empty` (validation: every run counts), one sample of that empty result."""
    if not outcome.trajectories and empty is not None:
        return [Sample(prompt, group_index, sample_index, empty, score=outcome.score,
                       reward_extra=dict(outcome.extra), reward_error=outcome.error)]
    return [Sample(prompt, group_index, sample_index, trajectory.as_result(), score=outcome.score,
                   reward_extra=dict(outcome.extra), reward_error=outcome.error, trajectory=trajectory)
            for trajectory in outcome.trajectories]


def score_agent_samples(samples: Sequence[Sample], config: AsyncRLConfig,
                        validation: bool) -> tuple[list[Sample], dict[str, float]]:
    """Agent samples carry their run's reward already; training shapes it (reward.overlong_buffer) like every
    reward. Metrics: the mean of every extra value the agents returned (`reward/<name>/mean`)."""
    shaped = list(samples) if validation else shape_rewards(samples, config)
    metrics = extra_means(shaped)
    if not validation:
        metrics |= shaping_metrics(shaped, config)
    return shaped, metrics


@dataclass
class AgentRunsGeneration(PendingGeneration):
    """A PendingGeneration of agent runs; `outcomes` (one per request, in order) is filled by `results()`."""
    outcomes: list[AgentOutcome] = field(default_factory=list)


async def run_batch(runner: "AgentRunner", rollout: RolloutBackend, requests: list[GenerationRequest],
                    records: list[PromptRecord]) -> list[AgentOutcome]:
    batcher = TurnBatcher(DispatchedTurns(rollout), len(requests))
    async with runner.pool(batcher, lambda: rollout.version) as pool:
        async def one(request: GenerationRequest, record: PromptRecord) -> AgentOutcome:
            try:
                return await pool.run(request, record)
            finally:
                batcher.finished()
        return list(await asyncio.gather(*(one(request, record) for request, record in zip(requests, records))))


def start_agent_runs(runner: "AgentRunner", rollout: RolloutBackend, requests: list[GenerationRequest],
                     records: list[PromptRecord], timeout_s: float) -> AgentRunsGeneration:
    """Runs one agent per request in a thread with its own event loop and returns at once. `results()` waits
    for the runs (each bounded by rollout.agent.timeout_s, in waves of rollout.agent.max_concurrent) plus
    `timeout_s`, and names the agent runs when they run past."""
    batch = ThreadedBatch("asyncrl-agent-runs", lambda: run_batch(runner, rollout, list(requests), list(records)))
    pending = AgentRunsGeneration(list(requests), lambda: [])
    num_waves = math.ceil(len(requests) / runner.max_concurrent) if runner.max_concurrent else 1
    deadline_s = runner.timeout_s * num_waves + timeout_s

    def collect() -> list[WorkerOutput]:
        pending.outcomes, seconds = batch.join(deadline_s, f"agent runs: {len(requests)} runs of rollout.agent.path",
                                               "rollout.agent.timeout_s per wave + ray.rpc_timeout_s")
        results = [run_result(request, run) for request, run in zip(requests, pending.outcomes)]
        return [WorkerOutput("agents", results, seconds)]

    pending.collect = collect
    pending.started_s = batch.started_s
    return pending
