"""The Ray actor of one trainer rank: a `TrainerWorker`, its half of a weight sync, and with a colocated rollout
backend the rank's own engine (`asyncrl.rollout.colocated.ColocatedEngine`).

Batches cross the Ray boundary as numpy arrays (`TrainBatch.to_numpy`), which pickle far faster than
tensors. Called by method, never by name: `actor.update_actor.remote(arrays, spec)`; the driver reaches the
ranks through `TrainerGroup`, rollout backends through its `join_weight_group` / `send_weights` and the
engine's `generate` / `sync_local_engine`.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import numpy as np
import ray
import torch

from asyncrl.config import AsyncRLConfig
from asyncrl.engine import GenerationRequest, GenerationResult
from asyncrl.rollout.colocated import ColocatedEngine
from asyncrl.rollout.delta_transport import DeltaSender, plan_sender
from asyncrl.rollout.weight_transport import SyncStats, TransferPlan, WeightSender, create_group
from asyncrl.train import CriticUpdateSpec, PolicyUpdateSpec, TrainBatch, TrainerWorker


class TrainerRank:
    def __init__(self, config: AsyncRLConfig, rank: int, world_size: int, master_addr: str, master_port: int,
                 total_training_steps: int, host_engine: bool, num_threads: int):
        torch.set_num_threads(num_threads)
        self.worker = TrainerWorker(config, rank, world_size, master_addr, master_port, total_training_steps)
        self.engine = ColocatedEngine(config, str(self.worker.device)) if host_engine else None
        self.sender: Optional[WeightSender | DeltaSender] = None

    def ping(self) -> int:
        return 0

    def pid(self) -> int:
        """This rank's process id on its node: the run logs it at start (for a profiler, or to kill it)."""
        return os.getpid()

    def threads(self) -> tuple[int, str]:
        """This process's torch threads and OpenMP wait policy (asyncrl/launch/cpu_threads.py): logged at start."""
        return torch.get_num_threads(), os.environ.get("OMP_WAIT_POLICY", "")

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
        names = self.worker.sync_tensor_names()
        if names != list(plan.names):
            raise RuntimeError(f"weight sync plan does not match the trainer's parameters ({len(plan.names)} vs "
                               f"{len(names)} tensors)")
        group = create_group(host, port, 0, world_size, self.worker.device, timeout_s)
        # A new sender: a sparse one starts knowing nothing of what the (new) group holds, so it sends dense.
        self.sender = plan_sender(group, plan, self.worker.device)

    def send_weights(self) -> Optional[SyncStats]:
        """Every rank gathers full tensors one by one (a collective); rank 0 broadcasts them in buckets (or
        their deltas) and says what it sent; the other ranks answer None."""
        tensors = self.worker.iter_sync_tensors()
        if self.sender is None:
            for _ in tensors:
                pass
            return None
        return self.sender.sync(tensors, persistent=self.worker.sync_tensors_persist)

    # ---- the colocated engine ---------------------------------------------------------------------------
    def generate(self, requests: list[GenerationRequest]) -> tuple[list[GenerationResult], float]:
        """Results in request order and the seconds spent."""
        return self.require_engine().generate(requests)

    def sync_local_engine(self, version: int) -> int:
        """Copy the full policy into this rank's engine (a collective gather over trainer ranks)."""
        return self.require_engine().load_weights(self.worker.iter_sync_tensors(), version)

    def sleep_engine(self) -> None:
        self.require_engine().sleep()

    def wake_engine(self) -> None:
        self.require_engine().wake()

    def engine_state(self) -> dict[str, Any]:
        return self.require_engine().state()

    def require_engine(self) -> ColocatedEngine:
        if self.engine is None:
            raise RuntimeError("this trainer rank hosts no engine (only rollout.backend=colocated puts one here)")
        return self.engine


TrainerActor = ray.remote(TrainerRank)
