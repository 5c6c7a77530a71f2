"""The Ray actor of one trainer rank: a `TrainerWorker`, and in colocated mode the rank's own engine.

Batches cross the Ray boundary as numpy arrays (`TrainBatch.to_numpy`), which pickle far faster than
tensors. Called by method, never by name: `actor.update_actor.remote(arrays, spec)`.

In colocated (sync) mode the engine shares the rank's device: it generates, then sleeps (KV cache
released) while the trainer runs, and `sync_local_engine` copies the gathered policy into it in process.
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

import numpy as np
import ray
import torch

from asyncrl.config import AsyncRLConfig
from asyncrl.distributed.weight_transport import TransferPlan, WeightSender, create_group
from asyncrl.engine import EngineConfig, GenerationRequest, GenerationResult, LLMEngine
from asyncrl.train import CriticUpdateSpec, PolicyUpdateSpec, TrainBatch, TrainerWorker


class TrainerRank:
    def __init__(self, config: AsyncRLConfig, rank: int, world_size: int, master_addr: str, master_port: int,
                 total_training_steps: int, host_engine: bool, num_threads: int):
        torch.set_num_threads(num_threads)
        self.worker = TrainerWorker(config, rank, world_size, master_addr, master_port, total_training_steps)
        self.engine: Optional[LLMEngine] = None
        self.sender: Optional[WeightSender] = None
        if host_engine:
            device = str(self.worker.device)
            engine_config = EngineConfig.from_rollout(config.rollout, device=device, compile=config.model.compile)
            self.engine = LLMEngine(config.model.path, engine_config)
            self.release_cache()

    def ping(self) -> int:
        return 0

    def pid(self) -> int:
        """This rank's process id on its node: the run logs it at start (for a profiler, or to kill it)."""
        return os.getpid()

    def compute_log_prob(self, arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        log_probs, entropy = self.worker.compute_log_prob(TrainBatch.from_numpy(arrays))
        return log_probs.numpy(), entropy.numpy()

    def snapshot_policy(self) -> None:
        """Keep a host copy of this rank's policy shards (the proximal policy of decoupled mode)."""
        self.worker.actor.snapshot()

    def compute_log_prob_snapshot(self, arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Log-probs under the snapshot weights (swapped in, then back)."""
        self.worker.actor.swap_snapshot()
        try:
            return self.compute_log_prob(arrays)
        finally:
            self.worker.actor.swap_snapshot()

    def compute_ref_log_prob(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        return self.worker.compute_ref_log_prob(TrainBatch.from_numpy(arrays)).numpy()

    def compute_values(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        return self.worker.compute_values(TrainBatch.from_numpy(arrays)).numpy()

    def update_actor(self, arrays: dict[str, np.ndarray], spec: PolicyUpdateSpec) -> dict[str, float]:
        return self.worker.update_actor(TrainBatch.from_numpy(arrays), spec)

    def update_critic(self, arrays: dict[str, np.ndarray], spec: CriticUpdateSpec) -> dict[str, float]:
        return self.worker.update_critic(TrainBatch.from_numpy(arrays), spec)

    def save_checkpoint(self, folder: str) -> None:
        self.worker.save_checkpoint(folder)

    def load_checkpoint(self, folder: str) -> None:
        self.worker.load_checkpoint(folder)

    def export_policy(self, folder: str) -> None:
        self.worker.export_policy(folder)

    def policy_state(self) -> dict[str, Any]:
        return self.worker.policy_state_numpy()

    # ---- weight sync to separate rollout replicas -------------------------------------------------------
    def join_weight_group(self, host: str, port: int, world_size: int, plan: TransferPlan, timeout_s: float) -> None:
        """Rank 0 joins the weight group as its sender (group rank 0); other ranks only help gather full
        tensors during a sync."""
        names = [name for name, _ in self.worker.actor.model.named_parameters()]
        if names != list(plan.names):
            raise RuntimeError(f"weight sync plan does not match the trainer's parameters ({len(plan.names)} vs "
                               f"{len(names)} tensors)")
        group = create_group(host, port, 0, world_size, self.worker.device, timeout_s)
        self.sender = WeightSender(group, plan, self.worker.device)

    def send_weights(self) -> int:
        """Every rank gathers full tensors one by one (a collective); rank 0 broadcasts them in buckets."""
        tensors = self.worker.iter_sync_tensors()
        if self.sender is None:
            for _ in tensors:
                pass
            return 0
        return self.sender.send(tensors, persistent=self.worker.sync_tensors_persist)

    # ---- colocated engine ---------------------------------------------------------------------------
    def generate(self, requests: list[GenerationRequest]) -> tuple[list[GenerationResult], float]:
        """Results in request order and the seconds spent."""
        engine = self.require_engine()
        started = time.monotonic()
        engine.wake()
        try:
            return engine.generate(requests), time.monotonic() - started
        finally:
            self.release_cache()

    def sync_local_engine(self, version: int) -> int:
        """Copy the full policy into this rank's engine (a collective gather over trainer ranks)."""
        return self.require_engine().update_weights(self.worker.iter_sync_tensors(), version)

    def engine_state(self) -> dict[str, Any]:
        engine = self.require_engine()
        return {name: tensor.to("cpu", torch.float32, copy=True).numpy()
                for name, tensor in engine.model.named_parameters()} | {"__version__": engine.version}

    def release_cache(self) -> None:
        """On GPU the KV cache's memory goes back to training between generations; CPU memory is not
        contended, so there the cache stays."""
        if self.require_engine().config.is_cuda:
            self.require_engine().sleep()

    def require_engine(self) -> LLMEngine:
        if self.engine is None:
            raise RuntimeError("this trainer rank hosts no engine (only trainer.mode=sync colocates one)")
        return self.engine


TrainerActor = ray.remote(TrainerRank)
