"""A fully-async group's multi-turn slots (asyncrl/recipes/fully_async/agent_slots.py): every slot, the greedy one
included, parked by an abort resumes its turn once and is counted once as a resumed response."""

from __future__ import annotations

import asyncio

import numpy as np
import yaml

from asyncrl.config.rollout_schema import MultiTurnConfig
from asyncrl.data.records import PromptRecord, TokenizedPrompt
from asyncrl.engine import GenerationResult, SamplingParams
from asyncrl.models import build_tiny_model, load_tokenizer
from asyncrl.recipes.fully_async.agent_slots import TrajectorySlots
from asyncrl.recipes.fully_async.group import Group, SlotRequests
from asyncrl.rollout.agent.loop import AgentLoop


class AbortsEachFirstTurn:
    """Answers "42" + EOS with log-prob -0.1; the first call of each request id is cut after one token (an abort
    at a weight sync), the call that resumes it finishes."""

    def __init__(self, tokenizer):
        self.answer = list(tokenizer.encode("42", add_special_tokens=False)) + [tokenizer.eos_token_id]
        self.seen: set[str] = set()

    async def generate(self, requests):
        results = []
        for request in requests:
            done = request.response_ids.size
            new, reason = self.answer[done:], "stop"
            if request.request_id not in self.seen:
                self.seen.add(request.request_id)
                new, reason = new[:1], "abort"
            results.append(GenerationResult(
                request.request_id, request.prompt_ids,
                np.concatenate([request.response_ids, np.asarray(new, np.int32)]),
                np.concatenate([request.response_log_probs, np.full(len(new), -0.1, np.float32)]),
                np.concatenate([request.response_versions, np.zeros(len(new), np.int32)]), reason))
        return results


def test_every_parked_slot_resumes_once_and_is_counted_once(tmp_path):
    tokenizer = load_tokenizer(build_tiny_model(tmp_path / "tiny", hidden_size=32, num_layers=1))
    tools = tmp_path / "tools.yaml"
    tools.write_text(yaml.safe_dump({"tools": [{"class_name": "calculator"}]}))
    agent = AgentLoop.from_config(MultiTurnConfig(enable=True, tool_config_path=str(tools)), tokenizer)
    requests = SlotRequests(seed=1, params=SamplingParams(temperature=1.0, max_new_tokens=16), lengths=None,
                            greedy_params=SamplingParams(temperature=0.0, max_new_tokens=16))
    counters = {"resumed_responses": 0}
    slots = TrajectorySlots(agent, requests, counters)
    prompt = TokenizedPrompt(PromptRecord("p:0", [{"role": "user", "content": "6*7"}], "asyncrl/arithmetic", "42"),
                             list(tokenizer.encode("6*7=", add_special_tokens=False)))
    group = Group(prompt, 0, 0, [None] * 3, num_samples=2)
    rollout = AbortsEachFirstTurn(tokenizer)

    parked = asyncio.run(slots.generate(rollout, group, [0, 1, 2]))
    assert [result.finish_reason for result in parked] == ["abort"] * 3 and counters["resumed_responses"] == 0
    group.results = parked                       # as the rollouter keeps them across the sync
    finished = asyncio.run(slots.generate(rollout, group, [0, 1, 2]))
    assert [result.finish_reason for result in finished] == ["stop"] * 3
    assert all(result.response_ids.tolist() == rollout.answer for result in finished)
    assert counters["resumed_responses"] == 3    # two sampled slots and the greedy one, each once
