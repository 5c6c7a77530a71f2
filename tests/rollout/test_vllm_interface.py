"""The vLLM replica answers every call the replica set and the composition root make of a replica: the same
methods as asyncrl's own replica, with the same parameters (checked without vLLM)."""

import inspect

from asyncrl.rollout.replica import RolloutReplica
from asyncrl.rollout.vllm.replica import VllmReplica


def public_methods(cls) -> dict[str, inspect.Signature]:
    return {name: inspect.signature(member) for name, member in inspect.getmembers(cls, inspect.isfunction)
            if not name.startswith("_")}


def test_the_vllm_replica_has_every_method_of_a_replica_with_the_same_parameters():
    ours, vllm = public_methods(RolloutReplica), public_methods(VllmReplica)
    assert sorted(set(ours) - set(vllm)) == []
    assert {name: list(vllm[name].parameters) for name in ours} == {name: list(ours[name].parameters) for name in ours}
    assert all(inspect.iscoroutinefunction(getattr(VllmReplica, name)) == inspect.iscoroutinefunction(
        getattr(RolloutReplica, name)) for name in ours)
