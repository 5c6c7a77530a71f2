"""Rollout replicas on devices of their own behind one owner: where requests go, which replicas are healthy,
what happens when one dies, and their weights.

    rollout = ReplicaSet(context)                # joins the weight group: trainer rank 0 + every replica
    results = await rollout.generate(group)      # one healthy replica (the least loaded); failover inside
    pending = rollout.start_generate(requests)   # spread over the healthy replicas; pending.results() later
    rollout.sync_weights(version)                # re-joins restarted replicas, then transfers

A replica that dies mid-request is taken out of rotation and the request starts again on another healthy
replica (or waits for one). Ray restarts the dead process (`rollout.max_replica_restarts`); the next weight
sync sees its new incarnation, re-forms the group with it and brings it back into rotation. In one-step-off
mode the driver holds this object; in fully-async mode the rollouter actor does, and the driver reaches it
through the rollouter (`hosted.py`). Every wait names the replica or trainer rank that did not answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Optional

import ray
from ray.exceptions import ActorUnavailableError, RayActorError

from asyncrl.engine import GenerationRequest, GenerationResult
from asyncrl.remote import RemoteCallError, RemoteUnavailableError, wait_for_all, worker_name
from asyncrl.rollout.backend import (PendingGeneration, RolloutBackend, RolloutHealth, SyncStats, WorkerOutput,
                                     spread)
from asyncrl.rollout.gate import BusyClock, GatedControls, RequestGate
from asyncrl.rollout.registry import ROLLOUT_BACKENDS, RolloutContext
from asyncrl.rollout.replica import RolloutReplicaActor
from asyncrl.rollout.weight_group import WeightGroup, transfer_plan

logger = logging.getLogger(__name__)


@ROLLOUT_BACKENDS.register("ray_replicas", placement="separate", replica=RolloutReplicaActor,
                           summary="one Ray actor per rollout device, weights broadcast from trainer rank 0; a "
                                   "replica that dies is restarted and re-synced, its requests start again")
class ReplicaSet(GatedControls, RolloutBackend):
    applies_deltas = True   # replicas write what arrives into their parameters in place (weight_sync.encoding)

    def __init__(self, context: RolloutContext):
        config = context.config
        self.replicas = context.replicas
        self.trainers = context.trainers
        self.max_restarts = config.rollout.max_replica_restarts
        self.timeout_s = config.ray.rpc_timeout_s
        self.sync_timeout_s = config.weight_sync.timeout_s
        self.names = [worker_name("rollout", index) for index in range(len(self.replicas))]
        self.gate = RequestGate()
        self.load = [0] * len(self.replicas)          # requests of `generate` calls running on each replica
        self.is_healthy = [True] * len(self.replicas)
        self.num_restarts = 0                         # replicas Ray restarted that re-joined
        self.num_failures = 0
        self.num_requeued = 0
        self.version = 0
        self.last_sync: Optional[SyncStats] = None
        plan = transfer_plan(config, context.engine_dtype, self.applies_deltas)
        self.weights = WeightGroup(self.trainers, self.replicas, self.names, plan, context.weight_address)
        self.incarnations = self.connect()

    # ---- generation -----------------------------------------------------------------------------------
    async def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """In one call to one healthy replica (the least loaded); if it dies mid-call it is taken out of rotation
        until the next sync re-joins it, and the requests start again on a healthy replica."""
        while True:
            await self.gate.enter(len(requests), can_start=lambda: any(self.is_healthy))
            # Nothing awaits between the gate and the call, so the replica chosen is still healthy.
            index = min((i for i, healthy in enumerate(self.is_healthy) if healthy), key=self.load.__getitem__)
            self.load[index] += len(requests)
            try:
                results, _ = await self.replicas[index].generate.remote(requests)
                return results
            except (RayActorError, ActorUnavailableError):
                if self.is_healthy[index]:
                    self.is_healthy[index] = False
                    self.num_failures += 1
                self.num_requeued += len(requests)
            finally:
                self.load[index] -= len(requests)
                await self.gate.leave(len(requests))

    def start_generate(self, requests: list[GenerationRequest]) -> PendingGeneration:
        healthy = [index for index, is_healthy in enumerate(self.is_healthy) if is_healthy]
        if not healthy:
            raise RemoteUnavailableError(f"{', '.join(self.names)}: every rollout replica died mid-request and "
                                         f"waits for a weight sync to re-join it")
        refs, names = [], []
        for index, part in zip(healthy, spread(requests, len(healthy))):
            if part:
                refs.append(self.replicas[index].generate.remote(part))
                names.append(self.names[index])
        timeout_s = self.timeout_s

        def collect() -> list[WorkerOutput]:
            answers = wait_for_all(refs, names, "generate", timeout_s)
            return [WorkerOutput(name, results, seconds) for name, (results, seconds) in zip(names, answers)]

        return PendingGeneration(list(requests), collect)

    async def abort(self) -> list[GenerationResult]:
        """Aborts on every healthy replica (a dead replica's requests failed already: they are re-queued)."""
        answers = await asyncio.gather(*(replica.abort.remote() for replica, healthy in
                                         zip(self.replicas, self.is_healthy) if healthy), return_exceptions=True)
        return [result for answer in answers if isinstance(answer, list) for result in answer]

    # ---- weights ----------------------------------------------------------------------------------------
    def connect(self) -> list[str]:
        """(Re-)form the weight group with every replica, once each is up; returns their incarnations."""
        incarnations = self.ping_all()
        self.weights.connect(self.sync_timeout_s)
        return incarnations

    def ping_all(self) -> list[str]:
        """Every replica's incarnation, waiting (up to the sync timeout) for one Ray is restarting; replicas
        are named by the index they were started with."""
        deadline = time.monotonic() + self.sync_timeout_s
        while True:
            try:
                answers = wait_for_all([replica.ping.remote() for replica in self.replicas], self.names, "ping",
                                       self.timeout_s)
                self.names[:] = [worker_name("rollout", index) for index, _ in answers]
                return [incarnation for _, incarnation in answers]
            except RemoteUnavailableError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def restarted_replicas(self) -> list[str]:
        """Replicas Ray restarted since the weight group formed (waits for them to be up again)."""
        return [name for name, incarnation, known in zip(self.names, self.ping_all(), self.incarnations)
                if incarnation != known]

    def sync_weights(self, version: int) -> None:
        """Pause, broadcast the trainer's weights into every replica, stamp `version`, resume. A replica that
        Ray restarted (before or during the sync) rejoins, with every other member, a new weight group, and the
        transfer is repeated. Afterwards every replica is back in rotation."""
        restarted = self.restarted_replicas()
        if restarted:
            self.reconnect(restarted)
        for attempt in range(self.max_restarts + 1):
            try:
                self.last_sync = self.weights.transfer(version, self.sync_timeout_s)
                break
            except RemoteCallError as error:
                restarted = self.restarted_replicas()
                if not restarted or attempt == self.max_restarts:
                    raise
                logger.warning("weight sync failed because %s restarted (%s); re-forming the group and retrying",
                               ", ".join(restarted), error)
                self.reconnect(restarted)
        self.version = version
        self.is_healthy = [True] * len(self.replicas)

    def sync_stats(self) -> Optional[SyncStats]:
        return self.last_sync

    def reconnect(self, restarted: list[str]) -> None:
        started = time.monotonic()
        self.incarnations = self.connect()
        self.num_restarts += len(restarted)
        logger.warning("weight group re-formed after %s restarted, in %.1fs", ", ".join(restarted),
                       time.monotonic() - started)

    def engine_states(self) -> list[dict[str, Any]]:
        """Every replica's parameters as numpy, plus its version (tests compare them with the trainer's)."""
        return wait_for_all([replica.engine_state.remote() for replica in self.replicas], self.names, "engine_state",
                            self.timeout_s)

    # ---- memory, health ---------------------------------------------------------------------------------
    async def sleep(self) -> None:
        refs = [replica.sleep.remote() for replica in self.replicas]
        await asyncio.to_thread(wait_for_all, refs, self.names, "sleep", self.timeout_s)

    async def wake(self) -> None:
        refs = [replica.wake.remote() for replica in self.replicas]
        await asyncio.to_thread(wait_for_all, refs, self.names, "wake", self.timeout_s)

    def health(self) -> RolloutHealth:
        unhealthy = tuple(name for name, healthy in zip(self.names, self.is_healthy) if not healthy)
        return RolloutHealth(len(self.replicas), unhealthy, self.num_restarts, self.num_failures, self.num_requeued)

    def activity(self) -> BusyClock:
        return self.gate.clock

    def close(self) -> None:
        for replica in self.replicas:
            ray.kill(replica)
