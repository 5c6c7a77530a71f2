"""Colocated rollout (sync mode): an engine inside each trainer rank, on the rank's own device.

`ColocatedEngine` is the engine as a trainer rank holds it: it wakes to generate and, on GPU, sleeps (KV cache
released) while the rank trains; at a sync it takes the policy the ranks gather, in process.
`ColocatedRollout` is the backend the driver holds: it spreads requests over the ranks and asks each rank to
copy its gathered policy into its engine.

    rollout = ColocatedRollout(context)         # context.trainers host the engines
    results = rollout.start_generate(requests).results()
    rollout.sync_weights(version)
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Iterable

import numpy as np
import torch
from torch import Tensor

from asyncrl.config import AsyncRLConfig
from asyncrl.engine import EngineConfig, GenerationRequest, GenerationResult, LLMEngine
from asyncrl.models.adapted import load_policy
from asyncrl.models.lora import lora_spec
from asyncrl.remote import wait_for_all
from asyncrl.rollout.backend import (PendingGeneration, RolloutBackend, RolloutError, RolloutHealth, WorkerOutput,
                                     spread)
from asyncrl.rollout.kv_budget import log_kv_budget
from asyncrl.rollout.gate import BusyClock, GatedControls, RequestGate
from asyncrl.rollout.registry import ROLLOUT_BACKENDS, RolloutContext


class ColocatedEngine:
    """The engine of one trainer rank (lives in the rank's process)."""

    def __init__(self, config: AsyncRLConfig, device: str):
        engine_config = EngineConfig.from_rollout(config.rollout, device=device, compile=config.model.compile)
        self.engine = LLMEngine(load_policy(config.model.path, lora_spec(config), engine_config.model_dtype,
                                            engine_config.torch_device), engine_config)
        log_kv_budget(self.engine, config, config.trainer.n_gpus_per_node * config.trainer.nnodes, "trainer engine")
        self.release_cache()

    def generate(self, requests: list[GenerationRequest]) -> tuple[list[GenerationResult], float]:
        """Results in request order and the seconds spent."""
        started = time.monotonic()
        self.engine.wake()
        try:
            return self.engine.generate(requests), time.monotonic() - started
        finally:
            self.release_cache()

    def load_weights(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> int:
        return self.engine.update_weights(named_tensors, version)

    def sleep(self) -> None:
        self.engine.sleep()

    def wake(self) -> None:
        self.engine.wake()

    def state(self) -> dict[str, Any]:
        """Every engine parameter as numpy, plus its version (tests compare them bitwise with the trainer)."""
        state = {name: tensor.to("cpu", torch.float32, copy=True).numpy()
                 for name, tensor in self.engine.model.named_parameters()}
        return state | {"__version__": np.int64(self.engine.version)}

    def release_cache(self) -> None:
        """On GPU the KV cache's memory goes back to training between generations; CPU memory is not
        contended, so there the cache stays."""
        if self.engine.config.is_cuda:
            self.engine.sleep()


@ROLLOUT_BACKENDS.register("colocated", placement="colocated",
                           summary="an engine inside each trainer rank, on its device: generation and training "
                                   "take turns, weights move in process")
class ColocatedRollout(GatedControls, RolloutBackend):
    def __init__(self, context: RolloutContext):
        self.trainers = context.trainers
        self.version = 0
        self.gate = RequestGate()
        self.load = [0] * len(self.trainers.actors)   # requests of `generate` calls running on each rank

    def start_generate(self, requests: list[GenerationRequest]) -> PendingGeneration:
        parts = spread(requests, len(self.trainers.actors))
        # Every rank gets a call (maybe empty): generation is not collective, but keeping ranks in step is simpler.
        refs = [actor.generate.remote(part) for actor, part in zip(self.trainers.actors, parts)]
        names, timeout_s = list(self.trainers.names), self.trainers.timeout_s

        def collect() -> list[WorkerOutput]:
            answers = wait_for_all(refs, names, "generate", timeout_s)
            return [WorkerOutput(name, results, seconds) for name, (results, seconds) in zip(names, answers)]

        return PendingGeneration(list(requests), collect)

    async def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """On the least-loaded rank; a dead rank is a dead trainer, which stops the run."""
        await self.gate.enter(len(requests))
        rank = min(range(len(self.load)), key=self.load.__getitem__)
        self.load[rank] += len(requests)
        try:
            results, _ = await self.trainers.actors[rank].generate.remote(requests)
            return results
        finally:
            self.load[rank] -= len(requests)
            await self.gate.leave(len(requests))

    async def abort(self) -> list[GenerationResult]:
        raise RolloutError("rollout.backend=colocated: a trainer rank runs each generate call to its end, so there "
                           "is nothing to abort between engine steps; partial rollout needs a backend on its own "
                           "devices (ray_replicas)")

    def sync_weights(self, version: int) -> None:
        """Each rank copies the full policy into its engine (a collective gather over the trainer ranks)."""
        refs = [actor.sync_local_engine.remote(version) for actor in self.trainers.actors]
        wait_for_all(refs, self.trainers.names, "sync_local_engine", self.trainers.timeout_s)
        self.version = version

    async def sleep(self) -> None:
        refs = [actor.sleep_engine.remote() for actor in self.trainers.actors]
        await asyncio.to_thread(wait_for_all, refs, self.trainers.names, "sleep_engine", self.trainers.timeout_s)

    async def wake(self) -> None:
        refs = [actor.wake_engine.remote() for actor in self.trainers.actors]
        await asyncio.to_thread(wait_for_all, refs, self.trainers.names, "wake_engine", self.trainers.timeout_s)

    def health(self) -> RolloutHealth:
        # The engines live in the trainer ranks: a dead one is a dead trainer rank, which stops the run.
        return RolloutHealth(num_workers=len(self.trainers.actors))

    def activity(self) -> BusyClock:
        return self.gate.clock

    def close(self) -> None:
        """The engines live in the trainer ranks, which the composition root stops."""
