"""Metrics of a batch of trajectories, and their tool calls as timeline spans.

    num_turns/mean|max            model turns per trajectory
    tool_calls/mean               calls per trajectory (every attempt, readable or not)
    tool/errors                   calls that failed: the tool raised or returned garbage, an unreadable call, an
                                  unknown tool, a call past max_parallel_calls (counts in the batch)
    tool/timeouts                 calls stopped by their time limit
    tool/latency_s                mean wall time of a call
    response_length/model_tokens/mean, response_length/tool_tokens/mean    tokens by source
    num_turns/versions_across_tools   trajectories whose turns were sampled by more than one policy version
                                      (a weight sync fell inside them: partial rollout, or between turns)
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from asyncrl.rollout.agent.trajectory import Trajectory

ERROR_STATUSES = ("error", "parse_error", "unknown_tool", "skipped")


def agent_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    if not trajectories:
        return {}
    turns = np.array([trajectory.num_turns for trajectory in trajectories], dtype=np.float64)
    calls = [call for trajectory in trajectories for call in trajectory.calls]
    metrics = {
        "num_turns/mean": float(turns.mean()), "num_turns/max": float(turns.max()),
        "tool_calls/mean": float(np.mean([trajectory.num_calls() for trajectory in trajectories])),
        "tool/errors": float(sum(call.status in ERROR_STATUSES for call in calls)),
        "tool/timeouts": float(sum(call.status == "timeout" for call in calls)),
        "response_length/model_tokens/mean": float(np.mean([t.num_model_tokens for t in trajectories])),
        "response_length/tool_tokens/mean": float(np.mean([t.num_tool_tokens for t in trajectories])),
        "num_turns/versions_across_tools": float(sum(spans_versions(trajectory) for trajectory in trajectories)),
    }
    if calls:
        metrics["tool/latency_s"] = float(np.mean([call.latency_s for call in calls]))
    return metrics


def spans_versions(trajectory: Trajectory) -> bool:
    """More than one version among the model's tokens of a trajectory that called a tool."""
    model_versions = trajectory.versions[trajectory.loss_mask == 1]
    return bool(trajectory.calls) and model_versions.size > 0 and int(model_versions.min()) != int(model_versions.max())


def tool_spans(trajectories: Sequence[Trajectory]) -> list[tuple[str, float, float]]:
    """(name, start, end) wall-clock spans of every tool call, for the timeline's "tools" row."""
    return [(f"tool:{call.name or 'unparsed'}", call.started_s, call.started_s + call.latency_s)
            for trajectory in trajectories for call in trajectory.calls if call.started_s]
