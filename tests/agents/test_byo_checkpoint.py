"""A fully-async checkpoint holds the finished agent runs of a parked group: their scored samples (trajectories,
the run's reward and extras) come back equal through the state codec, the group gives exactly those samples, and
its unfinished slot is what generates again after a resume."""

from __future__ import annotations

import numpy as np

from asyncrl.core.byo_agent import agent_samples, run_result
from asyncrl.data.records import PromptRecord, TokenizedPrompt
from asyncrl.engine import GenerationRequest, GenerationResult
from asyncrl.recipes.fully_async.group import Group
from asyncrl.recipes.fully_async.state_codec import decode_state, encode_state
from asyncrl.rollout.agent.recorded import AgentOutcome, assemble


def turn(prompt, response, version):
    return GenerationResult("chatcmpl-1", np.array(prompt, np.int32), np.array(response, np.int32),
                            np.full(len(response), -0.5, np.float32), np.full(len(response), version, np.int32), "stop")


def test_a_parked_group_keeps_its_finished_runs_samples(tmp_path):
    prompt = TokenizedPrompt(PromptRecord("p0", [{"role": "user", "content": "1+2="}], "t", "3", {}),
                             np.array([1, 2], np.int32))
    # Slot 0's run: two tries in one history (versions 4 then 5), then a rewritten history: two samples.
    outcome = AgentOutcome(assemble("g7/0", [turn([1, 2], [5, 6], 4), turn([1, 2, 5, 6, 9], [7], 5),
                                             turn([3], [8], 5)]), 0.5, {"tries": 2.0})
    request = GenerationRequest("g7/0", prompt.prompt_ids)
    group = Group(prompt, 0, 7, [run_result(request, outcome), None], num_samples=2)
    group.agent_samples[0] = agent_samples(prompt, 0, 0, outcome)
    files = encode_state({"parked": [group]})
    back = decode_state(files["fully_async_state.json"], files["fully_async_state.safetensors"], tmp_path)["parked"][0]
    assert not back.is_generated and [slot for slot, result in enumerate(back.results) if result is None] == [1]
    samples = back.samples()
    assert [(sample.sample_index, sample.score, sample.reward_extra) for sample in samples] == \
        [(0, 0.5, {"tries": 2.0}), (0, 0.5, {"tries": 2.0})]
    first, second = samples
    assert first.result.response_ids.tolist() == [5, 6, 9, 7] and first.loss_mask.tolist() == [1, 1, 0, 1]
    assert first.result.response_versions.tolist() == [4, 4, 4, 5]
    assert second.result.prompt_ids.tolist() == [3] and second.trajectory.request_id == "g7/0/1"
