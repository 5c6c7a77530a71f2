"""The turn loop: generate -> parse tool calls -> run them -> append the results -> generate, token-exact.

    agent = AgentLoop.from_config(config.rollout.multi_turn, tokenizer)
    trajectory = Trajectory.start(request.request_id, request.prompt_ids)
    await agent.run(rollout, trajectory, request.params)     # until it finishes, or an abort parks it
    sample_result = trajectory.as_result(); trajectory.loss_mask

A trajectory ends when the model answers without a call ("stop"), after max_assistant_turns model turns
("max_turns"), or when its token budget (`params.max_new_tokens`, tool tokens included) is spent ("length";
tool results that would not fit end it before they are appended). Each turn is a fresh request (its own id
and seed) whose prompt is the trajectory's context so far, exactly the ids sampled and rendered before.

Partial rollout: a turn that comes back aborted (a weight sync) is kept in `trajectory.partial` and `run`
returns with the trajectory unfinished; calling `run` again resumes that turn where it stopped, on whatever
weights the engine holds then (the versions show both). A running tool is never interrupted. The state of
a trajectory is its token log alone: after a checkpoint, `run` picks up where the log ends (a model turn whose
tool results are missing runs its calls again).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, Protocol

from asyncrl.config.rollout_schema import MultiTurnConfig
from asyncrl.engine import GenerationRequest, GenerationResult, SamplingParams
from asyncrl.rollout.agent.parser import ParsedTurn, get_parser
from asyncrl.rollout.agent.template import ToolTurnRenderer, truncate_tokens
from asyncrl.rollout.agent.trajectory import MODEL_TOKEN, Trajectory
from asyncrl.rollout.tools import ToolExecutor, load_tools


class Generator(Protocol):
    async def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]: ...


@dataclass(frozen=True)
class AgentSettings:
    max_assistant_turns: int = 5
    max_tool_response_length: int = 256
    tool_response_truncate_side: str = "middle"


def turn_seed(seed: Optional[int], turn: int) -> Optional[int]:
    """Each turn draws its own numbers, still a function of the request's seed alone."""
    return None if seed is None else (seed * 1_000_003 + turn) % 2**63


class AgentLoop:
    def __init__(self, executor: ToolExecutor, tokenizer: Any, parse: Callable[[str], ParsedTurn],
                 settings: AgentSettings):
        self.executor = executor
        self.tokenizer = tokenizer
        self.parse = parse
        self.settings = settings
        self.renderer = ToolTurnRenderer(tokenizer, executor.schemas())

    @classmethod
    def from_config(cls, multi_turn: MultiTurnConfig, tokenizer: Any) -> "AgentLoop":
        executor = ToolExecutor(load_tools(multi_turn.tool_config_path), multi_turn.tool_timeout_s,
                                multi_turn.max_parallel_calls)
        return cls(executor, tokenizer, get_parser(multi_turn.format), AgentSettings(
            multi_turn.max_assistant_turns, multi_turn.max_tool_response_length,
            multi_turn.tool_response_truncate_side))

    async def run(self, rollout: Generator, trajectory: Trajectory, params: SamplingParams,
                  extra_info: dict[str, Any] | None = None) -> Trajectory:
        """Advances `trajectory` until it finishes or a turn is aborted (then `partial` holds the turn)."""
        budget = params.max_new_tokens
        if self.tools_pending(trajectory):
            await self.run_tools(trajectory, self.last_turn(trajectory), budget, extra_info)
        while trajectory.finish_reason is None:
            if trajectory.num_tokens >= budget:
                trajectory.finish_reason = "length"
                break
            result = (await rollout.generate([self.turn_request(trajectory, params)]))[0]
            if result.finish_reason == "abort":
                trajectory.partial = result
                return trajectory
            trajectory.partial = None
            turn = self.parse(self.decode(result.response_ids))
            trajectory.append_model(result, self.assistant_message(turn))
            if result.finish_reason == "length":
                trajectory.finish_reason = "length"
            elif not turn.num_attempts:
                trajectory.finish_reason = "stop"
            elif trajectory.num_turns >= self.settings.max_assistant_turns:
                trajectory.finish_reason = "max_turns"
            else:
                await self.run_tools(trajectory, turn, budget, extra_info)
        return trajectory

    def turn_request(self, trajectory: Trajectory, params: SamplingParams) -> GenerationRequest:
        """The next turn (or the aborted one, resumed): the context so far, the budget left."""
        remaining = params.max_new_tokens - trajectory.num_tokens
        turn_params = replace(params, max_new_tokens=remaining, seed=turn_seed(params.seed, trajectory.num_turns))
        if trajectory.partial is not None:
            return GenerationRequest.resume(trajectory.partial, turn_params)
        return GenerationRequest(f"{trajectory.request_id}/turn{trajectory.num_turns}", trajectory.context_ids(),
                                 turn_params, routed_experts=trajectory.routed_experts)

    async def run_tools(self, trajectory: Trajectory, turn: ParsedTurn, budget: int,
                        extra_info: dict[str, Any] | None) -> None:
        started_s = time.time()
        records = await self.executor.run(turn, trajectory.request_id, trajectory.num_turns - 1,
                                          trajectory.num_calls(), extra_info)
        trajectory.calls += [replace(record, started_s=started_s) for record in records]
        messages = [{"role": "tool", "content": self.truncate(record.output)} for record in records]
        ids = self.renderer.render(messages)
        if trajectory.num_tokens + len(ids) >= budget:
            trajectory.finish_reason = "length"   # no room for the results and an answer after them
            return
        trajectory.append_tool(ids, messages)

    def truncate(self, text: str) -> str:
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        limit = self.settings.max_tool_response_length
        if len(ids) <= limit:
            return text
        return self.decode(truncate_tokens(ids, limit, self.settings.tool_response_truncate_side))

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    @staticmethod
    def assistant_message(turn: ParsedTurn) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": turn.content}
        if turn.calls:
            message["tool_calls"] = [call.as_message_call() for call in turn.calls]
        return message

    @staticmethod
    def tools_pending(trajectory: Trajectory) -> bool:
        """The log ends with a model turn that asked for tools whose results are missing (a restored checkpoint
        taken while its tools ran)."""
        if trajectory.finish_reason is not None or trajectory.partial is not None or not trajectory.ids.size:
            return False
        return int(trajectory.loss_mask[-1]) == MODEL_TOKEN

    def last_turn(self, trajectory: Trajectory) -> ParsedTurn:
        last = trajectory.turn_ids == trajectory.turn_ids[-1]
        return self.parse(self.decode(trajectory.ids[last & (trajectory.loss_mask == MODEL_TOKEN)]))
