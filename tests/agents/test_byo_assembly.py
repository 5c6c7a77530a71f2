"""Token-exact assembly of recorded completions (hand-built turns) and the agent runner's loading and reward
checks."""

from __future__ import annotations

import numpy as np
import pytest

from asyncrl.engine import GenerationResult
from asyncrl.rollout.agent.recorded import assemble
from asyncrl.serving.agent_runner import AgentLoadError, AgentResultError, load_agent, reward_of


def turn(prompt, response, version=0, finish="stop"):
    return GenerationResult("r", np.array(prompt, np.int32), np.array(response, np.int32),
                            np.full(len(response), -0.5, np.float32), np.full(len(response), version, np.int32), finish)


def test_extension_masks_the_between_tokens_and_a_mismatch_starts_a_sample():
    turns = [turn([1, 2], [3, 4]), turn([1, 2, 3, 4, 9, 9], [5], version=1), turn([7], [8], finish="length"),
             turn([1, 2, 3, 4, 9, 9, 5, 6], [0])]   # back to the first history after a side request
    first, second = assemble("g0/0", turns)
    assert first.ids.tolist() == [3, 4, 9, 9, 5, 6, 0]
    assert first.loss_mask.tolist() == [1, 1, 0, 0, 1, 0, 1]
    assert first.log_probs.tolist() == [-0.5, -0.5, 0, 0, -0.5, 0, -0.5]
    assert first.versions.tolist() == [0, 0, 0, 0, 1, 1, 0]   # in-between tokens carry the version before them
    assert second.prompt_ids.tolist() == [7] and second.ids.tolist() == [8] and second.finish_reason == "length"
    assert [first.request_id, second.request_id] == ["g0/0/0", "g0/0/1"]


def test_reward_of_reads_numbers_and_dicts_and_names_what_is_wrong():
    assert reward_of(1) == (1.0, {})
    assert reward_of({"reward": 0.5, "turns": 3}) == (0.5, {"turns": 3.0})
    with pytest.raises(AgentResultError, match="without a 'reward' key"):
        reward_of({"score": 1.0})
    with pytest.raises(AgentResultError, match=r"\['note'\] are not"):
        reward_of({"reward": 1.0, "note": "x"})
    with pytest.raises(AgentResultError, match="finite number"):
        reward_of(float("nan"))


def test_load_agent_finds_an_async_function_in_a_file_and_names_a_bad_path(tmp_path):
    file = tmp_path / "agent.py"
    file.write_text("async def rollout(client, sample):\n    return 1.0\n\ndef sync_one(client, sample):\n    return 1\n")
    assert load_agent(f"{file}:rollout").__name__ == "rollout"
    with pytest.raises(AgentLoadError, match="no async function 'sync_one'"):
        load_agent(f"{file}:sync_one")
    with pytest.raises(AgentLoadError, match="no file"):
        load_agent(f"{tmp_path / 'missing.py'}:rollout")
    with pytest.raises(AgentLoadError, match="'file.py:function'"):
        load_agent("rollout")


def test_an_agent_file_that_fails_at_import_is_named(tmp_path):
    file = tmp_path / "agent.py"
    file.write_text("import not_a_package_anywhere\n\nasync def rollout(client, sample):\n    return 1.0\n")
    with pytest.raises(AgentLoadError, match=r"agent.py failed to import: ModuleNotFoundError: No module named "
                                             r"'not_a_package_anywhere'"):
        load_agent(f"{file}:rollout")
    with pytest.raises(AgentLoadError, match=r"'no_such_agents:rollout': no_such_agents failed to import"):
        load_agent("no_such_agents:rollout")
