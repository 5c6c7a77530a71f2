"""A multi-turn trajectory: an append-only token log, never re-tokenized.

    trajectory = Trajectory.start("g3/0", prompt_ids)
    trajectory.append_model(turn_result)               # the engine's ids, log-probs and versions, as sampled
    trajectory.append_tool(tool_ids, messages=[...])   # the rendered tool results: loss mask 0
    result = trajectory.as_result()                    # a GenerationResult: response = every token after the prompt
    trajectory.loss_mask                               # (R,) 1 on model tokens, 0 on tool tokens

The response of a trajectory is the model's turns and the tool results between them, in the order they
happened, as parallel arrays: ids, loss mask, log-probs, policy versions, turn index. The trained ids are
exactly the sampled ids plus the rendered tool ids. Messages (assistant turns with their parsed calls, tool
results) are a derived view for rewards and logs; the tokens are the truth. Every field is a number, a
string, a list/dict of those or a numpy array, so a checkpoint can hold trajectories in flight.

A tool token carries log-prob 0 and the version of the model token before it (the policy whose call it
answers), so staleness over all tokens is unchanged by tool tokens; it never trains (mask 0).

On a mixture-of-experts engine the trajectory keeps one routing record over prompt and response (`routed_experts`,
the engine's per-position experts): each turn's request carries the record so far, the engine appends the
positions it computes first (tool tokens included, in the next turn's prefill), and a position keeps the experts it
had when the tokens after it were sampled, also across a weight sync between turns, so routing replay reproduces
every turn's sampling.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from asyncrl.engine import GenerationResult

MODEL_TOKEN = 1   # loss mask value of a token the model sampled
TOOL_TOKEN = 0    # ... and of a token the environment rendered (tool results, turn markup)

TOOL_CALL_STATUSES = ("ok", "error", "timeout", "parse_error", "unknown_tool", "skipped")


@dataclass(frozen=True)
class ToolCallRecord:
    """One call of a trajectory and how it went: status is "ok", "error" (the tool raised or returned what is
    not text), "timeout", "parse_error" (the model's call could not be read), "unknown_tool", or "skipped"
    (over rollout.multi_turn.max_parallel_calls)."""
    turn: int
    name: str
    arguments: dict[str, Any]
    status: str
    output: str
    latency_s: float = 0.0
    started_s: float = 0.0       # wall clock when it started (timeline spans)

    def __post_init__(self) -> None:
        if self.status not in TOOL_CALL_STATUSES:
            raise ValueError(f"tool call status must be one of {TOOL_CALL_STATUSES}, got {self.status!r}")


def _empty(dtype) -> np.ndarray:
    return np.zeros(0, dtype=dtype)


@dataclass(eq=False)
class Trajectory:
    """prompt_ids (P,) int32; ids (R,) int32, loss_mask (R,) int8, log_probs (R,) float32, versions (R,) int32,
    turn_ids (R,) int32: the response so far. `messages` holds the assistant turns and tool messages after
    the prompt; `calls` every tool call. `finish_reason` is None while the trajectory runs, then "stop" (the
    model answered without a call), "length" (the token budget), "max_turns" or "abort" (not finished:
    partial rollout continues it). `partial` holds a model turn cut off by an abort: partial rollout resumes
it from there."""
    request_id: str
    prompt_ids: np.ndarray
    ids: np.ndarray = field(default_factory=lambda: _empty(np.int32))
    loss_mask: np.ndarray = field(default_factory=lambda: _empty(np.int8))
    log_probs: np.ndarray = field(default_factory=lambda: _empty(np.float32))
    versions: np.ndarray = field(default_factory=lambda: _empty(np.int32))
    turn_ids: np.ndarray = field(default_factory=lambda: _empty(np.int32))
    messages: list[dict[str, Any]] = field(default_factory=list)
    calls: list[ToolCallRecord] = field(default_factory=list)
    num_turns: int = 0                   # model turns appended
    num_prefill_tokens: int = 0          # over its model turns: prefill tokens asked for, found cached,
    num_cached_tokens: int = 0           # and preemptions (the engine's counts: GenerationResult)
    num_preemptions: int = 0
    finish_reason: Optional[str] = None
    partial: Optional[GenerationResult] = None   # a model turn aborted mid-generation (partial rollout resumes it)
    routed_experts: Optional[np.ndarray] = None  # (n, L, k): an MoE engine's routing record of the first n positions

    @classmethod
    def start(cls, request_id: str, prompt_ids) -> "Trajectory":
        return cls(request_id, np.ascontiguousarray(np.asarray(prompt_ids, dtype=np.int32).reshape(-1)))

    # ---- appending ------------------------------------------------------------------------------------
    def append_model(self, turn: GenerationResult, message: Optional[dict[str, Any]] = None) -> None:
        """The model's turn exactly as sampled (ids, log-probs, versions), mask 1; `message` is its assistant
        message (content and parsed tool calls)."""
        size = turn.num_response_tokens
        self.num_prefill_tokens += turn.num_prefill_tokens
        self.num_cached_tokens += turn.num_cached_tokens
        self.num_preemptions += turn.num_preemptions
        if turn.routed_experts is not None:  # the turn's request carried the record so far: the engine extended it
            self.routed_experts = turn.routed_experts
        self._extend(turn.response_ids, np.full(size, MODEL_TOKEN, np.int8), turn.response_log_probs,
                     turn.response_versions, self.num_turns)
        self.num_turns += 1
        if message is not None:
            self.messages.append(message)

    def append_tool(self, ids, messages: list[dict[str, Any]] = ()) -> None:
        """Environment tokens (the rendered tool results and the markup up to the next assistant turn), mask 0,
        log-prob 0, stamped with the version of the last model token; `messages` are the tool messages."""
        ids = np.asarray(ids, dtype=np.int32).reshape(-1)
        version = int(self.versions[-1]) if self.versions.size else 0
        self._extend(ids, np.full(ids.size, TOOL_TOKEN, np.int8), np.zeros(ids.size, np.float32),
                     np.full(ids.size, version, np.int32), max(self.num_turns - 1, 0))
        self.messages.extend(messages)

    def _extend(self, ids, mask, log_probs, versions, turn: int) -> None:
        self.ids = np.concatenate([self.ids, np.asarray(ids, dtype=np.int32)])
        self.loss_mask = np.concatenate([self.loss_mask, mask])
        self.log_probs = np.concatenate([self.log_probs, np.asarray(log_probs, dtype=np.float32)])
        self.versions = np.concatenate([self.versions, np.asarray(versions, dtype=np.int32)])
        self.turn_ids = np.concatenate([self.turn_ids, np.full(len(mask), turn, np.int32)])

    # ---- views ----------------------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return int(self.ids.size)

    @property
    def num_model_tokens(self) -> int:
        return int((self.loss_mask == MODEL_TOKEN).sum())

    @property
    def num_tool_tokens(self) -> int:
        return self.num_tokens - self.num_model_tokens

    def context_ids(self) -> np.ndarray:
        """(P + R,) int32: what the model sees before its next turn."""
        return np.concatenate([self.prompt_ids, self.ids])

    def segments(self) -> list[tuple[int, int, int]]:
        """(loss mask value, start, end) of each run of model or tool tokens, in order."""
        if not self.ids.size:
            return []
        edges = np.flatnonzero(np.diff(self.loss_mask)) + 1
        starts = [0, *edges.tolist()]
        ends = [*edges.tolist(), self.num_tokens]
        return [(int(self.loss_mask[start]), start, end) for start, end in zip(starts, ends)]

    def as_result(self) -> GenerationResult:
        """The whole trajectory as one engine result: the prompt, then every token after it. Finish reason
        "abort" while unfinished, "length" when the budget ended it, else "stop"."""
        reason = {"length": "length", None: "abort", "abort": "abort"}.get(self.finish_reason, "stop")
        return GenerationResult(self.request_id, self.prompt_ids.copy(), self.ids.copy(), self.log_probs.copy(),
                                self.versions.copy(), reason, routed_experts=self.routed_experts,
                                num_prefill_tokens=self.num_prefill_tokens, num_cached_tokens=self.num_cached_tokens,
                                num_preemptions=self.num_preemptions)

    def num_calls(self, *statuses: str) -> int:
        """Tool calls of the trajectory (with one of `statuses`, when given)."""
        return sum(1 for call in self.calls if not statuses or call.status in statuses)
