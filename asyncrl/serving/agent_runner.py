"""Bring your own agent: a user's `async def rollout(client, sample)` run against a recording endpoint, its
completions assembled into token-exact trajectories that share the reward it returns (docs/byo-agent.md).

    agent = load_agent("examples/openai_agent.py:rollout")     # "file.py:name" or "package.module:name"
    outcome = await run_agent(agent, endpoint, record, "g3/0", timeout_s=300.0)
    outcome.trajectories, outcome.score, outcome.extra          # one trajectory per unbroken history
    counters.add(outcome); counters.metrics()                   # {"agent/errors": ..., "agent/timeouts": ...}

In training (`rollout.agent.path`), `AgentRunner` holds the loaded agent and its limits, and `runner.pool(rollout)`
serves a recording endpoint over the run's rollout backend for as long as its `async with` lasts:

    runner = AgentRunner.from_config(config, tokenizer, model_config)
    async with runner.pool(generator, version=lambda: rollout.version) as pool:
        outcome = await pool.run(request, record)     # request: its id names the run, its params the defaults

The agent gets an `openai.AsyncOpenAI` whose requests record under a fresh session, and the prompt record
(`messages`, `ground_truth`, `data_source`, `extra_info`). It returns a reward (a number) or a dict with a
"reward" and extra metrics (numbers). An agent that raises, runs past `timeout_s` (blocking its event loop
included: each run has a loop of its own, `agent_thread.py`) or returns anything else scores 0 (its trajectories
still train, with reward 0) and is counted; the run goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import openai

from asyncrl.config import AsyncRLConfig
from asyncrl.config.user_code import ImportFailed, MissingAttribute, MissingFile, load_attribute, split_spec
from asyncrl.data.records import PromptRecord
from asyncrl.engine import GenerationRequest, SamplingParams
from asyncrl.models import TransformerConfig
from asyncrl.rollout.agent.recorded import AgentCounters, AgentOutcome, assemble
from asyncrl.serving.agent_thread import AgentThread, AgentTimeout
from asyncrl.serving.recording import RecordingEndpoint
from asyncrl.serving.rollout_served import Generator, RolloutServedModel

logger = logging.getLogger(__name__)

AgentFunction = Callable[[openai.AsyncOpenAI, PromptRecord], Awaitable[Any]]
REWARD_KEY = "reward"


class AgentLoadError(ValueError):
    """rollout.agent.path names no async function (names the path)."""


class AgentResultError(ValueError):
    """The agent returned what is not a reward (names what it returned)."""


def load_agent(path: str) -> AgentFunction:
    """The function `path` names: "file.py:name" (a file, relative to the working directory) or
    "package.module:name"; any failure while its module runs is an AgentLoadError naming it."""
    spec = split_spec(path)
    if spec is None:
        raise AgentLoadError(f"rollout.agent.path must be 'file.py:function' or 'module:function', got {path!r}")
    try:
        function = load_attribute(spec, kind="agent")
    except MissingFile as failure:
        raise AgentLoadError(f"rollout.agent.path {path!r}: no file {failure.file.resolve()}") from None
    except ImportFailed as failure:
        raise AgentLoadError(f"rollout.agent.path {path!r}: {spec.location} failed to import: {failure.cause}") \
            from None
    except MissingAttribute:
        function = None
    if function is None or not asyncio.iscoroutinefunction(function):
        raise AgentLoadError(f"rollout.agent.path {path!r}: {spec.location} has no async function {spec.name!r} "
                             "(write `async def rollout(client, sample)`)")
    return function


def reward_of(returned: Any) -> tuple[float, dict[str, float]]:
    """(score, extra metrics) of what the agent returned: a number, or {"reward": number, name: number...}."""
    if isinstance(returned, dict):
        if REWARD_KEY not in returned:
            raise AgentResultError(f"the agent returned a dict without a {REWARD_KEY!r} key: {sorted(returned)}")
        extra = {key: value for key, value in returned.items() if key != REWARD_KEY}
        bad = [key for key, value in extra.items() if isinstance(value, bool) or not isinstance(value, (int, float))]
        if bad:
            raise AgentResultError(f"the agent's extra metrics must be numbers; {bad} are not")
        score, _ = reward_of(returned[REWARD_KEY])
        return score, {key: float(value) for key, value in extra.items()}
    if isinstance(returned, bool) or not isinstance(returned, (int, float)) or not math.isfinite(returned):
        raise AgentResultError(f"the agent must return a finite number or a dict with {REWARD_KEY!r}, "
                               f"got {returned!r}")
    return float(returned), {}


async def run_agent(agent: AgentFunction, endpoint: RecordingEndpoint, record: PromptRecord, request_id: str,
                    timeout_s: float, defaults: Optional[SamplingParams] = None) -> AgentOutcome:
    """Runs the agent once under a fresh session (whose requests default to `defaults`), in an event loop of its
    own, timed from this one (so an agent that blocks its loop is stopped too); never raises for the agent's own
    failures."""
    session = endpoint.open_session(defaults)

    async def call() -> Any:   # in the agent's own event loop (agent_thread.py), with a client made there
        client = endpoint.client(session)
        try:
            return await agent(client, record)
        finally:
            await client.close()

    score, extra, error, is_timeout = 0.0, {}, None, False
    try:
        score, extra = reward_of(await AgentThread(call, request_id).result(timeout_s))
    except AgentTimeout as timeout:
        error, is_timeout = str(timeout), True
    except Exception as raised:   # the user's code: any failure scores 0 and the run goes on
        error = f"{type(raised).__name__}: {raised}"
    finally:
        turns = endpoint.close_session(session)
    if error is not None:
        logger.warning("agent run %s scores 0: %s", request_id, error)
    return AgentOutcome(assemble(request_id, turns), score, extra, error, is_timeout)


class AgentPool:
    """Agent runs against one recording endpoint, at most `max_concurrent` at once (0: no limit)."""

    def __init__(self, runner: "AgentRunner", endpoint: RecordingEndpoint):
        self.runner = runner
        self.endpoint = endpoint
        self.slots = asyncio.Semaphore(runner.max_concurrent) if runner.max_concurrent else None

    async def run(self, request: GenerationRequest, record: PromptRecord) -> AgentOutcome:
        """One run of the agent on `record`, named `request.request_id`, its requests defaulting to
        `request.params` (the run's sampling, seed and per-turn token budget)."""
        async with self.slots if self.slots is not None else contextlib.nullcontext():
            outcome = await run_agent(self.runner.agent, self.endpoint, record, request.request_id,
                                      self.runner.timeout_s, request.params)
        self.runner.counters.add(outcome)
        return outcome


@dataclass
class AgentRunner:
    """`rollout.agent.*` loaded: the agent, its limits, and what a recording endpoint over the run's rollout
    backend needs to know of the model (its name for clients, context length, vocabulary)."""
    agent: AgentFunction
    timeout_s: float
    max_concurrent: int
    tokenizer: Any
    model_name: str
    max_model_len: int
    vocab_size: int
    counters: AgentCounters = field(default_factory=AgentCounters)

    @classmethod
    def from_config(cls, config: AsyncRLConfig, tokenizer: Any, model_config: TransformerConfig) -> "AgentRunner":
        settings = config.rollout.agent
        return cls(load_agent(settings.path), settings.timeout_s, settings.max_concurrent, tokenizer,
                   Path(config.model.path).name, model_config.max_position_embeddings, model_config.vocab_size)

    @contextlib.asynccontextmanager
    async def pool(self, generator: Generator, version: Callable[[], int]) -> AsyncIterator[AgentPool]:
        """A recording endpoint on 127.0.0.1 over `generator` (the rollout backend, or a batcher of its turns),
        serving while the block runs; `version` gives the policy version responses report."""
        served = RolloutServedModel(generator, self.tokenizer, self.model_name, self.max_model_len, self.vocab_size,
                                    version)
        endpoint = RecordingEndpoint(served)
        await endpoint.start()
        try:
            yield AgentPool(self, endpoint)
        finally:
            await endpoint.stop()
