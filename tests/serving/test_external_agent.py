"""A multi-turn tool agent over rollout.backend=external: the agent loop's turns go through HTTP to a real
`asyncrl serve` (the tool-calling tiny model), the tool runs here, and the trajectory is the server's sampled ids
(with the engine's log-probs) plus the rendered tool ids, masked: the same trajectory the in-process engine
gives, so an agent trains alike on either backend."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml

from asyncrl.config import load_config
from asyncrl.config.rollout_schema import MultiTurnConfig
from asyncrl.engine import EngineConfig, GenerationRequest, LLMEngine, SamplingParams
from asyncrl.models import load_tokenizer
from asyncrl.rollout import ExternalRollout, RolloutContext
from asyncrl.rollout.agent.generation import start_agent_generation
from asyncrl.rollout.agent.loop import AgentLoop
from tests.serving.conftest import ADD_TOOL, API_KEY, TOOL_CALL

TOOLS = '''
def add(a):
    return str(a + 1)
'''


@pytest.fixture()
def agent(tool_model, tmp_path):
    (tmp_path / "my_tools.py").write_text(TOOLS)
    path = tmp_path / "tools.yaml"
    path.write_text(yaml.safe_dump({"tools": [{"class_name": "my_tools.py:add", "tool_schema": ADD_TOOL}]}))
    return AgentLoop.from_config(MultiTurnConfig(enable=True, tool_config_path=str(path), max_assistant_turns=2),
                                 load_tokenizer(tool_model))


def test_a_tool_agent_over_an_external_server_gives_the_engines_trajectory(tool_model, server, agent, tmp_path,
                                                                           monkeypatch):
    tokenizer = load_tokenizer(tool_model)
    tools_turn = {"role": "system", "content": "<tools>\n" + json.dumps(ADD_TOOL) + "\n</tools>"}
    prompt = tokenizer.apply_chat_template([tools_turn, {"role": "user", "content": "add 3"}],
                                           add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=160)
    requests = [GenerationRequest(f"r/{index}", prompt_ids, greedy) for index in range(2)]
    monkeypatch.setenv("ASYNCRL_API_KEY", API_KEY)
    config = load_config(None, [f"model.path={tool_model}", "rollout.backend=external",
                                f"rollout.external.urls=[{server.base_url}]", "rollout.external.timeout_s=60",
                                f"trainer.output_dir={tmp_path / 'run'}", "trainer.device=cpu"])
    rollout = ExternalRollout(RolloutContext(config, None, [], torch.float32, lambda: ("127.0.0.1", 0)))

    pending = start_agent_generation(rollout, agent, requests, [{}, {}], timeout_s=120)
    results = pending.results()
    trajectory = pending.trajectories[0]

    # The model called the tool; the tool ran here and its result came back rendered, masked, never sampled.
    assert [(call.name, call.arguments, call.status, call.output) for call in trajectory.calls][0] == (
        "add", {"a": 2}, "ok", "3")
    kinds = [kind for kind, _, _ in trajectory.segments()]
    assert kinds == [1, 0, 1] and trajectory.num_turns == 2
    assert trajectory.finish_reason == "length"   # the second turn calls again and runs into the token budget
    first_end = trajectory.segments()[0][2]
    assert tokenizer.decode(trajectory.ids[:first_end].tolist(), skip_special_tokens=True) == TOOL_CALL
    tool_start, tool_end = trajectory.segments()[1][1:]
    rendered = tokenizer.encode("<|user|><tool_response>3</tool_response><|assistant|>", add_special_tokens=False)
    assert trajectory.ids[tool_start:tool_end].tolist() == rendered
    assert set(trajectory.loss_mask[tool_start:tool_end].tolist()) == {0}
    assert set(trajectory.versions[trajectory.loss_mask == 1].tolist()) == {0}
    assert results[0].response_ids.tolist() == trajectory.ids.tolist()

    # Each model turn is what the in-process engine samples and scores for the same context (greedy).
    engine = LLMEngine(tool_model, EngineConfig(device="cpu", cpu_kv_cache_mb=16))
    for turn in range(trajectory.num_turns):
        positions = np.flatnonzero((trajectory.turn_ids == turn) & (trajectory.loss_mask == 1))
        context = np.concatenate([trajectory.prompt_ids, trajectory.ids[:positions[0]]])
        [expected] = engine.generate([GenerationRequest(f"e/{turn}", context, SamplingParams(
            temperature=0.0, max_new_tokens=len(positions)))])
        assert trajectory.ids[positions].tolist() == expected.response_ids.tolist()
        np.testing.assert_allclose(trajectory.log_probs[positions], expected.response_log_probs, rtol=0, atol=1e-5)
    assert pending.trajectories[1].ids.tolist() == trajectory.ids.tolist()   # greedy: both samples alike
