"""Rollout on separate devices (one-step-off and fully-async modes): replicas behind one handle.

    rollout = ReplicaRollout(replicas, trainers, config)
    rollout.connect_weights()                    # once: the weight-sync group
    results = rollout.generate(requests)         # blocking
    pending = rollout.start_generate(requests)   # non-blocking; pending.results() later
    rollout.sync_weights(version)                # pause -> broadcast -> load -> version -> resume, per replica

Every wait names the replica or trainer rank that did not answer.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import ray
import torch

from asyncrl.config import AsyncRLConfig
from asyncrl.core.rollout import PendingGeneration, spread
from asyncrl.core.trainer_group import TrainerGroup
from asyncrl.distributed.remote import (STILL_RUNNING, RemoteCallError, RemoteTimeoutError, RemoteUnavailableError,
                                       settle, wait_for_all)
from asyncrl.distributed.resource_pool import worker_name
from asyncrl.distributed.weight_transport import TransferPlan
from asyncrl.engine import GenerationRequest, GenerationResult
from asyncrl.models import CausalLM, read_config


logger = logging.getLogger(__name__)


def transfer_plan(config: AsyncRLConfig, engine_dtype: torch.dtype) -> TransferPlan:
    """The parameter list of the policy, from its config alone (a meta-device model: no weights)."""
    model_config, _ = read_config(config.model.path)
    with torch.device("meta"):
        model = CausalLM(model_config)
    named_shapes = [(name, tuple(parameter.shape)) for name, parameter in model.named_parameters()]
    return TransferPlan.build(named_shapes, engine_dtype, config.weight_sync.bucket_mb << 20)


# Members of one transfer start within moments of each other, so their transports time out within this of
# `weight_sync.timeout_s` after the transfer's start.
SETTLE_GRACE_S = 5.0


class ReplicaRollout:
    def __init__(self, replicas: list[Any], trainers: TrainerGroup, config: AsyncRLConfig,
                 engine_dtype: torch.dtype, new_address: Callable[[], tuple[str, int]]):
        self.replicas = replicas
        self.trainers = trainers
        self.config = config
        self.engine_dtype = engine_dtype
        self.new_address = new_address          # a fresh (host, port) on trainer rank 0's node
        self.names = [worker_name("rollout", index) for index in range(len(replicas))]
        self.timeout_s = config.ray.rpc_timeout_s
        self.sync_timeout_s = config.weight_sync.timeout_s
        self.incarnations: list[str] = []
        self.num_restarts = 0              # replicas Ray restarted that re-joined
        self.version = 0

    def wait(self, refs: list, names: list[str], call: str, timeout_s: float | None = None) -> list:
        return wait_for_all(refs, names, call, timeout_s or self.timeout_s)

    def connect_weights(self) -> TransferPlan:
        """Form the weight-sync group: trainer rank 0 is rank 0, replica i is rank i + 1 (again after a
        replica restarted: a new process must join a new group)."""
        self.incarnations = self.ping_all()
        host, port = self.new_address()
        plan = transfer_plan(self.config, self.engine_dtype)
        world_size = len(self.replicas) + 1
        refs = [self.trainers.actors[0].join_weight_group.remote(host, port, world_size, plan, self.sync_timeout_s)]
        refs += [replica.join_weight_group.remote(host, port, index + 1, world_size, plan, self.sync_timeout_s)
                 for index, replica in enumerate(self.replicas)]
        self.wait(refs, [self.trainers.names[0]] + self.names, "join_weight_group", self.sync_timeout_s)
        return plan

    def start_generate(self, requests: list[GenerationRequest]) -> PendingGeneration:
        parts = spread(requests, len(self.replicas))
        refs, names = [], []
        for replica, name, part in zip(self.replicas, self.names, parts):
            if part:
                refs.append(replica.generate_batch.remote(part))
                names.append(name)
        return PendingGeneration(list(requests), refs, names, self.timeout_s)

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        return self.start_generate(requests).results()

    def ping_all(self) -> list[str]:
        """Every replica's incarnation, waiting (up to the sync timeout) for one Ray is restarting."""
        deadline = time.monotonic() + self.sync_timeout_s
        while True:
            try:
                return [incarnation for _, incarnation in
                        self.wait([replica.ping.remote() for replica in self.replicas], self.names, "ping")]
            except RemoteUnavailableError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def restarted_replicas(self) -> list[str]:
        """Replicas Ray restarted since the weight group formed (waits for them to be up again)."""
        return [name for name, incarnation, known in zip(self.names, self.ping_all(), self.incarnations)
                if incarnation != known]

    def sync_weights(self, version: int) -> None:
        """Pause, broadcast the trainer's weights into every replica, stamp `version`, resume. A replica
        that Ray restarted (before or during the sync) rejoins, with every other member, a new weight
        group, and the transfer is repeated."""
        restarted = self.restarted_replicas()
        if restarted:
            self.reconnect(restarted)
        for attempt in range(self.config.rollout.max_replica_restarts + 1):
            try:
                self.transfer(version)
                return
            except RemoteCallError as error:
                restarted = self.restarted_replicas()
                if not restarted or attempt == self.config.rollout.max_replica_restarts:
                    raise
                logger.warning("weight sync failed because %s restarted (%s); re-forming the group and retrying",
                               ", ".join(restarted), error)
                self.reconnect(restarted)

    def transfer(self, version: int) -> None:
        """Each replica pauses its stepping, receives and loads, stamps `version` and resumes, in one call."""
        refs = [actor.send_weights.remote() for actor in self.trainers.actors]
        refs += [replica.receive_weights.remote(version) for replica in self.replicas]
        names = self.trainers.names + self.names
        started = time.monotonic()
        try:
            self.wait(refs, names, "sync_weights", self.sync_timeout_s)
        except RemoteCallError as error:
            # The surviving members see the broken group only when their transport times out (gloo waits
            # for a dead receiver's ready signal until `weight_sync.timeout_s`, counted from the transfer's
            # start); wait for them, so a new group is not queued behind a stuck broadcast.
            failed = time.monotonic()
            outcomes = settle(refs, names, max(0.0, started + self.sync_timeout_s + SETTLE_GRACE_S - failed))
            logger.warning("weight sync members settled %.1fs after the failure: %s", time.monotonic() - failed,
                           outcomes)
            stuck = [name for name, outcome in outcomes.items() if outcome == STILL_RUNNING]
            if stuck:
                # A member that never took part makes the others' transports time out, and one of those
                # errors may arrive before the wait's own deadline: the member to blame is the stuck one.
                raise RemoteTimeoutError(f"{', '.join(stuck)}: sync_weights did not answer within "
                                         f"{self.sync_timeout_s:.0f}s (the other members' transports gave up "
                                         f"waiting for it: {error})") from error
            raise
        self.version = version

    def reconnect(self, restarted: list[str]) -> None:
        started = time.monotonic()
        self.connect_weights()
        self.num_restarts += len(restarted)
        logger.warning("weight group re-formed after %s restarted, in %.1fs", ", ".join(restarted),
                       time.monotonic() - started)

    def fault_metrics(self) -> dict[str, float]:
        return {"faults/replica_restarts": float(self.num_restarts)}

    def engine_states(self) -> list[dict[str, Any]]:
        return self.wait([replica.engine_state.remote() for replica in self.replicas], self.names, "engine_state")

    def close(self) -> None:
        for replica in self.replicas:
            ray.kill(replica)
