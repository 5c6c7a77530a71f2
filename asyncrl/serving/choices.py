"""What completions and chat share: generating a request's `n` choices on the engine (they join its continuous
batch together), cutting a choice at a stop string, and the per-token views of a choice (its text pieces, its
RL fields).

    async for index, choice in generate_choices(served, request, prompt_ids, budget, "cmpl-7", route, headers):
        choice.text, choice.token_ids, choice.log_probs, choice.versions, choice.finish_reason

A stop string of one token stops the engine at that token; a longer one is found in the decoded text once the
choice finished, and the choice is cut after the token that completed it (the engine cannot match text while
it samples). Either way the text excludes the stop string and the ids, log-probs and versions end with the
token that completed it, as vLLM returns them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from asyncrl.engine import GenerationResult
from asyncrl.serving.protocol import RLFields, SamplingFields
from asyncrl.serving.served_model import CompletionEvent, ServedModel


@dataclass(frozen=True)
class Choice:
    """One finished choice, cut at its stop string; lists are plain Python (JSON-ready)."""
    index: int
    prompt_ids: list[int]
    token_ids: list[int]
    log_probs: list[float]
    versions: list[int]
    text: str
    finish_reason: str               # stop, length, abort (the engine's own words; chat adds tool_calls)

    def rl_fields(self, is_requested: bool) -> dict[str, Any]:
        if not is_requested:
            return {}
        return RLFields(prompt_token_ids=self.prompt_ids, token_ids=self.token_ids, token_logprobs=self.log_probs,
                        token_versions=self.versions).model_dump()


def single_token_stops(tokenizer: Any, stop_strings: list[str]) -> list[int]:
    """Ids of the stop strings that are one token each (the engine stops on them)."""
    ids = []
    for text in stop_strings:
        encoded = tokenizer.encode(text, add_special_tokens=False)
        if len(encoded) == 1:
            ids.append(int(encoded[0]))
    return ids


def decode(tokenizer: Any, token_ids: list[int]) -> str:
    return tokenizer.decode(token_ids, skip_special_tokens=True)


def cut_at_stop(tokenizer: Any, index: int, result: GenerationResult, stop_strings: list[str]) -> Choice:
    token_ids = result.response_ids.tolist()
    log_probs = result.response_log_probs.tolist()
    versions = result.response_versions.tolist()
    text = decode(tokenizer, token_ids)
    finish_reason = result.finish_reason
    found = [position for position in (text.find(stop) for stop in stop_strings) if position >= 0]
    if found:
        cut = min(found)
        # The first token whose text reaches into the stop string completed it.
        num_tokens = next(count for count in range(1, len(token_ids) + 1)
                          if len(decode(tokenizer, token_ids[:count])) > cut)
        token_ids, log_probs, versions = token_ids[:num_tokens], log_probs[:num_tokens], versions[:num_tokens]
        text, finish_reason = text[:cut], "stop"
    return Choice(index, result.prompt_ids.tolist(), token_ids, log_probs, versions, text, finish_reason)


async def generate_choices(served: ServedModel, request: SamplingFields, prompt_ids: list[int], budget: int,
                           request_id: str, route: str, headers: Mapping[str, str]) -> AsyncIterator[Choice]:
    """The request's `n` choices as each finishes; every finished one is shown to the server's hooks. Choice i
    runs as engine request '<request_id>-<i>' (`request_id` alone when n = 1, so POST /abort_request finds
    it by the id the client chose)."""
    stop_strings = request.stop_strings()
    extra_stop_ids = single_token_stops(served.tokenizer, stop_strings)

    async def one(index: int) -> tuple[int, GenerationResult]:
        params = served.sampling_params(request, budget, index, extra_stop_ids)
        engine_id = request_id if request.n == 1 else f"{request_id}-{index}"
        return index, await served.generate(prompt_ids, params, engine_id, request_id)

    tasks = [asyncio.ensure_future(one(index)) for index in range(request.n)]
    try:
        for next_finished in asyncio.as_completed(tasks):
            index, result = await next_finished
            served.notify(CompletionEvent(route, request, index, result, headers))
            yield cut_at_stop(served.tokenizer, index, result, stop_strings)
    finally:
        for task in tasks:   # a client that went away, or a sibling's error: the rest are aborted
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def token_texts(tokenizer: Any, token_ids: list[int], as_ids: bool = False) -> list[str]:
    """Each token's own text (special tokens included), or 'token_id:<id>' (vLLM's return_tokens_as_token_ids)."""
    if as_ids:
        return [f"token_id:{token}" for token in token_ids]
    return [tokenizer.decode([token]) for token in token_ids]
