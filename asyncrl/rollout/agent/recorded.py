"""Trajectories assembled from recorded completions: what a bring-your-own agent sampled, token-exact.

    turns = [result_1, result_2, ...]          # each completion as the engine returned it (GenerationResult)
    trajectories = assemble("g3/0", turns)     # usually one; more when the agent rewrote its history
    outcome = AgentOutcome(trajectories, score=1.0)   # one agent run: its trajectories share its reward
    counters.add(outcome); counters.metrics()  # agent/runs, agent/errors, agent/timeouts, agent/samples, ...

A turn whose prompt ids start with an earlier trajectory's context (its prompt, then every token after it)
continues that trajectory: the ids in between (the chat template's markup after the model's reply, tool
results, the next user message, the next generation prompt) are appended as environment tokens (loss mask 0),
then the turn's sampled ids with their log-probs and versions (mask 1). A turn that extends no trajectory (the
agent rewrote, summarised or truncated its history, or the template renders the model's reply to other ids
than it sampled) starts a new trajectory. The ids compared are the engine's, never re-tokenized text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from asyncrl.engine import GenerationResult
from asyncrl.rollout.agent.trajectory import MODEL_TOKEN, Trajectory


def extends(prompt_ids: np.ndarray, context_ids: np.ndarray) -> bool:
    """Whether `prompt_ids` starts with all of `context_ids`."""
    return prompt_ids.size >= context_ids.size and bool(np.array_equal(prompt_ids[:context_ids.size], context_ids))


def continued(trajectories: Sequence[Trajectory], prompt_ids: np.ndarray) -> Optional[Trajectory]:
    """The trajectory the prompt continues: of those it extends, the one with the longest context (the latest
    when two tie), or None."""
    best: Optional[Trajectory] = None
    for trajectory in trajectories:
        context = trajectory.context_ids()
        if extends(prompt_ids, context) and (best is None or context.size >= best.context_ids().size):
            best = trajectory
    return best


def assemble(request_id: str, turns: Sequence[GenerationResult]) -> list[Trajectory]:
    """The trajectories of one agent run's completions, in the order they were made; trajectory k is
    '<request_id>/<k>'. Each ends "length" when its last turn ran out of tokens, else "stop"."""
    trajectories: list[Trajectory] = []
    for turn in turns:
        prompt_ids = np.asarray(turn.prompt_ids, dtype=np.int32).reshape(-1)
        trajectory = continued(trajectories, prompt_ids)
        if trajectory is None:
            trajectory = Trajectory.start(f"{request_id}/{len(trajectories)}", prompt_ids)
            trajectories.append(trajectory)
        else:
            trajectory.append_tool(prompt_ids[trajectory.context_ids().size:])
        trajectory.append_model(turn)
        trajectory.finish_reason = "length" if turn.finish_reason == "length" else "stop"
    return trajectories


@dataclass
class AgentOutcome:
    """One run of a user's agent: every recorded completion, assembled; they share the score it returned."""
    trajectories: list[Trajectory]
    score: float
    extra: dict[str, float] = field(default_factory=dict)
    error: Optional[str] = None         # what the agent raised or returned wrongly ("... timeout_s ..." on timeout)
    is_timeout: bool = False


def spans_versions(trajectory: Trajectory) -> bool:
    """Its model tokens were sampled by more than one policy version (a weight sync during the run)."""
    versions = trajectory.versions[trajectory.loss_mask == MODEL_TOKEN]
    return versions.size > 0 and int(versions.min()) != int(versions.max())


@dataclass
class AgentCounters:
    """Agent runs and their failures since the run started, as metrics."""
    num_runs: int = 0
    num_errors: int = 0
    num_timeouts: int = 0
    num_samples: int = 0
    num_samples_across_versions: int = 0

    def add(self, outcome: AgentOutcome) -> None:
        self.num_runs += 1
        self.num_timeouts += int(outcome.is_timeout)
        self.num_errors += int(outcome.error is not None and not outcome.is_timeout)
        self.num_samples += len(outcome.trajectories)
        self.num_samples_across_versions += sum(spans_versions(trajectory) for trajectory in outcome.trajectories)

    def metrics(self) -> dict[str, float]:
        return {"agent/runs": float(self.num_runs), "agent/errors": float(self.num_errors),
                "agent/timeouts": float(self.num_timeouts), "agent/samples": float(self.num_samples),
                "agent/samples_across_versions": float(self.num_samples_across_versions)}
