"""Rollout: THE contract every rollout backend implements (`backend.py`), the registry that selects one
(`rollout.backend`), and the backends asyncrl ships:

    backend.py           RolloutBackend: generate (async, one group) / start_generate (dispatch now, collect
                         later), abort -> partial results, pause / resume, sync_weights, sleep / wake, health
    registry.py          ROLLOUT_BACKENDS, RolloutContext (what every backend is built from), resolve_backend
    gate.py              admission while paused, requests running, busy time (shared by backends)
    colocated.py         "colocated": an engine inside each trainer rank (sync mode)
    replica.py           the Ray replica actor: one AsyncEngine on a device of its own
    replica_set.py       "ray_replicas": the replicas' one owner (health, failover, restarts, weight sync)
    vllm/                "vllm": the same replica set over Ray actors that host vLLM engines
    weight_group.py      the weight-sync group of trainer rank 0 and the replicas
    weight_transport.py  bucketed broadcast of the weights over that group
    hosted.py            a backend owned by another actor (the fully-async rollouter) and the driver's handle
    external.py          "external": OpenAI-compatible HTTP servers (asyncrl serve, vLLM, SGLang); weights reloaded
                         from an HF folder (external_client.py: one server; external_weights.py: folder, checksum)

    spec = resolve_backend(config); rollout = spec.fn(context)
"""

from asyncrl.rollout.backend import PendingGeneration, RolloutBackend, RolloutError, RolloutHealth, WorkerOutput
from asyncrl.rollout.colocated import ColocatedRollout
from asyncrl.rollout.gate import BusyClock, RequestGate
from asyncrl.rollout.hosted import HostedRollout, RolloutHost
from asyncrl.rollout.registry import (ROLLOUT_BACKENDS, RolloutBackendSpec, RolloutContext, TrainerRanks,
                                      resolve_backend)
from asyncrl.rollout.replica_set import ReplicaSet
from asyncrl.rollout.vllm import VllmReplicaSet
from asyncrl.rollout.external import ExternalRollout  # registered after the in-process backends: the order listed

__all__ = [
    "BusyClock",
    "ColocatedRollout",
    "ExternalRollout",
    "HostedRollout",
    "PendingGeneration",
    "ROLLOUT_BACKENDS",
    "ReplicaSet",
    "RequestGate",
    "RolloutBackend",
    "RolloutBackendSpec",
    "RolloutContext",
    "RolloutError",
    "RolloutHealth",
    "RolloutHost",
    "TrainerRanks",
    "VllmReplicaSet",
    "WorkerOutput",
    "resolve_backend",
]
