"""One request inside the engine: its tokens, sampled log-probs and versions, block table and status."""

from __future__ import annotations

import enum
import hashlib
import itertools
from array import array

import numpy as np

from asyncrl.engine.request import GenerationRequest, GenerationResult, SamplingParams
from asyncrl.engine.routing_log import RoutingLog

# Every change of any block table gets a new number, so a cached copy of a table is stale exactly when the
# numbers differ (see `step_inputs.BlockTableCache`).
_block_table_versions = itertools.count(1)


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


def derive_seed(request_id: str, base_seed: int = 0) -> int:
    """A stable 63-bit seed from a request id and a run's base seed (`rollout.seed`); the same in every
    process and run, unlike `hash`. Requests without an explicit seed use derive_seed(request_id)."""
    key = f"{base_seed}:{request_id}".encode("utf-8")
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class Sequence:
    """Prompt + response tokens of one request and where their KV lives.

    `token_ids` holds prompt then response. After a prefill or decode step the KV of every token but the
    last is in the cache; the last token is the input of the next decode step. `block_table` lists the
    physical KV blocks holding positions [i * block_size, (i + 1) * block_size).

    Tokens, log-probs and versions are typed arrays (int32, float32, int32: the result's dtypes), not lists:
    appending costs about the same, and `to_result` copies their buffers instead of converting Python
    numbers one by one. For 256 requests of ~1,600 tokens finishing in one step that conversion took ~60 ms,
    a stall of the whole engine.
    """

    def __init__(self, sequence_id: int, request: GenerationRequest) -> None:
        self.sequence_id = sequence_id
        self.request_id = request.request_id
        self.params: SamplingParams = request.params
        self.seed = request.params.seed if request.params.seed is not None else derive_seed(request.request_id)
        self.num_prompt_tokens = int(request.prompt_ids.size)
        # Both read by `stop_reason` after every sampled token: precomputed, not rebuilt from params each time.
        self.stop_token_ids = frozenset(request.params.stop_token_ids)
        self.max_num_tokens = self.num_prompt_tokens + request.params.max_new_tokens
        self.token_ids = array("i", request.prompt_ids.tobytes() + request.response_ids.tobytes())
        self.response_log_probs = array("f", request.response_log_probs.tobytes())
        self.response_versions = array("i", request.response_versions.tobytes())
        self.routing = RoutingLog(request.routed_experts)  # MoE: the experts each computed position used
        self._block_ids: list[int] = []
        self._block_array = np.zeros(0, dtype=np.int32)
        self.block_table_version = 0
        self.status = SequenceStatus.WAITING
        self.finish_reason: str | None = None
        self.num_preemptions = 0
        # Leading tokens whose KV came from the prefix cache at the latest admission (not computed again), and
        # over every admission: tokens to prefill and those of them found cached (the result reports them).
        self.num_cached_tokens = 0
        self.prefill_tokens_total = 0
        self.cached_tokens_total = 0
        # The prefix cache's weights epoch when a prefill of it was launched (None: none since its blocks were
        # allocated): its decode-filled blocks are reusable only if the weights have not changed since.
        self.kv_epoch: int | None = None
        self._block_hashes: list[int] = []

    @property
    def block_table(self) -> list[int]:
        """Physical block id of each logical block. Read only: `assign_blocks` and `append_block` change it
        together with `block_array`."""
        return self._block_ids

    @property
    def block_array(self) -> np.ndarray:
        """`block_table` as int32 numpy, kept in step with it: step inputs copy it without a list conversion."""
        return self._block_array

    def admitted(self, num_cached_tokens: int) -> None:
        """Its blocks were allocated for a prefill that finds its first `num_cached_tokens` in the prefix cache."""
        self.num_cached_tokens = num_cached_tokens
        self.prefill_tokens_total += len(self.token_ids)
        self.cached_tokens_total += num_cached_tokens

    def assign_blocks(self, block_ids: list[int]) -> None:
        self._block_ids = list(block_ids)
        self._block_array = np.asarray(self._block_ids, dtype=np.int32)
        self.block_table_version = next(_block_table_versions)

    def append_block(self, block_id: int) -> None:
        self._block_ids.append(block_id)
        self._block_array = np.append(self._block_array, np.int32(block_id))
        self.block_table_version = next(_block_table_versions)

    def block_hashes(self, block_size: int, num_blocks: int) -> list[int]:
        """The prefix-cache keys of the first `num_blocks` full blocks: block i's hash covers its tokens and,
        through block i - 1's hash, every token before them. Tokens are only ever appended, so the hashes
        computed so far stay valid and are extended, not recomputed."""
        hashes = self._block_hashes
        while len(hashes) < num_blocks:
            start = len(hashes) * block_size
            hashes.append(hash((hashes[-1] if hashes else 0, self.token_ids[start:start + block_size].tobytes())))
        return hashes[:num_blocks]

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_response_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def last_token_id(self) -> int:
        return self.token_ids[-1]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int, log_prob: float, version: int) -> None:
        self.token_ids.append(token_id)
        self.response_log_probs.append(log_prob)
        self.response_versions.append(version)

    def stop_reason(self, eos_token_ids: frozenset[int], max_model_len: int) -> str | None:
        """"stop", "length" or None (keep going), judged on the tokens so far."""
        num_tokens = len(self.token_ids)
        if num_tokens > self.num_prompt_tokens:
            last = self.token_ids[-1]
            if last in self.stop_token_ids or (last in eos_token_ids and not self.params.ignore_eos):
                return "stop"
        if num_tokens >= self.length_limit(max_model_len):
            return "length"
        return None

    def length_limit(self, max_model_len: int) -> int:
        """The token count (prompt + response) at which the sequence finishes with "length"."""
        return min(self.max_num_tokens, max_model_len)

    def finish(self, reason: str) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason

    def to_result(self) -> GenerationResult:
        # Copies, so that the result owns its memory and the arrays stay resizable (a live numpy view of an
        # array's buffer forbids appending to it).
        token_ids = np.frombuffer(self.token_ids, dtype=np.int32)
        return GenerationResult(
            request_id=self.request_id,
            prompt_ids=token_ids[:self.num_prompt_tokens].copy(),
            response_ids=token_ids[self.num_prompt_tokens:].copy(),
            response_log_probs=np.frombuffer(self.response_log_probs, dtype=np.float32).copy(),
            response_versions=np.frombuffer(self.response_versions, dtype=np.int32).copy(),
            finish_reason=self.finish_reason if self.finish_reason is not None else "abort",
            routed_experts=self.routing.as_array(len(self.token_ids)),
            num_prefill_tokens=self.prefill_tokens_total,
            num_cached_tokens=self.cached_tokens_total,
            num_preemptions=self.num_preemptions,
        )
