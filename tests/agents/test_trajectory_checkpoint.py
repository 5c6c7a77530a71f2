"""In-flight trajectories survive a checkpoint as data: a parked group's token logs (with an aborted turn),
messages and tool calls come back equal through the fully-async state codec (JSON + safetensors, no pickle)."""

from __future__ import annotations

import numpy as np

from asyncrl.data.records import PromptRecord, TokenizedPrompt
from asyncrl.engine import GenerationResult
from asyncrl.recipes.fully_async.group import Group
from asyncrl.recipes.fully_async.state_codec import decode_state, encode_state
from asyncrl.rollout.agent import ToolCallRecord, Trajectory


def turn(ids, version, reason="stop"):
    ids = np.asarray(ids, np.int32)
    return GenerationResult("g0/0/turn0", np.array([1, 2], np.int32), ids, np.full(ids.size, -0.25, np.float32),
                            np.full(ids.size, version, np.int32), reason)


def test_a_parked_group_with_trajectories_round_trips(tmp_path):
    trajectory = Trajectory.start("g0/0", [1, 2])
    trajectory.append_model(turn([5, 6, 7], 3), {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "calc", "arguments": {"expr": "1*2", "n": [1, None]}}}]})
    trajectory.calls.append(ToolCallRecord(0, "calc", {"expr": "1*2"}, "ok", "2", 0.01, 1700000000.5))
    trajectory.append_tool([8, 9], [{"role": "tool", "content": "2"}])
    trajectory.partial = turn([10], 3, "abort")
    finished = Trajectory.start("g0/1", [1, 2])
    finished.append_model(turn([11], 3))
    finished.finish_reason = "stop"
    prompt = TokenizedPrompt(PromptRecord("p0", [{"role": "user", "content": "1*2="}], "t", "2", {}),
                             np.array([1, 2], np.int32))
    group = Group(prompt, 0, 7, [None, finished.as_result()], trajectories={0: trajectory, 1: finished})
    files = encode_state({"parked": [group], "next_serial": 8})
    restored = decode_state(files["fully_async_state.json"], files["fully_async_state.safetensors"], tmp_path)
    back = restored["parked"][0].trajectories
    assert set(back) == {0, 1}
    for original, copy in ((trajectory, back[0]), (finished, back[1])):
        for name in ("prompt_ids", "ids", "loss_mask", "log_probs", "versions", "turn_ids"):
            assert np.array_equal(getattr(original, name), getattr(copy, name)), name
            assert getattr(original, name).dtype == getattr(copy, name).dtype, name
        assert (copy.messages, copy.calls, copy.num_turns, copy.finish_reason) == \
            (original.messages, original.calls, original.num_turns, original.finish_reason)
    assert back[0].partial.response_ids.tolist() == [10] and back[0].partial.finish_reason == "abort"
    assert back[1].partial is None
