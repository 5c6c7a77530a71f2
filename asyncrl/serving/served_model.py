"""The engine as the server holds it: one `AsyncEngine` (every HTTP request joins its continuous batch), the
tokenizer, the served name, and the admin verbs (reload weights from an HF folder, pause, resume, abort).

    served = ServedModel.load("path/to/hf_folder", EngineConfig(device="cpu"))
    result = await served.generate(prompt_ids, params, "cmpl-1-0")    # ids, log-probs, versions
    served.hooks.append(record)                                        # sees every finished completion
    await served.reload("path/to/new_folder", version=3)

A completion hook is how a recording endpoint sits on the server: it receives each finished choice's result
(the exact sampled ids, their log-probs and policy versions) with the request and its HTTP headers, after the
engine returned it and before the response is written.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from asyncrl.engine import AsyncEngine, EngineConfig, GenerationRequest, GenerationResult, LLMEngine, SamplingParams
from asyncrl.models import iter_named_tensors, load_model, load_tokenizer
from asyncrl.rollout.external_weights import weights_checksum
from asyncrl.serving.protocol import APIError, SamplingFields

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CompletionEvent:
    """What a completion hook sees: the route, the parsed request, one finished choice and the HTTP headers."""
    route: str                       # "/v1/completions" or "/v1/chat/completions"
    request: SamplingFields
    choice_index: int
    result: GenerationResult         # prompt_ids, response_ids, response_log_probs, response_versions
    headers: Mapping[str, str]


CompletionHook = Callable[[CompletionEvent], None]


@dataclass
class ServedModel:
    engine: AsyncEngine
    tokenizer: Any
    name: str                        # the model name clients send (GET /v1/models)
    folder: str                      # where the weights were loaded from last
    hooks: list[CompletionHook] = field(default_factory=list)
    in_flight: dict[str, set[str]] = field(default_factory=dict)   # client request id -> its choices' engine ids

    @classmethod
    def load(cls, folder: str | Path, engine_config: EngineConfig, name: str = "") -> "ServedModel":
        engine = AsyncEngine(LLMEngine(folder, engine_config))
        return cls(engine, load_tokenizer(folder), name or Path(folder).resolve().name, str(folder))

    @property
    def version(self) -> int:
        return self.engine.engine.version

    @property
    def max_model_len(self) -> int:
        return self.engine.engine.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.engine.engine.model_config.vocab_size

    def queue_lengths(self) -> tuple[int, int]:
        """(running, waiting) sequences of the engine's scheduler, for /metrics."""
        scheduler = self.engine.engine.scheduler
        return len(scheduler.running), len(scheduler.waiting)

    def sampling_params(self, fields: SamplingFields, max_tokens: int, choice_index: int,
                        extra_stop_ids: list[int]) -> SamplingParams:
        """Choice `choice_index`'s params; with a seed s it is sampled with s + index (as the engine would a
        request of that seed), without one from its request id. `extra_stop_ids`: stop strings of one token."""
        seed = None if fields.seed is None else fields.seed + choice_index
        try:
            return SamplingParams(temperature=fields.temperature, top_p=fields.top_p, top_k=fields.top_k,
                                  max_new_tokens=max_tokens, stop_token_ids=(*fields.stop_token_ids, *extra_stop_ids),
                                  ignore_eos=fields.ignore_eos, seed=seed)
        except ValueError as error:
            raise APIError(400, str(error)) from None

    def check_prompt(self, prompt_ids: list[int], param: str) -> None:
        """400 naming `param` when the prompt leaves no room for one token or holds an id outside the vocabulary."""
        if not prompt_ids:
            raise APIError(400, "the prompt is empty", param=param)
        if len(prompt_ids) >= self.max_model_len:
            raise APIError(400, f"this model's maximum context length is {self.max_model_len} tokens; the prompt has "
                                f"{len(prompt_ids)}, which leaves no room for a completion", param=param,
                           code="context_length_exceeded")
        vocab_size = self.vocab_size
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab_size:
            raise APIError(400, f"prompt token ids must be in [0, {vocab_size})", param=param)

    def budget(self, prompt_ids: list[int], max_tokens: int | None, param: str = "max_tokens") -> int:
        """The token budget: `max_tokens`, or what the context leaves when it is not given. A budget no prompt
        could use (past the model's context length) is a 400; one past what this prompt leaves ends with
        finish "length" where the context does."""
        room = self.max_model_len - len(prompt_ids)
        if max_tokens is None:
            return room
        if max_tokens > self.max_model_len:
            raise APIError(400, f"{param}={max_tokens} exceeds this model's maximum context length of "
                                f"{self.max_model_len} tokens", param=param, code="context_length_exceeded")
        return max_tokens

    async def generate(self, prompt_ids: list[int], params: SamplingParams, engine_id: str,
                       request_id: str) -> GenerationResult:
        """One choice, as engine request `engine_id`, of the client's request `request_id` (what an abort names)."""
        choices = self.in_flight.setdefault(request_id, set())
        choices.add(engine_id)
        try:
            return await self.engine.generate(GenerationRequest(engine_id, prompt_ids, params))
        except ValueError as error:   # the engine's own check: the KV cache, a duplicate id
            raise APIError(400, str(error)) from None
        finally:
            choices.discard(engine_id)
            if not choices:
                self.in_flight.pop(request_id, None)

    def notify(self, event: CompletionEvent) -> None:
        for hook in self.hooks:
            hook(event)

    # ---- admin ------------------------------------------------------------------------------------------
    async def reload(self, folder: str, version: int | None) -> int:
        """Loads the HF folder's weights into the engine between two steps (requests in flight continue on
        them) and stamps later tokens with `version` (default: the current one + 1). Returns the version."""
        path = Path(folder)
        if not path.is_dir():
            raise APIError(400, f"model_path {folder} is not a folder", param="model_path")
        dtype = next(self.engine.engine.model.parameters()).dtype
        try:
            # Read on the host, then copied in place: the engine's device holds one copy of the weights.
            model = await asyncio.to_thread(load_model, path, dtype, "cpu")
        except (ValueError, OSError) as error:
            raise APIError(400, f"model_path {folder}: {error}", param="model_path") from None
        new_version = self.version + 1 if version is None else version
        try:
            await self.engine.update_weights(iter_named_tensors(model), new_version)
        except ValueError as error:   # a name or shape the served model lacks: another architecture
            raise APIError(400, f"model_path {folder} does not fit the served model: {error}",
                           param="model_path") from None
        self.folder = str(folder)
        logger.info("reloaded weights from %s as version %d", folder, new_version)
        return new_version

    async def checksum(self) -> dict[str, Any]:
        model = self.engine.engine.model
        dtype = next(model.parameters()).dtype
        digest = await asyncio.to_thread(weights_checksum, iter_named_tensors(model), dtype)
        return {"sha256": digest, "dtype": str(dtype).removeprefix("torch."), "weight_version": self.version}

    async def pause(self) -> None:
        await self.engine.pause()

    async def resume(self) -> None:
        await self.engine.resume()

    async def abort(self, request_id: str | None) -> int:
        """Ends the client request `request_id` (every choice; all requests when None) now; its callers get what
        was generated, finish "abort". Returns how many choices ended."""
        engine_ids = None if request_id is None else list(self.in_flight.get(request_id, ()))
        if engine_ids == []:
            return 0
        return len(await self.engine.abort(engine_ids))

    async def close(self) -> None:
        await self.engine.close()


def engine_dtype(name: str) -> torch.dtype | None:
    """--dtype: auto (the engine's choice: bf16 on CUDA, fp32 on CPU), float32, bfloat16 or float16."""
    return None if name == "auto" else getattr(torch, name)
