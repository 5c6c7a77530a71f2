"""What the external backend sends a rollout server for a request, and the answer checked against it before
anything of it trains.

    body = completion_body(request, model)     # None: the request's budget is spent (finished_already)
    result = result_from_answer(request, answer, body["max_tokens"], vocab_size=151936, version=3, url=url)

The body is vLLM's completion request with token ids (`prompt` a list of ids, `return_token_ids`, `top_k`,
`ignore_eos`, `stop_token_ids`, `request_id`); the answer's choice carries `token_ids` and `token_logprobs`
(asyncrl serve; vLLM gives the ids and, with `logprobs`, the log-probs). A server that does not say which
version sampled each token gets the version the backend pushed last. A resumed request (partial rollout) is sent
as prompt + the response so far with the remaining budget, and its result is the whole response.

A server is trusted with nothing: the answer must be a JSON object with a non-empty `choices` list whose first
choice holds `token_ids` (integers in [0, vocab_size)), as many `token_logprobs` (finite numbers <= 0, from the
choice or its `logprobs` object) and, where given, as many `token_versions` (integers >= 0), and at most `budget`
tokens (the `max_tokens` it was sent). An answer that breaks any of these raises `ServerLied`, naming the
server, the request and what was wrong: the backend takes such a server out of rotation like a dead one
(`ServerLied` is a `ServerFailure`) and sends the request to another, so no sample of it is trained.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from asyncrl.engine import GenerationRequest, GenerationResult
from asyncrl.rollout.external_client import ServerLied

FINISH_REASONS = ("stop", "length", "abort")
LOG_PROB_SLACK = 1e-4   # a log-prob rounded above 0 by the server's float format


def completion_body(request: GenerationRequest, model: str) -> dict[str, Any] | None:
    """The completion request for `request`'s remaining budget, or None when nothing is left to generate."""
    params = request.params
    remaining = params.max_new_tokens - request.response_ids.size
    if remaining <= 0:
        return None
    prompt = np.concatenate([request.prompt_ids, request.response_ids]).tolist()
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": int(remaining),
                            "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k,
                            "ignore_eos": params.ignore_eos, "stop_token_ids": list(params.stop_token_ids),
                            "return_token_ids": True, "logprobs": 0, "request_id": request.request_id}
    if params.seed is not None:
        body["seed"] = params.seed
    return body


def finished_already(request: GenerationRequest) -> GenerationResult:
    """A resumed request whose budget was spent before it was aborted."""
    return GenerationResult(request.request_id, request.prompt_ids, request.response_ids, request.response_log_probs,
                            request.response_versions, "length")


def first_choice(answer: Any, where: str) -> dict[str, Any]:
    if not isinstance(answer, dict):
        raise ServerLied(f"{where}: the answer is a JSON {type(answer).__name__}, not an object")
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices:
        raise ServerLied(f"{where}: the answer has no choices (got {str(choices)[:100]})")
    if not isinstance(choices[0], dict):
        raise ServerLied(f"{where}: choices[0] is a {type(choices[0]).__name__}, not an object")
    return choices[0]


def choice_log_probs(choice: dict[str, Any]) -> Any:
    log_probs = choice.get("token_logprobs")
    logprobs = choice.get("logprobs")
    if log_probs is None and isinstance(logprobs, dict):
        log_probs = logprobs.get("token_logprobs")
    return log_probs


def checked_ids(values: Any, name: str, low: int, high: int | None, where: str) -> list[int]:
    if not isinstance(values, list) or not all(isinstance(value, int) and not isinstance(value, bool)
                                               for value in values):
        raise ServerLied(f"{where}: {name} is not a list of integers")
    bad = [value for value in values if value < low or (high is not None and value >= high)]
    if bad:
        bound = f"[{low}, {high})" if high is not None else f">= {low}"
        raise ServerLied(f"{where}: {name} holds {len(bad)} value(s) outside {bound}, e.g. {bad[0]}")
    return values


def checked_log_probs(values: Any, length: int, where: str) -> list[float]:
    if not isinstance(values, list) or not all(isinstance(value, (int, float)) and not isinstance(value, bool)
                                               for value in values):
        raise ServerLied(f"{where}: the choice lacks token_logprobs as a list of numbers (the external backend "
                         f"needs a server that returns them: asyncrl serve, or vLLM with return_token_ids)")
    if len(values) != length:
        raise ServerLied(f"{where}: {len(values)} log-probs for {length} token ids")
    bad = [value for value in values if not math.isfinite(value) or value > LOG_PROB_SLACK]
    if bad:
        raise ServerLied(f"{where}: {len(bad)} log-prob(s) not finite or above 0, e.g. {bad[0]}")
    return values


def result_from_answer(request: GenerationRequest, answer: Any, budget: int, vocab_size: int, version: int,
                       url: str) -> GenerationResult:
    """The whole response (the request's earlier part, then the choice's tokens), or `ServerLied`."""
    where = f"{url}: completion of {request.request_id!r}"
    choice = first_choice(answer, where)
    if choice.get("token_ids") is None:
        raise ServerLied(f"{where}: the choice lacks token_ids (the external backend needs a server that returns "
                         f"them: asyncrl serve, or vLLM with return_token_ids)")
    token_ids = checked_ids(choice["token_ids"], "token_ids", 0, vocab_size, where)
    if len(token_ids) > budget:
        raise ServerLied(f"{where}: {len(token_ids)} tokens for max_tokens={budget}")
    log_probs = checked_log_probs(choice_log_probs(choice), len(token_ids), where)
    versions = choice.get("token_versions")
    if versions is None:
        versions = [version] * len(token_ids)
    versions = checked_ids(versions, "token_versions", 0, None, where)
    if len(versions) != len(token_ids):
        raise ServerLied(f"{where}: {len(versions)} token_versions for {len(token_ids)} token ids")
    reason = choice.get("finish_reason") or "length"
    finish_reason = reason if reason in FINISH_REASONS else "stop"
    return GenerationResult(
        request.request_id, request.prompt_ids,
        np.concatenate([request.response_ids, np.asarray(token_ids, dtype=np.int32)]),
        np.concatenate([request.response_log_probs, np.asarray(log_probs, dtype=np.float32)]),
        np.concatenate([request.response_versions, np.asarray(versions, dtype=np.int32)]), finish_reason)
