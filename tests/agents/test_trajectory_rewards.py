"""Rewards over the whole trajectory, through real scoring processes: a reward function that names `messages`
and `tool_calls` (or takes **kwargs) receives the conversation and the calls; one with verl's four arguments is
called as before; an `async def` one works too."""

from __future__ import annotations

import numpy as np
import pytest

from asyncrl.core.records import Sample
from asyncrl.core.scoring import reward_request
from asyncrl.data.records import PromptRecord, TokenizedPrompt
from asyncrl.engine import GenerationResult
from asyncrl.models import build_tiny_model, load_tokenizer
from asyncrl.rewards import RewardExecutor
from asyncrl.rollout.agent import ToolCallRecord, Trajectory

REWARDS = '''
def sees_trajectory(data_source, solution_str, ground_truth, extra_info=None, messages=None, tool_calls=None):
    ok_calls = [call for call in tool_calls if call["status"] == "ok" and call["output"] == ground_truth]
    return {"score": float(messages[-1]["content"] == ground_truth), "roles": float(len(messages)),
            "good_calls": float(len(ok_calls))}

async def with_kwargs(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return float(len(kwargs["messages"]) == 4 and kwargs["tool_calls"][0]["name"] == "calc")

def four_arguments(data_source, solution_str, ground_truth, extra_info):
    return float(solution_str.endswith(ground_truth))
'''


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    tokenizer = load_tokenizer(build_tiny_model(tmp_path_factory.mktemp("m"), hidden_size=32, num_layers=1))
    trajectory = Trajectory.start("r", [1])
    ids = tokenizer.encode("<tool_call>x</tool_call>", add_special_tokens=False)
    trajectory.append_model(GenerationResult("r", np.array([1], np.int32), np.asarray(ids, np.int32),
                                             np.zeros(len(ids), np.float32), np.zeros(len(ids), np.int32), "stop"),
                            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "calc"}}]})
    trajectory.calls.append(ToolCallRecord(0, "calc", {"expr": "6*7"}, "ok", "42", 0.1))
    trajectory.append_tool(tokenizer.encode("<tool_response>42</tool_response>", add_special_tokens=False),
                           [{"role": "tool", "content": "42"}])
    answer = tokenizer.encode("42", add_special_tokens=False)
    trajectory.append_model(GenerationResult("r", np.array([1], np.int32), np.asarray(answer, np.int32),
                                             np.zeros(len(answer), np.float32), np.zeros(len(answer), np.int32),
                                             "stop"), {"role": "assistant", "content": "42"})
    trajectory.finish_reason = "stop"
    prompt = TokenizedPrompt(PromptRecord("p", [{"role": "user", "content": "6*7="}], "t", "42", {}),
                             np.array([1], np.int32))
    return reward_request(tokenizer, Sample(prompt, 0, 0, trajectory.as_result(), trajectory=trajectory))


@pytest.mark.parametrize("function, expected_score, extra", [
    ("sees_trajectory", 1.0, {"roles": 4.0, "good_calls": 1.0}),
    ("with_kwargs", 1.0, {}),
    ("four_arguments", 1.0, {}),
])
def test_reward_functions_see_the_trajectory_when_they_ask(tmp_path, sample, function, expected_score, extra):
    path = tmp_path / "rewards.py"
    path.write_text(REWARDS)
    executor = RewardExecutor(f"{path}:{function}", timeout_s=30)
    try:
        result, = executor.score([sample])
    finally:
        executor.close()
    assert result.error is None, result.error
    assert result.score == expected_score and result.extra == extra
    assert sample.solution_str.endswith("<tool_response>42</tool_response>42")
