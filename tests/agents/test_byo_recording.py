"""Bring your own agent through the real HTTP path: an agent written with the official `openai` client talks to a
recording endpoint (uvicorn on 127.0.0.1, in this process, over a tiny model built here); the recorded tokens are
the sampled tokens position by position, a continued history is one trajectory with the in-between tokens
masked, a rewritten history is a second sample sharing the reward, and the agent's failures score 0 and are
counted."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest

from asyncrl.data.records import PromptRecord
from asyncrl.engine import EngineConfig, GenerationRequest, LLMEngine, SamplingParams
from asyncrl.models import build_tiny_model
from asyncrl.rollout.agent.trajectory import MODEL_TOKEN, TOOL_TOKEN
from asyncrl.rollout.agent.recorded import AgentCounters
from asyncrl.serving.agent_runner import run_agent
from asyncrl.serving.recording import RecordingEndpoint
from asyncrl.serving.served_model import ServedModel
from asyncrl.train.sft import SFTSettings, run_sft

ENGINE = EngineConfig(device="cpu", cpu_kv_cache_mb=16)
RECORD = PromptRecord("train.jsonl:0", [{"role": "user", "content": "hello"}], "test", "7")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A tiny model SFT-warm-started to reply "ok" (then EOS) to any chat, so a greedy reply re-renders to the ids
    it sampled (an untrained one repeats the template's special tokens, which the reply's text drops)."""
    root = tmp_path_factory.mktemp("byo")
    raw = build_tiny_model(root / "raw", family="qwen2", seed=0, max_position_embeddings=256)
    history = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "ok"}]
    rows = [{"prompt": [*history[:2 * (index % 3)], {"role": "user", "content": f"n{index}"}],
             "reward_model": {"ground_truth": "ok"}} for index in range(12)]
    data = root / "ok.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return run_sft(raw, [str(data)], root / "sft", SFTSettings(epochs=30, batch_size=12, lr=1e-2, seed=0,
                                                                warmup_steps=2))


def run_with_endpoint(model, agent, timeout_s=60.0):
    """(outcome, the agent's own view of its turns) of one agent run against a fresh endpoint."""
    async def main():
        served = ServedModel.load(model, ENGINE)
        endpoint = RecordingEndpoint(served)
        await endpoint.start()
        try:
            seen = []
            outcome = await run_agent(lambda client, record: agent(client, record, seen), endpoint, RECORD, "g0/0",
                                      timeout_s)
            return outcome, seen
        finally:
            await endpoint.stop()
            await served.close()
    return asyncio.run(main())


async def chat_turn(client, messages, seed, temperature=1.0):
    model_name = (await client.models.list()).data[0].id
    answer = await client.chat.completions.create(model=model_name, messages=messages, max_tokens=6, seed=seed,
                                                  temperature=temperature, extra_body={"return_token_ids": True})
    return answer.choices[0]


async def three_turn_agent(client, record, seen, temperature=0.0):
    """A chat that keeps its history: each reply is appended, then a user follow-up."""
    messages = list(record.messages)
    for turn in range(3):
        choice = await chat_turn(client, messages, seed=10 + turn, temperature=temperature)
        seen.append(choice)
        messages += [{"role": "assistant", "content": choice.message.content}, {"role": "user", "content": f"n{turn}"}]
    return {"reward": 1.0, "turns": 3.0}


def test_recorded_tokens_are_the_sampled_tokens_and_match_the_engine(model):
    async def agent(client, record, seen):
        return await three_turn_agent(client, record, seen, temperature=1.0)

    outcome, seen = run_with_endpoint(model, agent)
    engine = LLMEngine(model, ENGINE)
    turns = [turn for trajectory in outcome.trajectories for turn in range(trajectory.num_turns)]
    assert len(turns) == 3 and outcome.score == 1.0 and outcome.extra == {"turns": 3.0}
    recorded_model_ids = np.concatenate([trajectory.ids[trajectory.loss_mask == MODEL_TOKEN]
                                         for trajectory in outcome.trajectories])
    sampled = np.concatenate([np.asarray(choice.token_ids) for choice in seen])
    np.testing.assert_array_equal(recorded_model_ids, sampled)   # position by position, over every turn
    recorded_log_probs = np.concatenate([trajectory.log_probs[trajectory.loss_mask == MODEL_TOKEN]
                                         for trajectory in outcome.trajectories])
    np.testing.assert_allclose(recorded_log_probs, np.concatenate([choice.token_logprobs for choice in seen]),
                               rtol=0, atol=1e-6)
    for index, choice in enumerate(seen):   # and they are what the engine samples for those prompt ids and seed
        params = SamplingParams(temperature=1.0, max_new_tokens=6, seed=10 + index)
        expected = engine.generate([GenerationRequest(f"local-{index}", choice.prompt_token_ids, params)])[0]
        assert choice.token_ids == expected.response_ids.tolist()
        np.testing.assert_allclose(choice.token_logprobs, expected.response_log_probs, rtol=0, atol=1e-5)


