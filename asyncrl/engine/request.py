"""The records that enter and leave the generation engine.

    params = SamplingParams(temperature=1.0, max_new_tokens=256, seed=7)
    request = GenerationRequest("prompt-3/sample-0", prompt_ids=[1, 2, 3], params=params)
    result = engine.generate([request])[0]                # GenerationResult, numpy arrays
    resumed = GenerationRequest.resume(result, params)    # partial rollout: continue an aborted result

Array fields are numpy arrays (int32 ids and versions, float32 log-probs): results cross Ray process
boundaries, and numpy arrays pickle faster and smaller than tensors or lists. Requests and results pickle
their arrays as raw bytes (a few µs per record instead of ~20: the fully-async pipeline moves thousands
of short ones per step between the rollouter, the replicas and the trainer).

A mixture-of-experts engine adds `routed_experts (P + R, L, k)` to its results: the experts every layer used for
each token as the model's input (`engine/routing_log.py`; the last token, never an input, is marked not recorded).

A resumed request carries the response generated so far (ids, log-probs, versions, and the routing record). Its
`params.max_new_tokens` is the ORIGINAL budget: the engine generates at most
`max_new_tokens - len(response_ids)` more tokens, and its result holds the whole response.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from asyncrl.config.rollout_schema import RolloutConfig

FINISH_REASONS = ("stop", "length", "abort")


@dataclass(frozen=True)
class SamplingParams:
    """How one request is sampled.

    temperature 0 means greedy decoding. top_k -1 and top_p 1.0 switch those filters off. EOS ids (of the
    model config) end a response unless `ignore_eos`; `stop_token_ids` end it always. `seed` None derives
    a seed from the request id, so a resumed or recomputed request still draws the same random numbers.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or positive, got {self.top_k}")
        if self.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be positive, got {self.max_new_tokens}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be in [0, 2**63), got {self.seed}")
        object.__setattr__(self, "stop_token_ids", tuple(int(token) for token in self.stop_token_ids))

    @classmethod
    def from_rollout(cls, rollout: RolloutConfig, max_new_tokens: int, seed: int | None = None) -> SamplingParams:
        """The sampling knobs of `rollout` (temperature, top_p, top_k, ignore_eos) with a token budget."""
        return cls(temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k,
                   max_new_tokens=max_new_tokens, ignore_eos=rollout.ignore_eos, seed=seed)


def _int32_array(values) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.dtype == np.int32 and values.ndim == 1 and values.flags.c_contiguous:
        return values
    return np.ascontiguousarray(np.asarray(values, dtype=np.int64).astype(np.int32).reshape(-1))


def _float32_array(values) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.dtype == np.float32 and values.ndim == 1 and values.flags.c_contiguous:
        return values
    return np.ascontiguousarray(np.asarray(values, dtype=np.float32).reshape(-1))


@dataclass(frozen=True, eq=False)  # eq=False: comparing numpy fields with == is ambiguous
class GenerationRequest:
    """One prompt to complete, optionally with the response generated so far (partial rollout).

    prompt_ids (P,) int32; response_ids (R,) int32, response_log_probs (R,) float32 and
    response_versions (R,) int32 are empty for a fresh request. Lists are converted to numpy arrays.
    """

    request_id: str
    prompt_ids: np.ndarray
    params: SamplingParams = field(default_factory=SamplingParams)
    response_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    response_log_probs: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    response_versions: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    routed_experts: np.ndarray | None = None  # (n, L, k) uint8/int16: the routing record so far (MoE, resumed)

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_ids", _int32_array(self.prompt_ids))
        object.__setattr__(self, "response_ids", _int32_array(self.response_ids))
        object.__setattr__(self, "response_log_probs", _float32_array(self.response_log_probs))
        object.__setattr__(self, "response_versions", _int32_array(self.response_versions))
        if self.prompt_ids.size == 0:
            raise ValueError(f"request {self.request_id!r}: prompt_ids must not be empty")
        num_response = self.response_ids.size
        if self.response_log_probs.size != num_response or self.response_versions.size != num_response:
            raise ValueError(
                f"request {self.request_id!r}: response_ids, response_log_probs and response_versions must have "
                f"equal lengths, got {num_response}, {self.response_log_probs.size} and {self.response_versions.size}")

    def __reduce__(self):
        return _unpack_request, (self.request_id, self.params, _pack_routing(self.routed_experts), *map(_pack, (
            self.prompt_ids, self.response_ids, self.response_log_probs, self.response_versions)))

    @classmethod
    def resume(cls, result: GenerationResult, params: SamplingParams) -> GenerationRequest:
        """Continues `result` (typically aborted): same id and prompt, its response as the resume state.
        Pass the ORIGINAL params: the seed and the whole token budget carry over."""
        return cls(result.request_id, result.prompt_ids, params, result.response_ids,
                   result.response_log_probs, result.response_versions, result.routed_experts)


