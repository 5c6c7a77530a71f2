"""`asyncrl serve` driven by the official `openai` client over real HTTP (a uvicorn process on 127.0.0.1): completions
and chat, streamed or not, n > 1, log-probs, tool calls, the RL fields; every sampled token and log-prob equals
what the engine samples in process for the same prompt ids and seed."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json

import httpx
import numpy as np
import openai
import pytest

from asyncrl.engine import EngineConfig, GenerationRequest, LLMEngine, SamplingParams
from asyncrl.models import load_tokenizer
from tests.serving.conftest import ADD_TOOL, API_KEY, TOOL_CALL


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def engine(tool_model):
    return LLMEngine(tool_model, EngineConfig(device="cpu", cpu_kv_cache_mb=16))


@pytest.fixture(scope="module")
def model_name(client):
    return client.models.list().data[0].id


def engine_sample(engine, prompt_ids, seed, max_tokens, temperature=1.0):
    params = SamplingParams(temperature=temperature, max_new_tokens=max_tokens, seed=seed)
    return engine.generate([GenerationRequest(f"local-{seed}", prompt_ids, params)])[0]


def assert_same_as_engine(choice, expected):
    assert choice.token_ids == expected.response_ids.tolist()
    np.testing.assert_allclose(choice.token_logprobs, expected.response_log_probs, rtol=0, atol=1e-5)


def test_completion_from_token_ids_equals_the_engine_for_each_seed_of_n(client, engine, model_name):
    prompt_ids = [5, 17, 30, 42, 9]
    answer = client.completions.create(model=model_name, prompt=prompt_ids, max_tokens=12, n=3, seed=7, logprobs=1,
                                       extra_body={"return_token_ids": True})
    assert [choice.index for choice in answer.choices] == [0, 1, 2]
    for choice in answer.choices:
        assert choice.prompt_token_ids == prompt_ids
        assert_same_as_engine(choice, engine_sample(engine, prompt_ids, seed=7 + choice.index, max_tokens=12))
        assert choice.logprobs.token_logprobs == choice.token_logprobs   # the OpenAI field holds the same numbers
        assert set(choice.token_versions) == {answer.weight_version}
    assert len({tuple(choice.token_ids) for choice in answer.choices}) > 1   # distinct seeds, distinct samples
    assert answer.usage.completion_tokens == sum(len(choice.token_ids) for choice in answer.choices)


def test_text_prompt_stream_equals_the_unstreamed_answer(client, model_name):
    common = dict(model=model_name, prompt="the weather", max_tokens=10, seed=3)
    whole = client.completions.create(**common)
    events = list(client.completions.create(**common, stream=True, stream_options={"include_usage": True}))
    streamed = "".join(event.choices[0].text for event in events if event.choices)
    assert streamed == whole.choices[0].text
    assert [event.choices[0].finish_reason for event in events if event.choices][-1] == whole.choices[0].finish_reason
    assert events[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_chat_renders_the_template_and_samples_what_the_engine_samples(client, engine, model_name, tool_model):
    messages = [{"role": "user", "content": "hello there"}]
    answer = client.chat.completions.create(model=model_name, messages=messages, max_tokens=16, seed=11,
                                            logprobs=True, top_logprobs=1, extra_body={"return_token_ids": True})
    choice = answer.choices[0]
    tokenizer = load_tokenizer(tool_model)
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert choice.prompt_token_ids == tokenizer.encode(rendered, add_special_tokens=False)
    assert_same_as_engine(choice, engine_sample(engine, choice.prompt_token_ids, seed=11, max_tokens=16))
    assert [entry.logprob for entry in choice.logprobs.content] == choice.token_logprobs
    assert choice.message.content == tokenizer.decode(choice.token_ids, skip_special_tokens=True)


def test_the_model_calls_the_offered_tool_and_the_reply_is_parsed(client, model_name):
    answer = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "add 3"}],
                                            tools=[ADD_TOOL], temperature=0, max_tokens=120,
                                            extra_body={"return_token_ids": True})
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2}
    assert choice.message.content is None   # nothing was written besides the call
    # The same request with tool_choice "none" returns the sampled text itself.
    plain = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "add 3"}],
                                           tools=[ADD_TOOL], tool_choice="none", temperature=0, max_tokens=120)
    assert plain.choices[0].message.content == TOOL_CALL and not plain.choices[0].message.tool_calls
    # A reply that carries the call back (arguments as a JSON string) and a tool result render again.
    history = [{"role": "user", "content": "add 3"},
               {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
               {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    follow_up = client.chat.completions.create(model=model_name, messages=history, tools=[ADD_TOOL],
                                               temperature=0, max_tokens=4)
    assert follow_up.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_streamed_tool_calls_arrive_whole(client, model_name):
    events = list(client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "add 5"}], tools=[ADD_TOOL],
        temperature=0, max_tokens=120, stream=True))
    calls = [call for event in events for call in (event.choices[0].delta.tool_calls or [])]
    assert [(call.function.name, json.loads(call.function.arguments)) for call in calls] == \
        [("add", {"a": 2})]
    assert events[-1].choices[0].finish_reason == "tool_calls"


def test_a_stop_string_cuts_text_and_tokens_together(client, model_name):
    full = client.completions.create(model=model_name, prompt=[5, 6, 7], max_tokens=20, seed=5,
                                     extra_body={"return_token_ids": True}).choices[0]
    stop = full.text[3:5]
    assert len(full.text) >= 6 and stop
    cut = client.completions.create(model=model_name, prompt=[5, 6, 7], max_tokens=20, seed=5, stop=[stop],
                                    extra_body={"return_token_ids": True}).choices[0]
    assert cut.finish_reason == "stop" and cut.text == full.text[:full.text.index(stop)]
    assert cut.token_ids == full.token_ids[:len(cut.token_ids)] and len(cut.token_ids) < len(full.token_ids)


def test_sixty_four_concurrent_requests_are_all_answered(server, model_name):
    async def load() -> list:
        async with openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0,
                                      timeout=120) as concurrent:
            calls = [concurrent.completions.create(model=model_name, prompt=[3 + index % 50, 8], max_tokens=8,
                                                   seed=index, extra_body={"return_token_ids": True})
                     for index in range(64)]
            return await asyncio.wait_for(asyncio.gather(*calls), timeout=180)

    answers = asyncio.run(load())
    assert len(answers) == 64
    for answer in answers:
        choice = answer.choices[0]
        assert choice.finish_reason in ("stop", "length") and 1 <= len(choice.token_ids) <= 8
    assert len({answer.id for answer in answers}) == 64


def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(client, server, model_name):
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    malformed = httpx.post(server.base_url + "/v1/completions", content=b'{"model": ', headers=headers, timeout=30)
    assert malformed.status_code == 400
    assert set(malformed.json()["error"]) == {"message", "type", "param", "code"}
    assert "not valid JSON" in malformed.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError, match="model 'no-such-model' is not served here") as unknown:
        client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
    assert unknown.value.body["code"] == "model_not_found" and unknown.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError, match="maximum context length is 256 tokens") as too_long:
        client.completions.create(model=model_name, prompt=[5] * 600, max_tokens=2)
    assert too_long.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.UnprocessableEntityError, match="max_tokens") as negative:
        client.completions.create(model=model_name, prompt="x", max_tokens=-3)
    assert negative.value.body["param"] == "max_tokens"
    oversized = httpx.post(server.base_url + "/v1/completions", headers=headers, timeout=30,
                           content=json.dumps({"model": model_name, "prompt": "x" * 200_000}).encode())
    assert oversized.status_code == 413 and "limit of 100000" in oversized.json()["error"]["message"]
    answer = client.completions.create(model=model_name, prompt="still here", max_tokens=3)
    assert answer.choices[0].finish_reason in ("stop", "length")


def test_the_api_key_is_asked_everywhere_but_health(server, model_name):
    keyless = openai.OpenAI(base_url=server.base_url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="missing or wrong API key"):
        keyless.completions.create(model=model_name, prompt="x", max_tokens=2)
    assert httpx.get(server.base_url + "/metrics", timeout=10).status_code == 401
    assert httpx.post(server.base_url + "/pause_generation", timeout=10).status_code == 401
    assert httpx.get(server.base_url + "/health", timeout=10).json()["status"] == "ok"


def chunked(total_bytes: int, chunk_bytes: int = 65536):
    """A body sent without Content-Length (chunked transfer encoding), `total_bytes` long."""
    sent = 0
    while sent < total_bytes:
        yield b"x" * min(chunk_bytes, total_bytes - sent)
        sent += chunk_bytes


def send_chunked(server, total_bytes: int) -> int | str:
    """The status a chunked body gets, or the transport error where the server closed while it was sent."""
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    try:
        return httpx.post(server.base_url + "/v1/completions", content=chunked(total_bytes), headers=headers,
                          timeout=60).status_code
    except httpx.TransportError as error:
        return type(error).__name__


def test_a_body_is_bounded_by_the_bytes_read_and_health_answers_under_a_flood(server, model_name):
    """A chunked body (no Content-Length) past the limit gets 413, as one with a header does; a flood of 8 such
    bodies of 4 MB (40x the limit) at once leaves the server's memory where it was and /health answering."""
    import psutil   # Ray's bundled copy, on the path once Ray is imported (the server's own imports)
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    over = httpx.post(server.base_url + "/v1/completions", headers=headers, timeout=30,
                      content=(json.dumps({"model": model_name, "prompt": "x" * 150_000}).encode()
                               for _ in range(1)))
    assert over.status_code == 413 and "more than 100000 bytes" in over.json()["error"]["message"]
    memory_before = psutil.Process(server.process.pid).memory_info().rss
    with concurrent.futures.ThreadPoolExecutor(max_workers=9) as pool:
        flood = [pool.submit(send_chunked, server, 4 * 2**20) for _ in range(8)]
        health = [httpx.get(server.base_url + "/health", timeout=10) for _ in range(5)]
        outcomes = [future.result() for future in flood]
    assert all(response.status_code == 200 for response in health)
    assert all(outcome in (413, "WriteError", "RemoteProtocolError", "ReadError") for outcome in outcomes), outcomes
    assert 413 in outcomes
    growth = psutil.Process(server.process.pid).memory_info().rss - memory_before
    assert growth < 100 * 2**20, f"the server grew by {growth / 2**20:.0f} MiB"


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_token_budget_past_the_model_context_is_refused(client, model_name, field):
    if field == "max_tokens":
        with pytest.raises(openai.BadRequestError, match=r"max_tokens=1000000000 exceeds this model's maximum "
                                                         r"context length of 256 tokens") as refused:
            client.completions.create(model=model_name, prompt="x", max_tokens=10**9)
    else:
        with pytest.raises(openai.BadRequestError, match="max_completion_tokens=257 exceeds") as refused:
            client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "x"}],
                                           max_completion_tokens=257)
    assert refused.value.body["param"] == field and refused.value.body["code"] == "context_length_exceeded"
