"""Resource pools: Ray placement-group bundles for the trainer and rollout roles, reserved in ONE request.

Reserving every role's bundles atomically avoids the reference system's fragmentation hang (its pitfall
P4: pools allocated one after another can leave a node unable to host a later one). A request the cluster
cannot satisfy fails within a timeout with a message listing what was asked and what the cluster has.

On CPU machines a "device" is a CPU slot: a fraction of the machine's cores. A pool may require a custom
node resource, which pins its role to the nodes started with it (trainer on one node, rollout on another).
"""

from __future__ import annotations

from dataclasses import dataclass

import ray
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from asyncrl.remote import worker_name


# A node label, not a capacity: any number of a role's workers fit on a node offering 1 unit.
NODE_RESOURCE_AMOUNT = 0.001


class ResourceError(RuntimeError):
    """The cluster cannot host the requested pools."""


@dataclass(frozen=True)
class PoolSpec:
    name: str
    num_workers: int
    num_gpus_per_worker: float
    num_cpus_per_worker: float
    node_resource: str = ""     # a custom resource the worker's node must offer (pins a role to nodes)


@dataclass
class Pools:
    group: PlacementGroup
    specs: list[PoolSpec]

    def first_bundle(self, pool_name: str) -> int:
        index = 0
        for spec in self.specs:
            if spec.name == pool_name:
                return index
            index += spec.num_workers
        raise KeyError(f"no resource pool named {pool_name!r}; pools: {[spec.name for spec in self.specs]}")

    def strategy(self, pool_name: str, worker_index: int) -> PlacementGroupSchedulingStrategy:
        """Scheduling strategy that pins worker `worker_index` of `pool_name` to its own bundle."""
        return PlacementGroupSchedulingStrategy(placement_group=self.group,
                                                placement_group_bundle_index=self.first_bundle(pool_name) + worker_index)

    def spec(self, pool_name: str) -> PoolSpec:
        return next(spec for spec in self.specs if spec.name == pool_name)

    def placement(self) -> dict[str, dict[str, str]]:
        """Where each worker runs: {"trainer/rank0": {"node_id": ..., "node_ip": ...}, ...}."""
        nodes = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}
        bundle_nodes = placement_group_table(self.group)["bundles_to_node_id"]
        placement, bundle = {}, 0
        for spec in self.specs:
            for index in range(spec.num_workers):
                node_id = bundle_nodes[bundle]
                placement[worker_name(spec.name, index)] = {"node_id": node_id, "node_ip": nodes.get(node_id, "?")}
                bundle += 1
        return placement

    def release(self) -> None:
        remove_placement_group(self.group)


def allocate_pools(specs: list[PoolSpec], timeout_s: float = 60.0) -> Pools:
    bundles = []
    for spec in specs:
        bundle = {"CPU": spec.num_cpus_per_worker}
        if spec.num_gpus_per_worker:
            bundle["GPU"] = spec.num_gpus_per_worker
        if spec.node_resource:
            bundle[spec.node_resource] = NODE_RESOURCE_AMOUNT
        bundles.extend([bundle] * spec.num_workers)
    group = placement_group(bundles, strategy="PACK")
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(group)
        asked = ", ".join(f"{spec.name}: {spec.num_workers} x ({spec.num_gpus_per_worker} GPU, "
                          f"{spec.num_cpus_per_worker} CPU)" for spec in specs)
        raise ResourceError(f"the Ray cluster cannot host the resource pools within {timeout_s:.0f}s; asked for "
                            f"{asked}; the cluster has {ray.cluster_resources()}")
    return Pools(group, specs)
