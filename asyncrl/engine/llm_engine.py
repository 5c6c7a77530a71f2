"""The synchronous generation engine: add requests, step, collect finished results.

    engine = LLMEngine("path/to/hf_folder", EngineConfig(device="cuda"))
    results = engine.generate([GenerationRequest("a", prompt_ids, SamplingParams(max_new_tokens=64))])
    engine.add_request(request); finished = engine.step()            # continuous batching by hand
    engine.update_weights(trainer_named_tensors, version=3)          # in place, between steps
    engine.sleep(); ...; engine.wake()                               # free / restore the KV cache

Async scheduling (`config.async_scheduling`): while decoding, each `step` launches the next decode before
postprocessing the current one, so the host builds inputs and appends tokens while the device computes:

    step k:  launch s+1 (inputs from s's tokens on the device) -> wait for s -> postprocess s -> return
    device:  ...... s ...... | ................ s+1 ................ |

It is launched only when it is exactly the batch `schedule` would pick after s (nothing waits for admission,
no preemption is needed), and sampling noise depends only on seed and position, so the tokens are those
of the synchronous engine. A request that stops on a sampled stop token at s still computes one token at
s+1, dropped; its row can change the batch shape, so log-probs equal the synchronous ones as far as the
kernels are batch-independent (bitwise on CPU in the tests). Everything that needs a quiet engine (weight
updates, abort, sleep) first completes the step in flight, with the version current at its launch: after k
calls of `step`, up to k + 1 steps' tokens are in. `drain` does only that.

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
from asyncrl.engine.step_routing import record_step_routing
from asyncrl.engine.step_output import StepOutput
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
    # A prefill's tokens, summed over its sequences (followers included): what computing each alone would cost,
    # and of them those read from the prefix cache (a follower counts its leader's).
    num_prefill_tokens: int = 0
    num_cached_tokens: int = 0


@dataclass
class PrefillCounts:
    """Prefill tokens since the engine started: asked for (every sequence admitted, whole), computed, and found
    in the prefix cache. A group's followers share their leader's computed tokens, so requested - computed
    is what the group sharing and the prefix cache together saved."""

    requested: int = 0
    computed: int = 0
    cached: int = 0

    def add(self, summary: StepSummary) -> None:
        if summary.is_prefill:
            self.requested += summary.num_prefill_tokens
            self.computed += summary.num_computed_tokens
            self.cached += summary.num_cached_tokens


@dataclass
class LaunchedStep:
    """A step queued on the device, postprocessed later."""

    batch: ScheduledBatch
    output: StepOutput
    version: int  # the weights' version when it was launched, stamped on its tokens


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
        # CPU GEMMs of fewer than 4 rows sum in another order than larger ones (MKL/oneDNN, fp32: results differ in
        # the last bit), so a prefill left with 1-3 tokens by a prefix hit would write KV that differs from a
        # whole prefill's; computing at least 4 keeps a group's outputs bitwise those of a run without the cache
        # where the CPU's kernels round alike from 4 rows up (the development VM; other CPUs differ in the last bits).
        # MoE: off, because a cached prefix would come without the routing record of its positions, which routing
        # replay needs (`routing_log.py` records what each sequence's own forwards computed).
        self.block_manager = BlockManager(self.runner.kv_cache.num_blocks, self.config.block_size,
                                          self.config.enable_prefix_caching and not model.config.is_moe,
                                          min_computed_tokens=1 if self.config.is_cuda else 4)
        self.scheduler = Scheduler(self.block_manager, self.config.max_num_seqs, self.config.max_num_batched_tokens,
                                   frozenset(model.config.eos_token_ids), self.max_model_len)
        self._version = 0
        self._next_sequence_id = 0
        self._sequences: dict[str, Sequence] = {}  # in flight, by request id
        self._finished_unreported: list[Sequence] = []  # finished outside `step` (at admission, in a drain)
        self._in_flight: LaunchedStep | None = None  # a decode launched ahead, not yet postprocessed
        self._is_sleeping = False
        self.last_step: StepSummary | None = None
        self.prefill_counts = PrefillCounts()
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
        return self.scheduler.has_unfinished() or bool(self._finished_unreported) or self._in_flight is not None

    def add_request(self, request: GenerationRequest) -> None:
        """Queues a request; a resumed one continues from its response so far within the original budget."""
        self._validate(request)
        sequence = Sequence(self._next_sequence_id, request)
        self._next_sequence_id += 1
        self._sequences[request.request_id] = sequence
        reason = sequence.stop_reason(self.scheduler.eos_token_ids, self.max_model_len)
        if reason is not None:  # a resumed request that had already finished
            sequence.finish(reason)
            self._finished_unreported.append(sequence)
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
        """Runs one prefill or decode step (with async scheduling: completes the step launched ahead by the
        previous call, after launching the one that follows it); returns the requests that finished."""
        if self._is_sleeping:
            raise RuntimeError("the engine is asleep (KV cache released); call wake() before step()")
        current, self._in_flight = self._in_flight, None
        if current is None:
            batch = self.scheduler.schedule()
            current = self._launch(batch) if batch is not None else None
        if current is not None:
            if self.config.async_scheduling:
                self._in_flight = self._launch_ahead(current)
            self._finished_unreported += self._postprocess(current)
        return self._report_finished()

    def drain(self) -> list[GenerationResult]:
        """Completes the step in flight, launching nothing more (the device is then idle until the next
        `step`); returns the requests that finished and were not returned yet."""
        self._complete_in_flight()
        return self._report_finished()

    def _launch(self, batch: ScheduledBatch, previous: LaunchedStep | None = None) -> LaunchedStep:
        self.last_step = _summarise(batch)
        self.prefill_counts.add(self.last_step)
        output = self.runner.launch(batch, previous.output if previous is not None else None)
        if batch.is_prefill:
            self.scheduler.prefill_launched(batch)
        return LaunchedStep(batch, output, self._version)

    def _launch_ahead(self, current: LaunchedStep) -> LaunchedStep | None:
        batch = self.scheduler.schedule_ahead(current.batch)
        return self._launch(batch, current) if batch is not None else None

    def _postprocess(self, launched: LaunchedStep) -> list[Sequence]:
        token_ids, log_probs = launched.output.wait()
        routed = launched.output.routing()
        if routed is not None:
            record_step_routing(launched.batch, routed)
        return self.scheduler.postprocess(launched.batch, token_ids, log_probs, launched.version)

    def _complete_in_flight(self) -> None:
        """Waits for and postprocesses the step in flight: weights, KV cache and queues are quiet after."""
        if self._in_flight is not None:
            launched, self._in_flight = self._in_flight, None
            self._finished_unreported += self._postprocess(launched)

    def _report_finished(self) -> list[GenerationResult]:
        finished, self._finished_unreported = self._finished_unreported, []
        return [self._sequences.pop(sequence.request_id).to_result() for sequence in finished]

    def warm_up(self) -> None:
        """Captures the CUDA graphs of every decode bucket now rather than on first use."""
        self._complete_in_flight()
        self.runner.warm_up()

    def abort(self, request_ids: Iterable[str] | None = None) -> list[GenerationResult]:
        """Stops the given (all when None) in-flight requests; returns what each generated so far, with
        finish_reason "abort" (or their own, for those that finished in the step in flight, which completes
        first). Unknown or already returned ids are ignored."""
        self._complete_in_flight()
        selected = None if request_ids is None else set(request_ids)
        aborted = self.scheduler.abort(selected)
        for sequence in list(self._finished_unreported):
            if selected is None or sequence.request_id in selected:
                self._finished_unreported.remove(sequence)
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
        self._complete_in_flight()  # its kernels read the weights being overwritten; its tokens keep the old version
        with torch.no_grad():
            num_copied = load(self.parameters)
        self.runner.weights_updated()
        self.block_manager.clear_prefix_cache()  # cached KV was computed by the old weights
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
            self._complete_in_flight()
            self.scheduler.preempt_all()
            self.runner.sleep()
            self.block_manager.clear_prefix_cache()  # the memory holding the cached KV is gone
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
    if batch.is_prefill:
        rows = [sequence for index, sequence in enumerate(batch.sequences) if batch.leader_indices[index] == index]
    else:
        rows = batch.sequences
    num_context_tokens = sum(len(sequence.token_ids) for sequence in rows) + batch.lookahead * len(rows)
    if not batch.is_prefill:
        return StepSummary(False, batch.num_sequences, len(rows), num_context_tokens)
    num_computed = num_context_tokens - sum(sequence.num_cached_tokens for sequence in rows)
    return StepSummary(True, batch.num_sequences, num_computed, num_context_tokens,
                       num_prefill_tokens=sum(len(sequence) for sequence in batch.sequences),
                       num_cached_tokens=sum(sequence.num_cached_tokens for sequence in batch.sequences))


def _check_placement(model: CausalLM, config: EngineConfig) -> None:
    parameter = next(model.parameters())
    if parameter.device != config.torch_device or parameter.dtype != config.model_dtype:
        raise ValueError(f"the model is on {parameter.device} in {parameter.dtype}, the engine config asks for "
                         f"{config.torch_device} in {config.model_dtype}")