@dataclass(frozen=True, eq=False)
class GenerationResult:
    """A finished (or aborted) request: the whole response, resumed part included.

    prompt_ids (P,) int32, response_ids (R,) int32, response_log_probs (R,) float32: log-prob of each
    token under the temperature-scaled full-vocabulary distribution (see `asyncrl.engine.sampler`),
    response_versions (R,) int32: the policy version that sampled each token.
    finish_reason: "stop" (EOS or a stop id, included in the response), "length" (token budget or
    context length), "abort".
    num_prefill_tokens: tokens its prefills were asked to compute (every admission's whole sequence: a
    preempted request is prefilled again), num_cached_tokens: of them, those found in the prefix cache,
    num_preemptions: how often the engine preempted it for KV space. Backends without these counts leave 0.
    """

    request_id: str
    prompt_ids: np.ndarray
    response_ids: np.ndarray
    response_log_probs: np.ndarray
    response_versions: np.ndarray
    finish_reason: str
    routed_experts: np.ndarray | None = None  # (P + R, L, k) uint8/int16: MoE engines only (see the module doc)
    num_prefill_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0

    def __post_init__(self) -> None:
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason must be one of {FINISH_REASONS}, got {self.finish_reason!r}")

    @property
    def num_response_tokens(self) -> int:
        return int(self.response_ids.size)

    def __reduce__(self):
        counts = (self.num_prefill_tokens, self.num_cached_tokens, self.num_preemptions)
        return _unpack_result, (self.request_id, self.finish_reason, _pack_routing(self.routed_experts), counts,
                                *map(_pack, (self.prompt_ids, self.response_ids, self.response_log_probs,
                                             self.response_versions)))


def _pack(array: np.ndarray) -> tuple[str, bytes]:
    return array.dtype.str, array.tobytes()


def _unpack(packed: tuple[str, bytes]) -> np.ndarray:
    dtype, data = packed
    return np.frombuffer(data, dtype=dtype).copy()  # writable, like the array that was pickled


def _pack_routing(routed: np.ndarray | None) -> tuple[str, tuple[int, ...], bytes] | None:
    return None if routed is None else (routed.dtype.str, routed.shape, routed.tobytes())


def _unpack_routing(packed: tuple[str, tuple[int, ...], bytes] | None) -> np.ndarray | None:
    if packed is None:
        return None
    dtype, shape, data = packed
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy()


def _unpack_result(request_id: str, finish_reason: str, routed: tuple[str, tuple[int, ...], bytes] | None,
                   counts: tuple[int, int, int], *arrays: tuple[str, bytes]) -> GenerationResult:
    return GenerationResult(request_id, *map(_unpack, arrays), finish_reason, _unpack_routing(routed), *counts)


def _unpack_request(request_id: str, params: SamplingParams, routed: tuple[str, tuple[int, ...], bytes] | None,
                    prompt_ids: tuple[str, bytes], *response: tuple[str, bytes]) -> GenerationRequest:
    return GenerationRequest(request_id, _unpack(prompt_ids), params, *map(_unpack, response),
                             routed_experts=_unpack_routing(routed))
