"""A rollout replica on its own device: an asyncio Ray actor around one `AsyncEngine`.

Requests are served concurrently (the actor is async), weights arrive over the weight-sync group
(`join_weight_group`, then `receive_weights` per sync, which pauses stepping while it copies), and every token
is stamped with the version of the weights that produced it. Its incarnation (a fresh id per process) tells
the replica set that Ray restarted it, so it must re-join the weight group before it is used again.

    replica = RolloutReplicaActor.options(num_cpus=0.5).remote(config, index=0, num_threads=1)
    results, seconds = await replica.generate.remote(requests)
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from typing import Any, Optional

import numpy as np
import ray
import torch

from asyncrl.config import AsyncRLConfig
from asyncrl.engine import AsyncEngine, EngineConfig, GenerationRequest, GenerationResult, LLMEngine
from asyncrl.models.adapted import load_policy
from asyncrl.models.lora import lora_spec
from asyncrl.rollout.kv_budget import log_kv_budget
from asyncrl.rollout.delta_transport import DeltaReceiver, plan_receiver
from asyncrl.rollout.weight_transport import TransferPlan, WeightReceiver, create_group


class RolloutReplica:
    def __init__(self, config: AsyncRLConfig, index: int, num_threads: int):
        torch.set_num_threads(num_threads)
        self.index = index
        device = "cuda" if torch.cuda.is_available() and config.trainer.device != "cpu" else "cpu"
        engine_config = EngineConfig.from_rollout(config.rollout, device, compile=config.model.compile,
                                                  dtype=EngineConfig.weights_dtype(config.model.dtype, device == "cuda"))
        model = load_policy(config.model.path, lora_spec(config), engine_config.model_dtype, engine_config.torch_device)
        engine = LLMEngine(model, engine_config)
        log_kv_budget(engine, config, config.rollout.n_gpus_per_node * config.rollout.nnodes, f"rollout/replica{index}")
        self.engine = AsyncEngine(engine)
        self.receiver: Optional[WeightReceiver | DeltaReceiver] = None
        self.incarnation = uuid.uuid4().hex  # changes when Ray restarts this replica after a death

    async def ping(self) -> tuple[int, str]:
        """(index, incarnation)."""
        return self.index, self.incarnation

    async def pid(self) -> int:
        """This replica's process id on its node: the run logs it at start (for a profiler, or to kill it)."""
        return os.getpid()

    async def threads(self) -> tuple[int, str]:
        """This process's torch threads and OpenMP wait policy (asyncrl/launch/cpu_threads.py): logged at start."""
        return torch.get_num_threads(), os.environ.get("OMP_WAIT_POLICY", "")

    async def generate(self, requests: list[GenerationRequest]) -> tuple[list[GenerationResult], float]:
        """All requests at once (continuous batching inside); results in request order, and the seconds
        this replica spent on them (so a caller that waited less can tell how much generation it hid)."""
        started = time.monotonic()
        results = await asyncio.gather(*(self.engine.generate(request) for request in requests))
        return list(results), time.monotonic() - started

    async def abort(self, request_ids: Optional[list[str]] = None) -> list[GenerationResult]:
        return await self.engine.abort(request_ids)

    async def sleep(self) -> None:
        await self.engine.sleep()

    async def wake(self) -> None:
        await self.engine.wake()

    async def num_in_flight(self) -> int:
        return self.engine.num_in_flight

    async def version(self) -> int:
        return self.engine.engine.version

    # ---- weight sync --------------------------------------------------------------------------------
    async def join_weight_group(self, host: str, port: int, rank: int, world_size: int, plan: TransferPlan,
                                timeout_s: float) -> None:
        device = self.engine.engine.runner.device
        group = await asyncio.to_thread(create_group, host, port, rank, world_size, device, timeout_s)
        self.receiver = plan_receiver(group, plan, device)

    async def receive_weights(self, version: int) -> int:
        """Pause stepping, receive the trainer's weights into the engine in place, stamp new tokens with
        `version`, resume: the copy happens between two engine steps, so no generation sees a weight
        change half-way through a step, and requests in flight continue with the new weights."""
        if self.receiver is None:
            raise RuntimeError(f"rollout/replica{self.index}: receive_weights before join_weight_group")
        await self.engine.pause()
        try:
            return await self.engine.update_weights_in_place(self.receiver.receive_into, version)
        finally:
            await self.engine.resume()

    async def engine_state(self) -> dict[str, Any]:
        """Every engine parameter as numpy, plus its version (tests compare them bitwise with the trainer)."""
        engine = self.engine.engine
        state = {name: parameter.detach().to("cpu", torch.float32, copy=True).numpy()
                 for name, parameter in engine.model.named_parameters()}
        state["__version__"] = np.int64(engine.version)
        return state


RolloutReplicaActor = ray.remote(RolloutReplica)
