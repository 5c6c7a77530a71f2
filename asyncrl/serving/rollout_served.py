"""The run's rollout backend as a served model: what a training run's recording endpoint sits on.

    served = RolloutServedModel(generator, tokenizer, name="policy", max_model_len=64, vocab_size=128)
    endpoint = RecordingEndpoint(served)          # the agents' completions go to the backend's engines

`generator` is anything with `async generate(requests)`: the run's `RolloutBackend` (the fully-async
rollouter's replica set) or a `TurnBatcher` over it (the driver's stages), so every completion an agent asks
for runs on the engines that train, stamped with their policy version. A completion cut off by an abort (a
weight sync with partial rollout) is continued where it stopped, on the new weights, and the agent gets one
answer whose tokens carry both versions.

Session defaults: a request that leaves out temperature, top_p, top_k, max_tokens or seed is sampled with the
run's settings for that run (`rollout.*`, or `rollout.val_kwargs` at validation; `data.max_response_length`
tokens a turn; the request's seed, one per turn), which the recording endpoint puts in `SESSION` while it
serves the request. What the agent sends itself wins.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field, replace
from collections.abc import Callable
from typing import Any, Optional, Protocol

from asyncrl.engine import GenerationRequest, GenerationResult, SamplingParams
from asyncrl.serving.protocol import APIError, SamplingFields
from asyncrl.serving.served_model import ServedModel

DEFAULTED_FIELDS = ("temperature", "top_p", "top_k")


class Generator(Protocol):
    async def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]: ...


@dataclass
class Session:
    """One agent run's recording: its completions as they finished, and the sampling it defaults to."""
    turns: list[GenerationResult] = field(default_factory=list)
    defaults: Optional[SamplingParams] = None
    num_requests: int = 0


SESSION: contextvars.ContextVar[Optional[Session]] = contextvars.ContextVar("asyncrl_recording_session", default=None)


def turn_seed(seed: Optional[int], turn: int) -> Optional[int]:
    """Each request of a run draws its own numbers, still a function of the run's seed alone."""
    return None if seed is None else (seed * 1_000_003 + turn) % 2**62


def with_session_defaults(params: SamplingParams, fields: SamplingFields) -> SamplingParams:
    """`params` with what the request left out taken from the serving session's defaults (none: unchanged); each
    choice of each request of a session is a new turn of its seed."""
    session = SESSION.get()
    if session is None or session.defaults is None:
        return params
    defaults, given = session.defaults, fields.model_fields_set
    turn = session.num_requests
    session.num_requests += 1
    changes: dict[str, Any] = {name: getattr(defaults, name) for name in DEFAULTED_FIELDS if name not in given}
    if not given & {"max_tokens", "max_completion_tokens"}:
        changes["max_new_tokens"] = min(params.max_new_tokens, defaults.max_new_tokens)
    if "seed" not in given and defaults.seed is not None:
        changes["seed"] = turn_seed(defaults.seed, turn)
    return replace(params, **changes)


class RolloutServedModel(ServedModel):
    """A `ServedModel` whose completions run on a rollout backend; it has no admin verbs (the trainer owns the
    weights), and the recording endpoint serves only its OpenAI routes."""

    def __init__(self, generator: Generator, tokenizer: Any, name: str, max_model_len: int, vocab_size: int,
                 version: Optional[Callable[[], int]] = None):
        super().__init__(engine=None, tokenizer=tokenizer, name=name, folder=name)
        self.generator = generator
        self.model_len = max_model_len
        self.num_tokens = vocab_size
        self.version_of = version   # the backend's current version, for the responses' weight_version

    @property
    def version(self) -> int:
        return self.version_of() if self.version_of is not None else 0

    @property
    def max_model_len(self) -> int:
        return self.model_len

    @property
    def vocab_size(self) -> int:
        return self.num_tokens

    def sampling_params(self, fields: SamplingFields, max_tokens: int, choice_index: int,
                        extra_stop_ids: list[int]) -> SamplingParams:
        params = super().sampling_params(fields, max_tokens, choice_index, extra_stop_ids)
        return with_session_defaults(params, fields)

    async def generate(self, prompt_ids: list[int], params: SamplingParams, engine_id: str,
                       request_id: str) -> GenerationResult:
        """One choice on the backend; an aborted one (a weight sync) continues where it stopped once the backend
        takes requests again, with its seed and whole token budget."""
        try:
            result = (await self.generator.generate([GenerationRequest(engine_id, prompt_ids, params)]))[0]
            while result.finish_reason == "abort":
                result = (await self.generator.generate([GenerationRequest.resume(result, params)]))[0]
        except ValueError as error:   # the engine's own check: the KV cache, a prompt too long for it
            raise APIError(400, str(error)) from None
        return result
