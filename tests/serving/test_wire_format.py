"""The pure pieces of serving and of the external backend, against hand-computed values: the Prometheus text the
server writes, and the completion body and result of a resumed (partial) request."""

from __future__ import annotations

import numpy as np
import pytest

from asyncrl.engine import GenerationRequest, SamplingParams
from asyncrl.rollout.external_answer import completion_body, result_from_answer
from asyncrl.rollout.external_client import ServerLied
from asyncrl.serving.metrics import ServerMetrics


def test_prometheus_text_counts_requests_tokens_and_cumulative_latency_buckets():
    metrics = ServerMetrics()
    for seconds in (0.003, 0.02, 7.0):
        metrics.observe_request("/v1/completions", 200, seconds)
    metrics.observe_request("/v1/completions", 404, 0.001)
    metrics.observe_tokens(prompt=5, completion=12)
    lines = metrics.exposition(running=3, waiting=1, weight_version=4, is_paused=False).splitlines()
    assert 'asyncrl_requests_total{route="/v1/completions",status="200"} 3' in lines
    assert 'asyncrl_requests_total{route="/v1/completions",status="404"} 1' in lines
    buckets = {line.split('le="')[1].split('"')[0]: int(line.split()[-1]) for line in lines
               if line.startswith('asyncrl_request_latency_seconds_bucket{route="/v1/completions"')}
    assert buckets["0.005"] == 2 and buckets["0.025"] == 3 and buckets["5"] == 3 and buckets["10"] == 4
    assert buckets["+Inf"] == 4
    assert 'asyncrl_request_latency_seconds_sum{route="/v1/completions"} 7.024000' in lines
    assert {"asyncrl_generation_tokens_total 12", "asyncrl_prompt_tokens_total 5", "asyncrl_num_requests_running 3",
            "asyncrl_num_requests_waiting 1", "asyncrl_weight_version 4", "asyncrl_is_paused 0"} <= set(lines)
    assert "# TYPE asyncrl_request_latency_seconds histogram" in lines


def resumed_request() -> GenerationRequest:
    return GenerationRequest("epoch0/p3/1", [7, 8, 9], SamplingParams(max_new_tokens=5, seed=42, top_k=4),
                             response_ids=[20, 21], response_log_probs=[-0.5, -0.25], response_versions=[3, 3])


def test_a_resumed_request_sends_prompt_and_response_with_the_remaining_budget():
    body = completion_body(resumed_request(), "policy")
    assert body["prompt"] == [7, 8, 9, 20, 21] and body["max_tokens"] == 3
    assert (body["seed"], body["top_k"], body["request_id"], body["return_token_ids"]) == (42, 4, "epoch0/p3/1", True)
    spent = GenerationRequest("x", [1], SamplingParams(max_new_tokens=2), response_ids=[5, 6],
                              response_log_probs=[0.0, 0.0], response_versions=[0, 0])
    assert completion_body(spent, "policy") is None


def test_a_resumed_result_is_the_whole_response_with_versions_stamped_where_the_server_gives_none():
    choice = {"token_ids": [30, 31], "token_logprobs": [-1.0, -2.0], "finish_reason": "stop"}
    result = result_from_answer(resumed_request(), {"choices": [choice]}, 3, 100, version=4, url="http://s")
    assert result.response_ids.tolist() == [20, 21, 30, 31]
    np.testing.assert_array_equal(result.response_log_probs, np.float32([-0.5, -0.25, -1.0, -2.0]))
    assert result.response_versions.tolist() == [3, 3, 4, 4] and result.finish_reason == "stop"
    stamped = result_from_answer(resumed_request(), {"choices": [{**choice, "token_versions": [5, 6]}]}, 3, 100,
                                 version=4, url="http://s")
    assert stamped.response_versions.tolist() == [3, 3, 5, 6]
    with pytest.raises(ServerLied, match=r"http://s: completion of 'epoch0/p3/1': the choice lacks token_ids"):
        result_from_answer(resumed_request(), {"choices": [{"text": "12", "finish_reason": "stop"}]}, 3, 100,
                           version=4, url="http://s")


HONEST = {"token_ids": [30, 31], "token_logprobs": [-1.0, -2.0], "finish_reason": "stop"}


@pytest.mark.parametrize("answer, message", [
    ([HONEST], "the answer is a JSON list, not an object"),
    ({"choices": []}, "the answer has no choices"),
    ({"id": "x"}, "the answer has no choices"),
    ({"choices": ["12"]}, "choices\\[0\\] is a str, not an object"),
    ({"choices": [{**HONEST, "token_ids": [30, 31, 32, 33]}]}, "4 tokens for max_tokens=3"),
    ({"choices": [{**HONEST, "token_ids": [30, 100]}]}, r"token_ids holds 1 value\(s\) outside \[0, 100\), e.g. 100"),
    ({"choices": [{**HONEST, "token_ids": [30, -1]}]}, r"outside \[0, 100\), e.g. -1"),
    ({"choices": [{**HONEST, "token_ids": [30, 3.5]}]}, "token_ids is not a list of integers"),
    ({"choices": [{**HONEST, "token_logprobs": [-1.0, float("nan")]}]},
     "1 log-prob\\(s\\) not finite or above 0, e.g. nan"),
    ({"choices": [{**HONEST, "token_logprobs": [-1.0, float("-inf")]}]}, "not finite or above 0, e.g. -inf"),
    ({"choices": [{**HONEST, "token_logprobs": [-1.0, 0.5]}]}, "not finite or above 0, e.g. 0.5"),
    ({"choices": [{**HONEST, "token_logprobs": [-1.0]}]}, "1 log-probs for 2 token ids"),
    ({"choices": [{**HONEST, "token_logprobs": "-1 -2"}]}, "lacks token_logprobs as a list of numbers"),
    ({"choices": [{**HONEST, "token_versions": [1]}]}, "1 token_versions for 2 token ids"),
    ({"choices": [{**HONEST, "token_versions": [1, -2]}]}, r"token_versions holds 1 value\(s\) outside >= 0"),
])
def test_an_answer_that_breaks_the_request_is_a_lie_named_with_the_server_and_request(answer, message):
    with pytest.raises(ServerLied, match=r"^http://s: completion of 'epoch0/p3/1': .*" + message):
        result_from_answer(resumed_request(), answer, 3, 100, version=4, url="http://s")
