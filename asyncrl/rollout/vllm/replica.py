"""A rollout replica hosting a vLLM engine: an asyncio Ray actor with the interface of `asyncrl.rollout.replica`,
so the replica set (`ReplicaSet`: health, failover, restarts, re-queueing, the weight group) drives it unchanged.

    replica = VllmReplicaActor.options(num_cpus=0.5).remote(config, index=0, num_threads=1)
    results, seconds = await replica.generate.remote(requests)

Token ids in, token ids out: a request's prompt (and, when resumed, its response so far) goes to vLLM as token
ids, and each sampled token comes back with its log-prob under the temperature-scaled distribution
(`logprobs_mode=processed_logprobs`, which is the trainer's as long as top-p and top-k are off: `check_vllm`).
Tokens stream back as they are sampled and each is stamped with the version of the weights the replica holds
when it arrives. A weight sync pauses vLLM's scheduler with requests kept (`pause_generation(mode="keep")`),
lets every token sampled before the pause arrive, loads the new weights through the worker extension
(`worker_extension.py`), empties the prefix cache (preempting the kept requests, whose tokens so far are
recomputed), stamps the new version and resumes: requests in flight continue with the new weights,
each of their tokens stamped with the weights that sampled it.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
import uuid
from typing import Any, Optional

import numpy as np
import ray
import torch

from asyncrl.config import AsyncRLConfig
from asyncrl.engine import GenerationRequest, GenerationResult
from asyncrl.models import read_config
from asyncrl.rollout.backend import RolloutError
from asyncrl.rollout.vllm.engine_args import engine_kwargs
from asyncrl.rollout.weight_transport import TransferPlan

# How long a weight sync waits, after pausing vLLM, for the tokens sampled before the pause to reach this actor.
DRAIN_TIMEOUT_S = 10.0
FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "abort"}


def request_seed(base_seed: int, request_id: str) -> int:
    """A request's sampling seed when it names none: fixed by the run's seed and the request id, so a
    validation or a recomputation draws the same numbers."""
    digest = hashlib.blake2b(f"{base_seed}:{request_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class Flight:
    """One request on the engine: what it has sampled so far (its resumed part included)."""

    def __init__(self, request: GenerationRequest):
        self.request = request
        self.ids = list(request.response_ids)
        self.log_probs = list(request.response_log_probs)
        self.versions = list(request.response_versions)
        self.finish_reason = "abort"
        self.vllm_id = ""

    def result(self) -> GenerationResult:
        return GenerationResult(self.request.request_id, self.request.prompt_ids, np.asarray(self.ids, np.int32),
                                np.asarray(self.log_probs, np.float32), np.asarray(self.versions, np.int32),
                                self.finish_reason)


class VllmReplica:
    def __init__(self, config: AsyncRLConfig, index: int, num_threads: int):
        # vLLM's CPU workers bind their OpenMP threads to cores unless told not to; here cores are shared with
        # the trainer ranks, so its worker processes get this actor's share of threads and no binding.
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        # vLLM logs every pause, reload and cache reset at INFO: a line per sync per replica on the run's console.
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        os.environ["OMP_NUM_THREADS"] = str(num_threads)
        torch.set_num_threads(num_threads)
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM
        self.index = index
        self.name = f"rollout/replica{index}"
        device = "cuda" if torch.cuda.is_available() and config.trainer.device != "cpu" else "cpu"
        kwargs = engine_kwargs(config, device)
        self.max_model_len = kwargs["max_model_len"]
        self.engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
        model_config, _ = read_config(config.model.path)
        self.eos_ids = tuple(model_config.eos_token_ids)
        self.base_seed = config.rollout.seed
        self.with_checksum = config.rollout.vllm.verify_weights
        self.checksum = ""
        self.weights_version = 0
        self.flights: dict[str, Flight] = {}
        self.num_submitted = 0
        self.incarnation = uuid.uuid4().hex  # changes when Ray restarts this replica after a death

    async def ping(self) -> tuple[int, str]:
        return self.index, self.incarnation

    async def pid(self) -> int:
        return os.getpid()

    async def threads(self) -> tuple[int, str]:
        """The OpenMP threads this replica gave its vLLM processes and the wait policy: logged at start."""
        return int(os.environ["OMP_NUM_THREADS"]), os.environ.get("OMP_WAIT_POLICY", "")

    # ---- generation -------------------------------------------------------------------------------------
    async def generate(self, requests: list[GenerationRequest]) -> tuple[list[GenerationResult], float]:
        started = time.monotonic()
        results = await asyncio.gather(*(self.generate_one(request) for request in requests))
        return list(results), time.monotonic() - started

    async def generate_one(self, request: GenerationRequest) -> GenerationResult:
        from vllm import SamplingParams, TokensPrompt
        from vllm.sampling_params import RequestOutputKind
        flight = Flight(request)
        params = request.params
        prompt = [int(token) for token in (*request.prompt_ids, *request.response_ids)]
        budget = min(params.max_new_tokens - len(flight.ids), self.max_model_len - len(prompt))
        if budget <= 0:
            flight.finish_reason = "length"
            return flight.result()
        stop_ids = list(params.stop_token_ids) + ([] if params.ignore_eos else list(self.eos_ids))
        sampling = SamplingParams(
            n=1, temperature=params.temperature, top_p=params.top_p, top_k=max(params.top_k, 0),
            max_tokens=budget, seed=params.seed if params.seed is not None else request_seed(self.base_seed,
                                                                                              request.request_id),
            ignore_eos=params.ignore_eos, stop_token_ids=stop_ids, logprobs=0, detokenize=False,
            skip_special_tokens=False, output_kind=RequestOutputKind.DELTA)
        self.num_submitted += 1
        flight.vllm_id = f"{request.request_id}#{self.num_submitted}"   # unique while an earlier run finishes
        self.flights[flight.vllm_id] = flight
        try:
            async for output in self.engine.generate(TokensPrompt(prompt_token_ids=prompt), sampling,
                                                     request_id=flight.vllm_id):
                completion = output.outputs[0]
                self.take_tokens(flight, completion)
                if completion.finish_reason is not None:
                    flight.finish_reason = FINISH_REASONS.get(completion.finish_reason, "abort")
        finally:
            del self.flights[flight.vllm_id]
        return flight.result()

    def take_tokens(self, flight: Flight, completion: Any) -> None:
        """Appends a streamed delta's tokens with their log-probs, stamped with the weights now held."""
        token_ids = list(completion.token_ids)
        if len(completion.logprobs or ()) != len(token_ids):
            raise RolloutError(f"{self.name}: vLLM returned {len(token_ids)} tokens with "
                               f"{len(completion.logprobs or ())} log-probs for {flight.request.request_id}")
        for token, candidates in zip(token_ids, completion.logprobs):
            flight.ids.append(int(token))
            flight.log_probs.append(float(candidates[token].logprob))
            flight.versions.append(self.weights_version)

    async def abort(self, request_ids: Optional[list[str]] = None) -> list[GenerationResult]:
        """Ends the given requests (all by default) now; returns their partial results, which their
        `generate` callers receive as well."""
        flights = [flight for flight in self.flights.values()
                   if request_ids is None or flight.request.request_id in request_ids]
        if flights:
            await self.engine.abort([flight.vllm_id for flight in flights])
            await self.wait_for(lambda: not any(flight.vllm_id in self.flights for flight in flights), "abort")
        return [flight.result() for flight in flights]

    async def wait_for(self, condition, what: str) -> None:
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while not condition():
            if time.monotonic() > deadline:
                raise RolloutError(f"{self.name}: vLLM did not return its requests' last tokens within "
                                   f"{DRAIN_TIMEOUT_S:.0f}s of the {what}")
            await asyncio.sleep(0.005)

    async def sleep(self) -> None:
        """A replica on a device of its own keeps its KV cache: nothing else needs the memory."""

    async def wake(self) -> None:
        """See `sleep`."""

    async def num_in_flight(self) -> int:
        return len(self.flights)

    async def version(self) -> int:
        return self.weights_version

    # ---- weight sync --------------------------------------------------------------------------------------
    async def join_weight_group(self, host: str, port: int, rank: int, world_size: int, plan: TransferPlan,
                                timeout_s: float) -> None:
        named_shapes = [(name, tuple(shape)) for name, shape in zip(plan.names, plan.shapes)]
        await self.engine.collective_rpc("asyncrl_join_weight_group", timeout=timeout_s, args=(
            host, port, rank, world_size, named_shapes, str(plan.dtype).removeprefix("torch."), plan.bucket_bytes,
            timeout_s))

    async def receive_weights(self, version: int) -> int:
        """Pause vLLM with its requests kept, take every token sampled so far (old version), load the trainer's
        weights in place, stamp `version`, resume."""
        await self.engine.pause_generation(mode="keep", clear_cache=False)
        try:
            await self.wait_for(self.outputs_taken, "pause")
            (count, self.checksum), = await self.engine.collective_rpc("asyncrl_receive_weights",
                                                                       args=(self.with_checksum,))
            # Cached prefixes hold keys and values the old weights computed: no request may reuse them. vLLM
            # refuses (returns False) to reset while kept requests hold blocks, so those are preempted too: they
            # recompute their tokens so far with the new weights when generation resumes.
            if not await self.engine.reset_prefix_cache(reset_running_requests=True):
                raise RuntimeError(f"{self.name}: vLLM did not reset its prefix cache after loading version "
                                   f"{version}; blocks of the old weights would be reused")
            self.weights_version = int(version)
            return count
        finally:
            await self.engine.resume_generation()

    def outputs_taken(self) -> bool:
        """Whether every output vLLM has handed over for this actor's requests has been read (vLLM's per-request
        collector holds what its consumer has not read yet)."""
        states = self.engine.output_processor.request_states
        return all(states[flight.vllm_id].queue.output is None for flight in self.flights.values()
                   if flight.vllm_id in states)

    async def weights_checksum(self) -> str:
        """The checksum of the weights loaded by the last sync (`rollout.vllm.verify_weights`)."""
        return self.checksum

    async def engine_state(self) -> dict[str, Any]:
        raise RolloutError(f"{self.name}: a vLLM engine does not hand out its parameters (its CPU build repacks "
                           f"them); compare log-probs of fixed sequences instead (`score`)")

    async def score(self, sequences: list[tuple[list[int], list[int]]]) -> list[np.ndarray]:
        """Log-probs (temperature 1) of each (prompt ids, response ids) pair's response tokens under the weights
        held now, as vLLM computes them: a test's view of what the engine holds."""
        from vllm import SamplingParams, TokensPrompt
        results = []
        for index, (prompt, response) in enumerate(sequences):
            sampling = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
            final = None
            async for output in self.engine.generate(TokensPrompt(prompt_token_ids=[*prompt, *response]),
                                                     sampling, request_id=f"score-{uuid.uuid4().hex}-{index}"):
                final = output
            scored = final.prompt_logprobs[len(prompt):]
            results.append(np.asarray([candidates[token].logprob for token, candidates in zip(response, scored)],
                                      np.float32))
        return results


VllmReplicaActor = ray.remote(VllmReplica)
