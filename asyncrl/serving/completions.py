"""POST /v1/completions: a prompt as text or token ids, `n` choices, optionally streamed as server-sent events.

    body = {"model": "m", "prompt": [5, 9, 13], "max_tokens": 8, "seed": 1, "return_token_ids": true}
    -> choices[i].text, .token_ids, .token_logprobs, .token_versions, .prompt_token_ids, .finish_reason

Streaming sends each choice once it finished (the engine returns whole results), one event per token, then
one with its finish_reason; `stream_options.include_usage` adds a usage event before `data: [DONE]`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

from asyncrl.serving.choices import Choice, generate_choices, token_texts
from asyncrl.serving.metrics import ServerMetrics
from asyncrl.serving.protocol import (APIError, CompletionChoice, CompletionLogprobs, CompletionRequest,
                                      CompletionResponse, Usage)
from asyncrl.serving.served_model import ServedModel

ROUTE = "/v1/completions"


def prompt_ids_of(served: ServedModel, request: CompletionRequest) -> list[int]:
    prompt: Any = request.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise APIError(400, f"one prompt per request, got {len(prompt)}: send them as separate requests "
                                f"(they share the engine's batch)", param="prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        return list(served.tokenizer.encode(prompt))
    return [int(token) for token in prompt]


def sse(payload: Mapping[str, Any] | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


def logprobs_of(served: ServedModel, request: CompletionRequest, choice: Choice) -> CompletionLogprobs | None:
    """The legacy logprobs object; the engine computes the sampled token's log-prob only, so top_logprobs
    holds that token alone (for logprobs >= 1)."""
    if request.logprobs is None:
        return None
    texts = token_texts(served.tokenizer, choice.token_ids, request.return_tokens_as_token_ids)
    offsets, position = [], 0
    for text in texts:
        offsets.append(position)
        position += len(text)
    tops = [{text: log_prob} if request.logprobs >= 1 else {} for text, log_prob in zip(texts, choice.log_probs)]
    return CompletionLogprobs(tokens=texts, token_logprobs=choice.log_probs, top_logprobs=tops, text_offset=offsets)


def usage_of(choices: list[Choice]) -> Usage:
    prompt = len(choices[0].prompt_ids) if choices else 0
    completion = sum(len(choice.token_ids) for choice in choices)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


async def create_completion(served: ServedModel, metrics: ServerMetrics, request: CompletionRequest,
                            headers: Mapping[str, str]) -> CompletionResponse | AsyncIterator[str]:
    """The response, or the event stream when `stream` is set (errors found before the first event are raised)."""
    if request.echo:
        raise APIError(400, "echo is not supported: the response holds the completion only", param="echo")
    prompt_ids = prompt_ids_of(served, request)
    served.check_prompt(prompt_ids, "prompt")
    budget = served.budget(prompt_ids, request.max_tokens)
    request_id = request.request_id or f"cmpl-{uuid.uuid4().hex}"
    choices = generate_choices(served, request, prompt_ids, budget, request_id, ROUTE, headers)
    created = int(time.time())
    if request.stream:
        return stream_completion(served, metrics, request, request_id, created, choices)
    finished = sorted([choice async for choice in choices], key=lambda choice: choice.index)
    usage = usage_of(finished)
    metrics.observe_tokens(usage.prompt_tokens, usage.completion_tokens)
    return CompletionResponse(
        id=request_id, created=created, model=served.name, usage=usage, weight_version=served.version,
        choices=[CompletionChoice(index=choice.index, text=choice.text, logprobs=logprobs_of(served, request, choice),
                                  finish_reason=choice.finish_reason, **choice.rl_fields(request.return_token_ids))
                 for choice in finished])


async def stream_completion(served: ServedModel, metrics: ServerMetrics, request: CompletionRequest, request_id: str,
                            created: int, choices: AsyncIterator[Choice]) -> AsyncIterator[str]:
    head = {"id": request_id, "object": "text_completion", "created": created, "model": served.name}
    finished: list[Choice] = []
    async for choice in choices:
        finished.append(choice)
        texts = token_texts(served.tokenizer, choice.token_ids)
        emitted = ""
        for count in range(1, len(choice.token_ids) + 1):
            # The text so far, decoded whole: a character split over tokens appears once it is complete.
            text = served.tokenizer.decode(choice.token_ids[:count], skip_special_tokens=True)[:len(choice.text)]
            delta, emitted = text[len(emitted):], text
            logprobs = None
            if request.logprobs is not None:
                logprobs = {"tokens": [texts[count - 1]], "token_logprobs": [choice.log_probs[count - 1]],
                            "top_logprobs": [{texts[count - 1]: choice.log_probs[count - 1]}], "text_offset": [0]}
            yield sse({**head, "choices": [{"index": choice.index, "text": delta, "logprobs": logprobs,
                                            "finish_reason": None}]})
        final = {"index": choice.index, "text": choice.text[len(emitted):], "logprobs": None,
                 "finish_reason": choice.finish_reason, **choice.rl_fields(request.return_token_ids)}
        yield sse({**head, "choices": [final], "weight_version": served.version})
    usage = usage_of(finished)
    metrics.observe_tokens(usage.prompt_tokens, usage.completion_tokens)
    if request.stream_options is not None and request.stream_options.include_usage:
        yield sse({**head, "choices": [], "usage": usage.model_dump()})
    yield sse("[DONE]")
