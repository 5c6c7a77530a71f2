"""Bring your own agent: a user's `async def rollout(client, sample)` run against a recording endpoint, its
completions assembled into token-exact trajectories that share the reward it returns (docs/byo-agent.md).

    agent = load_agent("examples/openai_agent.py:rollout")     # "file.py:name" or "package.module:name"
    outcome = await run_agent(agent, endpoint, record, "g3/0", timeout_s=300.0)
    outcome.trajectories, outcome.score, outcome.extra          # one trajectory per unbroken history
    counters.add(outcome); counters.metrics()                   # {"agent/errors": ..., "agent/timeouts": ...}

The agent gets an `openai.AsyncOpenAI` whose requests record under a fresh session, and the prompt record
(`messages`, `ground_truth`, `data_source`, `extra_info`). It returns a reward (a number) or a dict with a
"reward" and extra metrics (numbers). An agent that raises, runs past `timeout_s` or returns anything else
scores 0 (its trajectories still train, with reward 0) and is counted; the run goes on.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import openai

from asyncrl.data.records import PromptRecord
from asyncrl.rollout.agent.recorded import assemble
from asyncrl.rollout.agent.trajectory import Trajectory
from asyncrl.serving.recording import RecordingEndpoint

logger = logging.getLogger(__name__)

AgentFunction = Callable[[openai.AsyncOpenAI, PromptRecord], Awaitable[Any]]
REWARD_KEY = "reward"


class AgentLoadError(ValueError):
    """rollout.agent.path names no async function (names the path)."""


class AgentResultError(ValueError):
    """The agent returned what is not a reward (names what it returned)."""


def load_agent(path: str) -> AgentFunction:
    """The function `path` names: "file.py:name" (a file, relative to the working directory) or
    "package.module:name"."""
    where, separator, name = path.rpartition(":")
    if not separator or not where or not name:
        raise AgentLoadError(f"rollout.agent.path must be 'file.py:function' or 'module:function', got {path!r}")
    if where.endswith(".py"):
        file = Path(where)
        if not file.is_file():
            raise AgentLoadError(f"rollout.agent.path {path!r}: no file {file.resolve()}")
        spec = importlib.util.spec_from_file_location(f"asyncrl_user_agent_{file.stem}", file)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    function = getattr(module, name, None)
    if function is None or not asyncio.iscoroutinefunction(function):
        raise AgentLoadError(f"rollout.agent.path {path!r}: {where} has no async function {name!r} "
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


@dataclass
class AgentOutcome:
    trajectories: list[Trajectory]      # every recorded completion, assembled; they share the score
    score: float
    extra: dict[str, float] = field(default_factory=dict)
    error: Optional[str] = None         # what the agent raised or returned wrongly ("timeout after ..." on timeout)
    is_timeout: bool = False


async def run_agent(agent: AgentFunction, endpoint: RecordingEndpoint, record: PromptRecord, request_id: str,
                    timeout_s: float) -> AgentOutcome:
    """Runs the agent once under a fresh session; never raises for the agent's own failures."""
    session = endpoint.open_session()
    client = endpoint.client(session)
    score, extra, error, is_timeout = 0.0, {}, None, False
    try:
        score, extra = reward_of(await asyncio.wait_for(agent(client, record), timeout_s))
    except asyncio.TimeoutError:
        error, is_timeout = f"the agent ran past rollout.agent.timeout_s = {timeout_s} s", True
    except Exception as raised:   # the user's code: any failure scores 0 and the run goes on
        error = f"{type(raised).__name__}: {raised}"
    finally:
        await client.close()
        turns = endpoint.close_session(session)
    if error is not None:
        logger.warning("agent run %s scores 0: %s", request_id, error)
    return AgentOutcome(assemble(request_id, turns), score, extra, error, is_timeout)


@dataclass
class AgentCounters:
    """Agent runs and their failures, as the step's metrics."""
    num_runs: int = 0
    num_errors: int = 0
    num_timeouts: int = 0
    num_samples: int = 0

    def add(self, outcome: AgentOutcome) -> None:
        self.num_runs += 1
        self.num_timeouts += int(outcome.is_timeout)
        self.num_errors += int(outcome.error is not None and not outcome.is_timeout)
        self.num_samples += len(outcome.trajectories)

    def metrics(self) -> dict[str, float]:
        return {"agent/runs": float(self.num_runs), "agent/errors": float(self.num_errors),
                "agent/timeouts": float(self.num_timeouts), "agent/samples": float(self.num_samples)}
