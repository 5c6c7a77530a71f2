"""The trajectory token log: model tokens as sampled (mask 1), tool tokens rendered (mask 0), in order."""

from __future__ import annotations

import pickle

import numpy as np

from asyncrl.engine import GenerationResult
from asyncrl.rollout.agent import ToolCallRecord, Trajectory


def turn(ids, version, reason="stop"):
    ids = np.asarray(ids, dtype=np.int32)
    return GenerationResult("t", np.array([1], np.int32), ids, -0.5 * np.arange(1, ids.size + 1, dtype=np.float32),
                            np.full(ids.size, version, np.int32), reason)


def test_appends_keep_sampled_and_rendered_ids_position_by_position():
    trajectory = Trajectory.start("g0/1", [7, 8, 9])
    trajectory.append_model(turn([10, 11, 12], version=3), {"role": "assistant", "content": "a"})
    trajectory.append_tool([20, 21], [{"role": "tool", "content": "r"}])
    trajectory.append_model(turn([13, 14], version=4), {"role": "assistant", "content": "b"})
    assert trajectory.ids.tolist() == [10, 11, 12, 20, 21, 13, 14]
    assert trajectory.loss_mask.tolist() == [1, 1, 1, 0, 0, 1, 1]
    assert trajectory.log_probs.tolist() == [-0.5, -1.0, -1.5, 0.0, 0.0, -0.5, -1.0]
    assert trajectory.versions.tolist() == [3, 3, 3, 3, 3, 4, 4]   # a tool token carries its call's version
    assert trajectory.turn_ids.tolist() == [0, 0, 0, 0, 0, 1, 1]
    assert trajectory.segments() == [(1, 0, 3), (0, 3, 5), (1, 5, 7)]
    assert (trajectory.num_model_tokens, trajectory.num_tool_tokens, trajectory.num_turns) == (5, 2, 2)
    assert trajectory.context_ids().tolist() == [7, 8, 9, 10, 11, 12, 20, 21, 13, 14]
    assert [message["role"] for message in trajectory.messages] == ["assistant", "tool", "assistant"]


def test_as_result_reports_unfinished_as_abort_and_budget_as_length():
    trajectory = Trajectory.start("r", [1, 2])
    trajectory.append_model(turn([5], 0))
    assert trajectory.as_result().finish_reason == "abort"
    trajectory.finish_reason = "max_turns"
    result = trajectory.as_result()
    assert result.finish_reason == "stop" and result.response_ids.tolist() == [5]
    assert result.prompt_ids.tolist() == [1, 2] and result.request_id == "r"
    trajectory.finish_reason = "length"
    assert trajectory.as_result().finish_reason == "length"


def test_a_trajectory_is_plain_data_that_pickles_and_counts_calls_by_status():
    trajectory = Trajectory.start("r", [1])
    trajectory.append_model(turn([5, 6], 2))
    trajectory.calls += [ToolCallRecord(0, "calc", {"expr": "1+1"}, "ok", "2", 0.01),
                         ToolCallRecord(0, "calc", {}, "timeout", "timed out", 5.0)]
    copy = pickle.loads(pickle.dumps(trajectory))
    assert copy.ids.tolist() == [5, 6] and copy.calls == trajectory.calls
    assert (copy.num_calls(), copy.num_calls("ok"), copy.num_calls("timeout", "error")) == (2, 1, 1)
