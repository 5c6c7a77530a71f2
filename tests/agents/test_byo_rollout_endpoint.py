"""A training run's recording endpoint: `AgentRunner.pool` serves the openai client on 127.0.0.1 over a rollout
backend's `generate` (here a real AsyncEngine behind that one method). What an agent leaves out of a request is
sampled with the run's settings, what it sends wins; a completion aborted by a weight sync continues on the new
weights as one answer; only the OpenAI routes are served, and only under an open session."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import httpx
import numpy as np
import pytest

from asyncrl.data.records import PromptRecord
from asyncrl.engine import AsyncEngine, EngineConfig, GenerationRequest, LLMEngine, SamplingParams
from asyncrl.models import build_tiny_model, iter_named_tensors, load_model, load_tokenizer, read_config
from asyncrl.serving.agent_runner import AgentRunner
from asyncrl.serving.app import ServerSettings
from asyncrl.serving.recording import RecordingEndpoint, RecordingError
from asyncrl.serving.rollout_served import RolloutServedModel

ENGINE = EngineConfig(device="cpu", cpu_kv_cache_mb=16)
RECORD = PromptRecord("train.jsonl:0", [{"role": "user", "content": "12+34="}], "test", "46")


class EngineGenerator:
    """The one method of the rollout contract the endpoint uses, on a real engine."""

    def __init__(self, engine: AsyncEngine):
        self.engine = engine
        self.requests: list[GenerationRequest] = []

    async def generate(self, requests):
        self.requests += requests
        return list(await asyncio.gather(*(self.engine.generate(request) for request in requests)))


class SyncMidAnswer(EngineGenerator):
    """The first completion stops after `cut` tokens as an abort does; the weights are then pushed again as
    version 1 (the same values), and the endpoint's continuation runs on them."""

    def __init__(self, engine: AsyncEngine, model_folder, cut: int):
        super().__init__(engine)
        self.model_folder = model_folder
        self.cut = cut

    async def generate(self, requests):
        if self.requests:
            return await super().generate(requests)
        [request] = requests
        shortened = replace(request, params=replace(request.params, max_new_tokens=self.cut))
        [partial] = await super().generate([shortened])
        await self.engine.update_weights(iter_named_tensors(load_model(self.model_folder)), 1)
        return [replace(partial, finish_reason="abort")]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("byo_rollout") / "model", family="qwen2", seed=0,
                            max_position_embeddings=128)


def runner_for(model, agent) -> AgentRunner:
    config, _ = read_config(model)
    return AgentRunner(agent, 60.0, 0, load_tokenizer(model), "policy", config.max_position_embeddings,
                       config.vocab_size)


def run(model, agent, generator_of, params):
    async def main():
        engine = AsyncEngine(LLMEngine(model, ENGINE))
        generator = generator_of(engine)
        runner = runner_for(model, agent)
        try:
            async with runner.pool(generator, version=lambda: engine.engine.version) as pool:
                outcome = await pool.run(GenerationRequest("g0/0", np.array([1], np.int32), params), RECORD)
        finally:
            await engine.close()
        return outcome, generator, runner
    return asyncio.run(main())


def test_what_the_agent_leaves_out_is_the_runs_sampling_and_what_it_sends_wins(model):
    replies = []

    async def agent(client, sample):
        messages = list(sample.messages)
        replies.append(await client.chat.completions.create(model="policy", messages=messages))   # all defaulted
        replies.append(await client.chat.completions.create(model="policy", messages=messages, max_tokens=5,
                                                            temperature=1.0, seed=7))
        return 1.0

    defaults = SamplingParams(temperature=0.0, max_new_tokens=3, seed=11)
    outcome, generator, _ = run(model, agent, EngineGenerator, defaults)
    first, second = [request.params for request in generator.requests]
    assert (first.temperature, first.max_new_tokens) == (0.0, 3) and first.seed is not None
    assert (second.temperature, second.max_new_tokens, second.seed) == (1.0, 5, 7)
    assert outcome.error is None and outcome.score == 1.0
    # The recorded turns are what the engine samples for those ids and params, and what the client got.
    engine = LLMEngine(model, ENGINE)
    recorded = [trajectory for trajectory in outcome.trajectories]
    model_ids = [list(trajectory.ids[trajectory.loss_mask == 1]) for trajectory in recorded]
    expected = engine.generate([replace(request, request_id=f"again-{index}")
                                for index, request in enumerate(generator.requests)])
    assert sorted(map(tuple, model_ids)) == sorted(tuple(result.response_ids.tolist()) for result in expected)
    assert len(expected[0].response_ids) <= 3