def test_a_kept_history_is_one_trajectory_with_the_in_between_tokens_masked(model):
    outcome, seen = run_with_endpoint(model, three_turn_agent)
    assert len(outcome.trajectories) == 1
    trajectory = outcome.trajectories[0]
    assert trajectory.prompt_ids.tolist() == seen[0].prompt_token_ids
    # Each later prompt is the trajectory's context up to that turn: prompt, replies and in-between tokens.
    context = trajectory.context_ids().tolist()
    for choice in seen[1:]:
        assert context[:len(choice.prompt_token_ids)] == choice.prompt_token_ids
    masks = [mask for mask, _, _ in trajectory.segments()]
    assert masks == [MODEL_TOKEN, TOOL_TOKEN, MODEL_TOKEN, TOOL_TOKEN, MODEL_TOKEN]
    segments = trajectory.segments()
    for (mask, start, end), choice in zip(segments[::2], seen):
        assert trajectory.ids[start:end].tolist() == choice.token_ids
    for _, start, end in segments[1::2]:   # the template's markup and the user's follow-up: never trained
        assert np.all(trajectory.log_probs[start:end] == 0)
    assert trajectory.num_model_tokens == sum(len(choice.token_ids) for choice in seen)


def test_a_rewritten_history_becomes_a_second_sample_sharing_the_reward(model):
    async def agent(client, record, seen):
        first = await chat_turn(client, list(record.messages), seed=1, temperature=0.0)
        seen.append(first)
        # The agent summarises: the next request drops the first exchange, so its prompt extends nothing.
        second = await chat_turn(client, [{"role": "user", "content": "summary"}], seed=2, temperature=0.0)
        seen.append(second)
        return 0.5

    outcome, seen = run_with_endpoint(model, agent)
    assert len(outcome.trajectories) == 2 and outcome.score == 0.5
    for trajectory, choice in zip(outcome.trajectories, seen):
        assert trajectory.prompt_ids.tolist() == choice.prompt_token_ids
        assert trajectory.ids.tolist() == choice.token_ids
        assert np.all(trajectory.loss_mask == MODEL_TOKEN)
    assert [trajectory.request_id for trajectory in outcome.trajectories] == ["g0/0/0", "g0/0/1"]


def test_an_agent_exception_or_timeout_scores_zero_and_is_counted(model):
    async def failing(client, record, seen):
        seen.append(await chat_turn(client, list(record.messages), seed=1))
        raise RuntimeError("the tool crashed")

    async def slow(client, record, seen):
        await asyncio.sleep(30)
        return 1.0

    async def blocking(client, record, seen):
        """Its first turn, then a synchronous sleep that holds its event loop (the case `wait_for` on the run's
        own loop could never end), then a turn that must not train."""
        seen.append(await chat_turn(client, list(record.messages), seed=2))
        time.sleep(8)
        seen.append(await chat_turn(client, list(record.messages), seed=3))
        return 1.0

    counters = AgentCounters()
    failed, seen = run_with_endpoint(model, failing)
    counters.add(failed)
    timed_out, _ = run_with_endpoint(model, slow, timeout_s=0.5)
    counters.add(timed_out)
    blocked, blocked_seen = run_with_endpoint(model, blocking, timeout_s=3)
    counters.add(blocked)
    assert failed.score == 0.0 and failed.error == "RuntimeError: the tool crashed" and not failed.is_timeout
    assert len(failed.trajectories) == 1 and failed.trajectories[0].ids.tolist() == seen[0].token_ids
    assert timed_out.score == 0.0 and timed_out.is_timeout and timed_out.trajectories == []
    assert "blocked its event loop" not in timed_out.error
    assert blocked.score == 0.0 and blocked.is_timeout
    assert blocked.error.startswith("the agent ran past rollout.agent.timeout_s = 3 s and blocked its event loop")
    assert [trajectory.ids.tolist() for trajectory in blocked.trajectories] == [blocked_seen[0].token_ids]
    assert counters.metrics() == {"agent/runs": 3.0, "agent/errors": 1.0, "agent/timeouts": 2.0,
                                  "agent/samples": 2.0, "agent/samples_across_versions": 0.0}
