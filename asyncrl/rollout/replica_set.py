"""Rollout replicas on devices of their own behind one owner: where requests go, which replicas are healthy,
what happens when one dies or keeps dying, how many there are, and their weights.

    rollout = ReplicaSet(context)                # joins the weight group: trainer rank 0 + every replica
    results = await rollout.generate(group)      # one healthy replica (the least loaded); failover inside
    pending = rollout.start_generate(requests)   # spread over the healthy replicas; pending.results() later
    rollout.sync_weights(version)                # applies a scale request, re-joins restarted replicas, transfers

A replica that dies mid-request is taken out of rotation and the request starts again on another healthy
replica (or waits for one). Ray restarts the dead process (`rollout.max_replica_restarts`); the next weight
sync sees its new incarnation, re-forms the group with it and brings it back into rotation. A replica that fails
`rollout.max_replica_failures` times in a row (or that Ray will not restart any more) is retired at the next sync
instead, with a warning naming it, and the run goes on with the others. At every sync the set also applies a
scale request (`asyncrl scale RUN_DIR --replicas N`, `elastic.py`): new replicas join the weight group before they
take work, removed ones are drained first. In one-step-off mode the driver holds this object; in fully-async mode
the rollouter actor does, and the driver reaches it through the rollouter (`hosted.py`). Every wait names the
replica or trainer rank that did not answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Optional

import ray
from ray.exceptions import ActorUnavailableError, RayActorError

from asyncrl.engine import GenerationRequest, GenerationResult
from asyncrl.remote import (RemoteCallError, RemoteTimeoutError, RemoteUnavailableError, wait_for, wait_for_all,
                            worker_name)
from asyncrl.rollout.backend import (PendingGeneration, RolloutBackend, RolloutError, RolloutHealth, SyncStats,
                                     WorkerOutput, spread)
from asyncrl.rollout.elastic import read_scale_request
from asyncrl.rollout.gate import BusyClock, GatedControls, RequestGate
from asyncrl.rollout.registry import ROLLOUT_BACKENDS, RolloutContext
from asyncrl.rollout.replica import RolloutReplicaActor
from asyncrl.rollout.weight_group import WeightGroup, transfer_plan

logger = logging.getLogger(__name__)

DRAIN_POLL_S = 0.2


@dataclass(eq=False)
class Member:
    """One replica of the set: its actor and what the set knows of it."""
    actor: Any
    index: int                   # the index it was started with (its name)
    incarnation: str = ""        # its process's id when it last joined the weight group
    seen: str = ""               # its process's id when a ping last answered
    death_counted: bool = False  # it died mid-request (counted); the restart a ping finds next is that death
    load: int = 0                # requests of `generate` calls running on it
    is_healthy: bool = True      # in rotation
    failures_in_row: int = 0     # deaths (mid-request or as a restart seen at a sync) since its last success

    @property
    def name(self) -> str:
        return worker_name("rollout", self.index)


@ROLLOUT_BACKENDS.register("ray_replicas", placement="separate", replica=RolloutReplicaActor,
                           summary="one Ray actor per rollout device, weights broadcast from trainer rank 0; a "
                                   "replica that dies is restarted and re-synced, its requests start again")
class ReplicaSet(GatedControls, RolloutBackend):
    applies_deltas = True   # replicas write what arrives into their parameters in place (weight_sync.encoding)

    def __init__(self, context: RolloutContext):
        config = context.config
        self.trainers = context.trainers
        self.launch = context.launch_replica          # one more replica actor, by index (None: the set is fixed)
        self.run_dir = config.trainer.output_dir
        self.max_restarts = config.rollout.max_replica_restarts
        self.max_failures = config.rollout.max_replica_failures
        self.timeout_s = config.ray.rpc_timeout_s
        self.sync_timeout_s = config.weight_sync.timeout_s
        self.members = [Member(actor, index) for index, actor in enumerate(context.replicas)]
        self.gate = RequestGate()
        self.num_restarts = 0                         # replicas Ray restarted that re-joined
        self.num_failures = 0
        self.num_requeued = 0
        self.num_retired = 0
        self.num_resizes = 0
        self.version = 0
        self.last_sync: Optional[SyncStats] = None
        self.joined: list[Member] = []                # the members of the weight group, as it formed
        plan = transfer_plan(config, context.engine_dtype, self.applies_deltas)
        self.weights = WeightGroup(self.trainers, plan, context.weight_address)
        self.connect()

    @property
    def replicas(self) -> list[Any]:
        return [member.actor for member in self.members]

    @property
    def names(self) -> list[str]:
        return [member.name for member in self.members]

    # ---- generation -----------------------------------------------------------------------------------
    async def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """In one call to one healthy replica (the least loaded); if it dies mid-call it is taken out of rotation
        until the next sync re-joins it, and the requests start again on a healthy replica."""
        while True:
            await self.gate.enter(len(requests), can_start=lambda: any(m.is_healthy for m in self.members))
            # Nothing awaits between the gate and the call, so the replica chosen is still healthy.
            member = min((m for m in self.members if m.is_healthy), key=lambda m: m.load)
            member.load += len(requests)
            try:
                results, _ = await member.actor.generate.remote(requests)
                member.failures_in_row = 0
                return results
            except (RayActorError, ActorUnavailableError):
                self.mark_failed(member)
                self.num_requeued += len(requests)
            finally:
                member.load -= len(requests)
                await self.gate.leave(len(requests))

    def mark_failed(self, member: Member) -> None:
        if member.is_healthy:
            member.is_healthy = False
            member.failures_in_row += 1
            member.death_counted = True
            self.num_failures += 1

    def start_generate(self, requests: list[GenerationRequest]) -> PendingGeneration:
        healthy = [member for member in self.members if member.is_healthy]
        if not healthy:
            raise RemoteUnavailableError(f"{', '.join(self.names)}: every rollout replica died mid-request and "
                                         f"waits for a weight sync to re-join it")
        refs, chosen = [], []
        for member, part in zip(healthy, spread(requests, len(healthy))):
            if part:
                refs.append(member.actor.generate.remote(part))
                chosen.append(member)
        timeout_s = self.timeout_s

        def collect() -> list[WorkerOutput]:
            answers = wait_for_all(refs, [member.name for member in chosen], "generate", timeout_s)
            for member in chosen:
                member.failures_in_row = 0
            return [WorkerOutput(member.name, results, seconds) for member, (results, seconds) in zip(chosen, answers)]

        return PendingGeneration(list(requests), collect)

    async def abort(self) -> list[GenerationResult]:
        """Aborts on every healthy replica (a dead replica's requests failed already: they are re-queued)."""
        answers = await asyncio.gather(*(member.actor.abort.remote() for member in self.members if member.is_healthy),
                                       return_exceptions=True)
        return [result for answer in answers if isinstance(answer, list) for result in answer]

    # ---- weights ----------------------------------------------------------------------------------------
    def connect(self) -> None:
        """(Re-)form the weight group with every replica, once each is up (one Ray will not restart is retired)."""
        self.restarted_replicas()
        self.weights.connect(self.replicas, self.names, self.sync_timeout_s)
        for member in self.members:
            member.incarnation = member.seen
        self.joined = list(self.members)

    def ping_all(self) -> dict[Member, str]:
        """Every replica's incarnation, waiting (up to the sync timeout) for one Ray is restarting; replicas
        are named by the index they were started with. A replica that is dead for good, or not back by then, is
        retired."""
        deadline = time.monotonic() + self.sync_timeout_s
        answers: dict[Member, str] = {}
        while True:
            waiting = [member for member in self.members if member not in answers]
            refs = [member.actor.ping.remote() for member in waiting]
            for member, ref in zip(waiting, refs):
                try:
                    member.index, answers[member] = wait_for(ref, member.name, "ping", self.timeout_s)
                except RemoteUnavailableError as error:
                    if time.monotonic() > deadline:
                        self.retire(member, f"Ray did not bring it back within weight_sync.timeout_s="
                                            f"{self.sync_timeout_s:.0f}s ({error})")
                except RemoteCallError as error:
                    self.retire(member, f"it died and Ray does not restart it ({error})")
            if all(member in answers for member in self.members):
                return answers
            time.sleep(0.5)

    def restarted_replicas(self) -> list[Member]:
        """Replicas Ray restarted since the weight group formed (waits for them to be up again). Each new process
        a ping finds is a death of that replica, counted unless it died mid-request (counted then)."""
        answers = self.ping_all()
        for member in self.members:
            if answers[member] != member.seen and member.seen:
                if member.death_counted:
                    member.death_counted = False
                else:
                    member.failures_in_row += 1
            member.seen = answers[member]
        return [member for member in self.members if member.incarnation and member.incarnation != member.seen]

    def sync_weights(self, version: int) -> None:
        """Pause, broadcast the trainer's weights into every replica, stamp `version`, resume. Before the transfer
        the set takes the size a scale request asks for and retires the replicas that failed too often in a row; a
        replica that Ray restarted (before or during the sync) rejoins, with every other member, a new weight
        group, and the transfer is repeated. Afterwards every replica is in rotation."""
        self.apply_scale_request()
        self.repair()
        for attempt in range(self.max_restarts + 1):
            try:
                self.last_sync = self.weights.transfer(version, self.sync_timeout_s)
                break
            except RemoteCallError as error:
                if attempt == self.max_restarts or not self.repair():
                    raise
                logger.warning("weight sync failed (%s); the weight group was re-formed, retrying", error)
        self.version = version
        for member in self.members:
            member.is_healthy = True

    def repair(self) -> bool:
        """Re-forms the weight group if a member restarted, or the members changed (retired, grown, shrunk) since
        it formed; whether it did. A member that dies while the group forms is one more failure of it, and the
        group forms again (up to rollout.max_replica_restarts times)."""
        for attempt in range(self.max_restarts + 1):
            restarted = self.restarted_replicas()
            self.retire_failing()
            if not restarted and self.members == self.joined:
                return attempt > 0
            try:
                self.reconnect([member.name for member in restarted if member in self.members])
                return True
            except (RemoteCallError, RemoteTimeoutError) as error:
                if attempt == self.max_restarts:
                    raise
                logger.warning("forming the weight group failed (%s); forming it again", error)
        return True

    def sync_stats(self) -> Optional[SyncStats]:
        return self.last_sync

    def reconnect(self, restarted: list[str]) -> None:
        started = time.monotonic()
        self.connect()
        self.num_restarts += len(restarted)
        logger.warning("weight group re-formed with %d replicas%s, in %.1fs", len(self.members),
                       f" after {', '.join(restarted)} restarted" if restarted else "", time.monotonic() - started)

    def engine_states(self) -> list[dict[str, Any]]:
        """Every replica's parameters as numpy, plus its version (tests compare them with the trainer's)."""
        return wait_for_all([replica.engine_state.remote() for replica in self.replicas], self.names, "engine_state",
                            self.timeout_s)

    # ---- membership ---------------------------------------------------------------------------------------
    def retire(self, member: Member, reason: str) -> None:
        """Stops a replica for good and takes it out of the set; the run goes on with the others."""
        self.members.remove(member)
        self.num_retired += 1
        ray.kill(member.actor)
        logger.warning("%s retired: %s; %d rollout replica(s) go on", member.name, reason, len(self.members))
        if not self.members:
            raise RolloutError(f"{member.name} was the last rollout replica and it was retired: {reason}")

    def retire_failing(self) -> None:
        """Retires every replica that failed `rollout.max_replica_failures` times in a row."""
        for member in [member for member in self.members if member.failures_in_row >= self.max_failures]:
            self.retire(member, f"it failed {member.failures_in_row} times in a row "
                                f"(rollout.max_replica_failures={self.max_failures})")

    def apply_scale_request(self) -> None:
        """Grows or shrinks the set to the size `asyncrl scale` asked for (nothing asked, or the size it has:
        nothing). Called at a sync, before the transfer."""
        target = read_scale_request(self.run_dir)
        if target is None or target == len(self.members):
            return
        if self.launch is None:
            logger.warning("scale request for %d replicas ignored: this rollout backend cannot start replicas", target)
            return
        before = len(self.members)
        if target > before:
            self.grow(target - before)
        else:
            self.shrink(before - target)
        if len(self.members) != before:
            self.num_resizes += 1
            logger.warning("rollout replicas: %d -> %d (%s)", before, len(self.members), ", ".join(self.names))

    def grow(self, count: int) -> None:
        """Starts `count` replicas and adds those that come up within the sync timeout; they receive the weights
        in the transfer that follows, before any request reaches them."""
        first = max((member.index for member in self.members), default=-1) + 1
        started = [Member(self.launch(index), index) for index in range(first, first + count)]
        try:
            answers = wait_for_all([member.actor.ping.remote() for member in started],
                                   [member.name for member in started], "ping", self.sync_timeout_s)
        except (RemoteCallError, RemoteTimeoutError) as error:
            for member in started:
                ray.kill(member.actor)
            logger.warning("could not start %d more rollout replica(s), going on with %d: %s (is a device free on "
                           "some node?)", count, len(self.members), error)
            return
        for member, (_, incarnation) in zip(started, answers):
            member.seen = incarnation
        self.members += started

    def shrink(self, count: int) -> None:
        """Removes `count` replicas (out of rotation first, then the newest), each once its requests in flight
        have finished, so nothing it was generating is lost."""
        leaving = sorted(self.members, key=lambda m: (m.is_healthy, -m.index))[:count]
        for member in leaving:
            member.is_healthy = False   # no new request goes to it
        deadline = time.monotonic() + self.sync_timeout_s
        for member in leaving:
            while member.load or self.num_in_flight(member):
                if time.monotonic() > deadline:
                    raise RemoteTimeoutError(f"{member.name}: its requests did not finish within "
                                             f"{self.sync_timeout_s:.0f}s of being removed")
                time.sleep(DRAIN_POLL_S)
            self.members.remove(member)
            ray.kill(member.actor)

    def num_in_flight(self, member: Member) -> int:
        """Requests running on the replica's engine (0 for one that died: it holds nothing any more)."""
        try:
            return wait_for(member.actor.num_in_flight.remote(), member.name, "num_in_flight", self.timeout_s)
        except RemoteCallError:
            return 0

    # ---- memory, health ---------------------------------------------------------------------------------
    async def sleep(self) -> None:
        refs = [replica.sleep.remote() for replica in self.replicas]
        await asyncio.to_thread(wait_for_all, refs, self.names, "sleep", self.timeout_s)

    async def wake(self) -> None:
        refs = [replica.wake.remote() for replica in self.replicas]
        await asyncio.to_thread(wait_for_all, refs, self.names, "wake", self.timeout_s)

    def health(self) -> RolloutHealth:
        unhealthy = tuple(member.name for member in self.members if not member.is_healthy)
        return RolloutHealth(len(self.members), unhealthy, self.num_restarts, self.num_failures, self.num_requeued,
                             self.num_retired, self.num_resizes)

    def activity(self) -> BusyClock:
        return self.gate.clock

    def close(self) -> None:
        for replica in self.replicas:
            ray.kill(replica)