def test_a_completion_aborted_by_a_weight_sync_continues_on_the_new_weights_as_one_answer(model):
    answers = []

    async def agent(client, sample):
        answers.append(await client.chat.completions.create(model="policy", messages=list(sample.messages),
                                                            extra_body={"return_token_ids": True}))
        return 1.0

    params = SamplingParams(temperature=0.0, max_new_tokens=8, seed=3, ignore_eos=True)
    outcome, generator, _ = run(model, agent, lambda engine: SyncMidAnswer(engine, model, cut=3), params)
    [trajectory] = outcome.trajectories
    assert trajectory.versions.tolist() == [0, 0, 0, 1, 1, 1, 1, 1]   # the sync landed after 3 tokens
    # One answer to the client, equal to an uninterrupted greedy completion (the weights' values did not change).
    [choice] = answers[0].choices
    assert choice.token_ids == trajectory.ids.tolist()
    uninterrupted = LLMEngine(model, ENGINE).generate([GenerationRequest("whole", trajectory.prompt_ids, params)])[0]
    assert trajectory.ids.tolist() == uninterrupted.response_ids.tolist()
    # Two calls to the backend: the fresh request, then its continuation from the 3 tokens it had.
    assert [request.response_ids.size for request in generator.requests] == [0, 3]


def test_only_the_openai_routes_are_served_and_only_under_an_open_session(model):
    seen = {}

    async def agent(client, sample):
        base = str(client.base_url).removesuffix("/v1/").removesuffix("/v1")
        async with httpx.AsyncClient(base_url=base) as http:
            seen["admin"] = await http.post("/update_weights_from_disk", json={"model_path": str(model)})
            seen["no_session"] = await http.post("/v1/chat/completions",
                                                 json={"model": "policy", "messages": list(sample.messages)})
            seen["health"] = await http.get("/health")
        return 0.0

    outcome, generator, runner = run(model, agent, EngineGenerator, SamplingParams(max_new_tokens=2))
    assert seen["admin"].status_code == 404 and "weights, pause and abort belong to the trainer" in \
        seen["admin"].json()["error"]["message"]
    assert seen["no_session"].status_code == 401 and seen["no_session"].json()["error"]["code"] == "invalid_api_key"
    assert seen["health"].status_code == 200
    assert generator.requests == [] and outcome.trajectories == []
    assert runner.counters.metrics()["agent/runs"] == 1.0


def test_a_recording_endpoint_used_wrongly_names_itself(model):
    config, _ = read_config(model)
    served = RolloutServedModel(EngineGenerator(None), load_tokenizer(model), "policy", 128, config.vocab_size)
    with pytest.raises(RecordingError, match="takes the session id as its API key; settings.api_key must be empty"):
        RecordingEndpoint(served, ServerSettings(api_key="secret"))
    endpoint = RecordingEndpoint(served)
    with pytest.raises(RecordingError, match=r"the recording endpoint is not started: await endpoint.start\(\)"):
        endpoint.client(endpoint.open_session())

    async def close_twice():
        await endpoint.start()
        try:
            session = endpoint.open_session()
            assert endpoint.close_session(session) == []
            endpoint.close_session(session)
        finally:
            await endpoint.stop()
    with pytest.raises(RecordingError, match=r"recording session '[0-9a-f]{32}' is not open on http://127.0.0.1:\d+/v1"):
        asyncio.run(close_twice())


def test_max_concurrent_bounds_the_runs_at_once(model):
    running, peak = [0], [0]

    async def agent(client, sample):
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        await asyncio.sleep(0.2)
        running[0] -= 1
        return 1.0

    async def main():
        config, _ = read_config(model)
        runner = AgentRunner(agent, 60.0, 2, load_tokenizer(model), "policy", 128, config.vocab_size)
        async with runner.pool(EngineGenerator(None), version=lambda: 0) as pool:
            return await asyncio.gather(*(pool.run(GenerationRequest(f"g{index}/0", np.array([1], np.int32)), RECORD)
                                          for index in range(6)))

    outcomes = asyncio.run(main())
    assert peak[0] == 2 and [outcome.score for outcome in outcomes] == [1.0] * 6
