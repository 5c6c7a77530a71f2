"""The weight-sync group of a replica set: trainer rank 0 (group rank 0) and the replicas (ranks 1..N),
joined once and re-formed after a replica restarts; one transfer per sync (`weight_transport.py` moves the
bytes).

    group = WeightGroup(trainers, plan, new_address)
    group.connect(replicas, names, timeout_s)   # every member joins a new process group
    group.transfer(version, timeout_s)   # every trainer rank gathers, rank 0 broadcasts, each replica loads
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import torch

from asyncrl.config import AsyncRLConfig
from asyncrl.models import CausalLM, read_config
from asyncrl.models.lora import add_adapters, is_adapter_name, lora_spec
from asyncrl.remote import STILL_RUNNING, RemoteCallError, RemoteTimeoutError, settle, wait_for_all
from asyncrl.rollout.backend import SyncStats
from asyncrl.rollout.registry import TrainerRanks
from asyncrl.rollout.weight_transport import TransferPlan

logger = logging.getLogger(__name__)

# Members of one transfer start within moments of each other, so their transports time out within this of
# `weight_sync.timeout_s` after the transfer's start.
SETTLE_GRACE_S = 5.0


def transfer_plan(config: AsyncRLConfig, engine_dtype: torch.dtype, can_apply_deltas: bool = False) -> TransferPlan:
    """The parameter list of the policy, from its config alone (a meta-device model: no weights); with LoRA
    only the adapters, which are all a sync moves. Sparse deltas where the receivers write into their
    parameters in place (`can_apply_deltas`) and `weight_sync.encoding` asks (auto: for 16-bit weights,
    whose small updates mostly round away)."""
    model_config, _ = read_config(config.model.path)
    spec = lora_spec(config)
    with torch.device("meta"):
        model = CausalLM(model_config)
        if spec is not None:
            add_adapters(model, spec)
    named_shapes = [(name, tuple(parameter.shape)) for name, parameter in model.named_parameters()
                    if spec is None or is_adapter_name(name)]
    encoding = config.weight_sync.encoding
    sparse = can_apply_deltas and (encoding == "sparse" or (encoding == "auto" and engine_dtype.itemsize == 2))
    return TransferPlan.build(named_shapes, engine_dtype, config.weight_sync.bucket_mb << 20, sparse)


def sync_deadline_s(config: AsyncRLConfig) -> float:
    """The longest a replica set's sync may take before its own named errors fire: waiting for a restarting
    replica, then every allowed re-formation of the group, each a join and a transfer that may settle."""
    attempts = config.rollout.max_replica_restarts + 1
    return config.weight_sync.timeout_s * (1 + 2 * attempts) + attempts * SETTLE_GRACE_S + config.ray.rpc_timeout_s


class WeightGroup:
    def __init__(self, trainers: TrainerRanks, plan: TransferPlan, new_address: Callable[[], tuple[str, int]]):
        self.trainers = trainers
        self.plan = plan
        self.new_address = new_address          # a fresh (host, port) on trainer rank 0's node
        self.replicas: list[Any] = []
        self.names: list[str] = []

    def connect(self, replicas: list[Any], names: list[str], timeout_s: float) -> None:
        """Form the group: trainer rank 0 is rank 0, replica i is rank i + 1 (again after a replica restarted, or
        joined, or left: the members of a process group are fixed when it forms)."""
        self.replicas, self.names = list(replicas), list(names)
        host, port = self.new_address()
        world_size = len(self.replicas) + 1
        refs = [self.trainers.actors[0].join_weight_group.remote(host, port, world_size, self.plan, timeout_s)]
        refs += [replica.join_weight_group.remote(host, port, index + 1, world_size, self.plan, timeout_s)
                 for index, replica in enumerate(self.replicas)]
        names = [self.trainers.names[0]] + self.names
        try:
            wait_for_all(refs, names, "join_weight_group", timeout_s)
        except (RemoteCallError, RemoteTimeoutError):
            # The others wait for the missing member until their store times out; a new group must not queue
            # behind them (the trainer rank runs one call at a time).
            settle(refs, names, timeout_s + SETTLE_GRACE_S)
            raise

    def transfer(self, version: int, timeout_s: float) -> SyncStats:
        """Each replica pauses its stepping, receives and loads, stamps `version` and resumes, in one call;
        returns what trainer rank 0 sent."""
        refs = [actor.send_weights.remote() for actor in self.trainers.actors]
        refs += [replica.receive_weights.remote(version) for replica in self.replicas]
        names = self.trainers.names + self.names
        started = time.monotonic()
        try:
            answers = wait_for_all(refs, names, "sync_weights", timeout_s)
        except RemoteCallError as error:
            # The surviving members see the broken group only when their transport times out (gloo waits
            # for a dead receiver's ready signal until `weight_sync.timeout_s`, counted from the transfer's
            # start); wait for them, so a new group is not queued behind a stuck broadcast.
            failed = time.monotonic()
            outcomes = settle(refs, names, max(0.0, started + timeout_s + SETTLE_GRACE_S - failed))
            logger.warning("weight sync members settled %.1fs after the failure: %s", time.monotonic() - failed,
                           outcomes)
            stuck = [name for name, outcome in outcomes.items() if outcome == STILL_RUNNING]
            if stuck:
                # A member that never took part makes the others' transports time out, and one of those
                # errors may arrive before the wait's own deadline: the member to blame is the stuck one.
                raise RemoteTimeoutError(f"{', '.join(stuck)}: sync_weights did not answer within "
                                         f"{timeout_s:.0f}s (the other members' transports gave up "
                                         f"waiting for it: {error})") from error
            raise
        return answers[0]
