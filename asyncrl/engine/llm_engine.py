"""The synchronous generation engine: add requests, step, collect finished results.

    engine = LLMEngine("path/to/hf_folder", EngineConfig(device="cuda"))
    results = engine.generate([GenerationRequest("a", prompt_ids, SamplingParams(max_new_tokens=64))])
    engine.add_request(request); finished = engine.step()            # continuous batching by hand
    engine.update_weights(trainer_named_tensors, version=3)          # in place, between steps
    engine.sleep(); ...; engine.wake()                               # free / restore the KV cache

Not thread-safe: one caller at a time (`AsyncEngine` serialises access for asyncio callers).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from asyncrl.engine.block_manager import BlockManager, num_blocks_for
from asyncrl.engine.config import EngineConfig
from asyncrl.engine.model_runner import ModelRunner
from asyncrl.engine.request import GenerationRequest, GenerationResult
from asyncrl.engine.scheduler import ScheduledBatch, Scheduler
from asyncrl.engine.sequence import Sequence
from asyncrl.models.checkpoint_io import load_model, load_named_tensors
from asyncrl.models.transformer import CausalLM

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepSummary:
    """What the last step computed, for benchmarks and metrics."""

    is_prefill: bool
    num_sequences: int  # tokens sampled
    num_computed_tokens: int  # tokens run through the model (shared prompts count once)
    num_context_tokens: int  # KV positions attended, summed over rows: the KV a decode step reads


class LLMEngine:
    """Continuous-batching generation over a paged KV cache, for one model on one device.

    `model` is an HF folder (loaded in `config.model_dtype` on `config.device`) or a `CausalLM` already on
    that device in that dtype (used as is, not copied)."""

    def __init__(self, model: str | Path | CausalLM, config: EngineConfig | None = None) -> None:
        self.config = config if config is not None else EngineConfig()
        if isinstance(model, CausalLM):
            _check_placement(model, self.config)
        else:
            model = load_model(model, dtype=self.config.model_dtype, device=self.config.torch_device)
        self.model_config = model.config
        self.max_model_len = min(self.config.max_model_len or model.config.max_position_embeddings,
                                 model.config.max_position_embeddings)
        self.runner = ModelRunner(model, self.config, self.max_model_len)
        self.block_manager = BlockManager(self.runner.kv_cache.num_blocks, self.config.block_size)
        self.scheduler = Scheduler(self.block_manager, self.config.max_num_seqs, self.config.max_num_batched_tokens,
                                   frozenset(model.config.eos_token_ids), self.max_model_len)
        self._version = 0
        self._next_sequence_id = 0
        self._sequences: dict[str, Sequence] = {}  # in flight, by request id
        self._finished_at_admission: list[Sequence] = []
        self._is_sleeping = False
        self.last_step: StepSummary | None = None
        if self.config.max_num_batched_tokens < self.max_model_len:
            # A recomputed sequence is prefilled whole (no chunked prefill), beyond the profiled activations.
            logger.warning("max_num_batched_tokens %d < max_model_len %d: a long sequence is still prefilled in "
                           "one step and may need more activation memory than profiled",
                           self.config.max_num_batched_tokens, self.max_model_len)
        logger.info("KV cache: %d blocks x %d tokens = %d tokens (%s, %s); max_model_len %d",
                    self.num_kv_blocks, self.config.block_size, self.kv_capacity_tokens, self.config.model_dtype,
                    self.runner.device, self.max_model_len)

    @property
    def model(self) -> CausalLM:
        return self.runner.model

    @property
    def num_kv_blocks(self) -> int:
        return self.runner.kv_cache.num_blocks

    @property
    def kv_capacity_tokens(self) -> int:
        return self.runner.kv_cache.capacity_tokens

    @property
    def version(self) -> int:
        """The policy version stamped on every token sampled from now on."""
        return self._version

    @property
    def is_sleeping(self) -> bool:
        return self._is_sleeping

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._finished_at_admission)

    def add_request(self, request: GenerationRequest) -> None:
        """Queues a request; a resumed one continues from its response so far within the original budget."""
        self._validate(request)
        sequence = Sequence(self._next_sequence_id, request)
        self._next_sequence_id += 1
        self._sequences[request.request_id] = sequence
        reason = sequence.stop_reason(self.scheduler.eos_token_ids, self.max_model_len)
        if reason is not None:  # a resumed request that had already finished
            sequence.finish(reason)
            self._finished_at_admission.append(sequence)
        else:
            self.scheduler.add(sequence)

    def _validate(self, request: GenerationRequest) -> None:
        name = f"request {request.request_id!r}"
        if request.request_id in self._sequences:
            raise ValueError(f"{name} is already in flight")
        num_prompt_tokens = int(request.prompt_ids.size)
        if num_prompt_tokens >= self.max_model_len:
            raise ValueError(f"{name}: prompt of {num_prompt_tokens} tokens leaves no room under max_model_len "
                             f"{self.max_model_len}")
        token_ids = np.concatenate([request.prompt_ids, request.response_ids])
        vocab_size = self.model_config.vocab_size
        if int(token_ids.min()) < 0 or int(token_ids.max()) >= vocab_size:
            raise ValueError(f"{name}: token ids must be in [0, {vocab_size})")
        max_tokens = min(num_prompt_tokens + request.params.max_new_tokens, self.max_model_len)
        if num_blocks_for(max_tokens, self.config.block_size) > self.num_kv_blocks:
            raise ValueError(f"{name} may reach {max_tokens} tokens, more than the KV cache holds "
                             f"({self.kv_capacity_tokens}); lower max_new_tokens or enlarge the cache")

    def step(self) -> list[GenerationResult]:
        """Runs one prefill or decode step; returns the requests that finished in it."""
        if self._is_sleeping:
            raise RuntimeError("the engine is asleep (KV cache released); call wake() before step()")
        finished, self._finished_at_admission = self._finished_at_admission, []
        batch = self.scheduler.schedule()
        if batch is not None:
            self.last_step = _summarise(batch)
            token_ids, log_probs = self.runner.run(batch)
            finished += self.scheduler.postprocess(batch, token_ids, log_probs, self._version)
        return [self._sequences.pop(sequence.request_id).to_result() for sequence in finished]

    def warm_up(self) -> None:
        """Captures the CUDA graphs of every decode bucket now rather than on first use."""
        self.runner.warm_up()

    def abort(self, request_ids: Iterable[str] | None = None) -> list[GenerationResult]:
        """Stops the given (all when None) in-flight requests; returns what each generated so far, with
        finish_reason "abort". Unknown or already finished ids are ignored."""
        selected = None if request_ids is None else set(request_ids)
        aborted = self.scheduler.abort(selected)
        for sequence in list(self._finished_at_admission):
            if selected is None or sequence.request_id in selected:
                self._finished_at_admission.remove(sequence)
                aborted.append(sequence)
        return [self._sequences.pop(sequence.request_id).to_result() for sequence in aborted]

    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> int:
        """Copies (HF name, tensor) pairs into the weights in place (no reallocation, so CUDA graphs stay
        valid) and stamps later tokens with `version`. Call between steps. Returns how many were copied."""
        return self.update_weights_in_place(lambda _: load_named_tensors(self.runner.model, named_tensors), version)

    def update_weights_in_place(self, load: Callable[[dict[str, Tensor]], int], version: int) -> int:
        """Runs `load(parameters)`, which writes the weights in place through the given name -> parameter map
        (a weight receiver copying straight from its buckets), and stamps later tokens with `version`. Call
        between steps. Returns what `load` returns (how many tensors it wrote)."""
        with torch.no_grad():
            num_copied = load(self.parameters)
        self._version = int(version)
        return num_copied

    @functools.cached_property
    def parameters(self) -> dict[str, Tensor]:
        """The model's parameters by HF name (they keep their storage for the engine's lifetime)."""
        return dict(self.runner.model.named_parameters())

    def sleep(self) -> None:
        """Frees the KV cache for a colocated trainer. Running requests go back to waiting with their tokens
        kept and are recomputed after `wake`."""
        if not self._is_sleeping:
            self.scheduler.preempt_all()
            self.runner.sleep()
            self._is_sleeping = True

    def wake(self) -> None:
        if self._is_sleeping:
            self.runner.wake()
            self._is_sleeping = False

    def generate(self, requests: Iterable[GenerationRequest]) -> list[GenerationResult]:
        """Runs `requests` to completion on an otherwise idle engine; results in request order."""
        if self.has_unfinished():
            raise RuntimeError("generate needs an idle engine; use add_request/step while other requests run")
        request_ids = []
        for request in requests:
            self.add_request(request)
            request_ids.append(request.request_id)
        results: dict[str, GenerationResult] = {}
        while self.has_unfinished():
            results.update((result.request_id, result) for result in self.step())
        return [results[request_id] for request_id in request_ids]


def _summarise(batch: ScheduledBatch) -> StepSummary:
    rows = [sequence for index, sequence in enumerate(batch.sequences) if batch.leader_indices[index] == index]
    num_context_tokens = sum(len(sequence) for sequence in rows)
    num_computed = num_context_tokens if batch.is_prefill else len(rows)
    return StepSummary(batch.is_prefill, batch.num_sequences, num_computed, num_context_tokens)


def _check_placement(model: CausalLM, config: EngineConfig) -> None:
    parameter = next(model.parameters())
    if parameter.device != config.torch_device or parameter.dtype != config.model_dtype:
        raise ValueError(f"the model is on {parameter.device} in {parameter.dtype}, the engine config asks for "
                         f"{config.torch_device} in {config.model_dtype}")
