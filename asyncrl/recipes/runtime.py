"""Build what a run needs, in a fixed order, after the config is validated:

tokenizer and datasets (errors here start no Ray worker) -> reward executor -> Ray -> resource pools (one
atomic reservation) -> trainer ranks -> rollout -> the PPO core, with tracker and timeline.

    runtime = build_runtime(config)
    ... recipe uses runtime.core, runtime.train_data, runtime.val_data ...
    runtime.close()
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import ray
import torch

from asyncrl.config import AsyncRLConfig, ConfigError, dump_config
from asyncrl.core.checkpoint import CheckpointManager
from asyncrl.core.replica_rollout import ReplicaRollout
from asyncrl.core.rollout import ColocatedRollout, Rollout
from asyncrl.core.stages import PPOCore
from asyncrl.core.trainer_group import TrainerGroup
from asyncrl.data.dataset import PromptDataset
from asyncrl.distributed.remote import RemoteCallError, wait_for, wait_for_all
from asyncrl.distributed.resource_pool import PoolSpec, Pools, ResourceError, allocate_pools, worker_name
from asyncrl.distributed.runtime import start_ray
from asyncrl.distributed.rollout_replica import RolloutReplicaActor
from asyncrl.distributed.trainer_actor import TrainerActor
from asyncrl.recipes.preflight import check_model_inputs
from asyncrl.rewards import RewardExecutor
from asyncrl.telemetry import Timeline, Tracker
from asyncrl.train.worker import GPU_HOST_THREADS


logger = logging.getLogger(__name__)


@dataclass
class Runtime:
    config: AsyncRLConfig
    output_dir: Path
    tokenizer: Any
    train_data: PromptDataset
    val_data: Optional[PromptDataset]
    reward: RewardExecutor
    pools: Pools
    trainers: TrainerGroup
    rollout: Rollout
    core: PPOCore
    tracker: Tracker
    timeline: Timeline
    mode_actors: dict[str, Any]     # the mode's own actors (fully async: the queue and the rollouter)

    def close(self) -> None:
        self.tracker.close()
        self.timeline.save(self.output_dir / "timeline.json")
        self.reward.close()
        for actor in self.mode_actors.values():
            ray.kill(actor)
        self.rollout.close()
        for actor in self.trainers.actors:
            ray.kill(actor)
        self.pools.release()


def load_inputs(config: AsyncRLConfig) -> tuple[Any, PromptDataset, Optional[PromptDataset]]:
    """Tokenizer and datasets: everything that can be wrong with the user's files, checked before Ray."""
    model_config, tokenizer = check_model_inputs(config)
    budget = config.data.max_prompt_length + config.data.max_response_length
    if budget > model_config.max_position_embeddings:
        raise ConfigError(f"data.max_prompt_length + data.max_response_length = {budget} exceeds the model's "
                         f"max_position_embeddings ({model_config.max_position_embeddings}) in {config.model.path}")
    train = PromptDataset.from_files(config.data.train_files, tokenizer, config.data)
    val = PromptDataset.from_files(config.data.val_files, tokenizer, config.data) if config.data.val_files else None
    return tokenizer, train, val


def total_training_steps(config: AsyncRLConfig, num_prompts: int) -> int:
    """Steps of the whole run, known before any worker is built (the LR schedule needs it)."""
    per_epoch = math.ceil(num_prompts / config.data.train_batch_size)
    steps = per_epoch * config.trainer.total_epochs
    return min(steps, config.trainer.total_steps) if config.trainer.total_steps > 0 else steps


def uses_gpu(config: AsyncRLConfig) -> bool:
    return config.trainer.device == "cuda" or (config.trainer.device == "auto" and
                                                 ray.cluster_resources().get("GPU", 0) > 0)


def pool_specs(config: AsyncRLConfig) -> list[PoolSpec]:
    """The trainer pool, and in separated modes the rollout pool (one device per replica)."""
    num_trainers = config.trainer.n_gpus_per_node * config.trainer.nnodes
    num_replicas = num_rollout_replicas(config)
    for key, name in (("ray.trainer_node_resource", config.ray.trainer_node_resource),
                      ("ray.rollout_node_resource", config.ray.rollout_node_resource)):
        if name and name not in ray.cluster_resources():
            raise ResourceError(f"{key}={name!r}: no node of the Ray cluster offers this resource; start the nodes "
                                f"meant for it with `ray start ... --resources '{{\"{name}\": 1}}'` (the cluster "
                                f"has {sorted(ray.cluster_resources())})")
    if uses_gpu(config):
        devices, cpus = 1.0, 1.0
    else:
        # CPU slots: share the cores (leaving some room for the driver) among every worker of the run.
        devices = 0.0
        cpus = round(min(1.0, 0.9 * ray.available_resources().get("CPU", 1.0) / (num_trainers + num_replicas)), 3)
    specs = [PoolSpec("trainer", num_trainers, devices, cpus, config.ray.trainer_node_resource)]
    if num_replicas:
        specs.append(PoolSpec("rollout", num_replicas, devices, cpus, config.ray.rollout_node_resource))
    return specs


def num_rollout_replicas(config: AsyncRLConfig) -> int:
    """Separated modes run one replica per rollout device; sync mode colocates engines in the trainer ranks."""
    if config.trainer.mode == "sync":
        return 0
    return config.rollout.n_gpus_per_node * config.rollout.nnodes


def threads_per_worker(spec: PoolSpec, num_workers: int) -> int:
    """A GPU worker's host needs one intra-op thread (`GPU_HOST_THREADS`); CPU workers share the cores."""
    return GPU_HOST_THREADS if spec.num_gpus_per_worker else max(1, (os.cpu_count() or 1) // num_workers)


PORT_ATTEMPTS = 3


@ray.remote(num_cpus=0)
def node_address() -> tuple[str, int]:
    """An address and a free port on the node this runs on (for the trainer ranks' process group)."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return ray.util.get_node_ip_address(), sock.getsockname()[1]


def trainer_node_address(config: AsyncRLConfig, pools: Pools) -> tuple[str, int]:
    """A free port on trainer rank 0's node (its process groups are hosted there)."""
    ref = node_address.options(scheduling_strategy=pools.strategy("trainer", 0)).remote()
    return wait_for(ref, "trainer/rank0 node", "node_address", config.ray.rpc_timeout_s)


def start_trainers(config: AsyncRLConfig, pools: Pools, total_steps: int, host_engine: bool) -> TrainerGroup:
    """The trainer ranks, joined in their process group. The group's port is probed free on rank 0's node
    and bound a moment later by rank 0; another process can take it in between, so a start that fails with
    EADDRINUSE is repeated on a fresh port."""
    spec = pools.spec("trainer")
    threads = threads_per_worker(spec, sum(pool.num_workers for pool in pools.specs))
    attempt = 1
    while True:
        address, port = trainer_node_address(config, pools)
        actors = [TrainerActor.options(num_cpus=spec.num_cpus_per_worker, num_gpus=spec.num_gpus_per_worker,
                                       scheduling_strategy=pools.strategy("trainer", rank)).remote(
                      config, rank, spec.num_workers, address, port, total_steps, host_engine, threads)
                  for rank in range(spec.num_workers)]
        group = TrainerGroup(actors, config.ray.rpc_timeout_s)
        try:
            wait_for_all([actor.ping.remote() for actor in actors], group.names, "startup", config.ray.rpc_timeout_s)
            return group
        except RemoteCallError as error:
            for actor in actors:
                ray.kill(actor)
            if "EADDRINUSE" not in str(error) or attempt == PORT_ATTEMPTS:
                raise
            logger.warning("port %d of the trainer group was taken before rank 0 bound it; retrying", port)
            attempt += 1


def launch_replicas(config: AsyncRLConfig, pools: Pools) -> list[Any]:
    """Rollout replica actors on their own devices, started without waiting for them (they load their
    engines while the trainers start)."""
    spec = pools.spec("rollout")
    threads = threads_per_worker(spec, sum(pool.num_workers for pool in pools.specs))
    # Ray restarts a replica that dies (in its bundle); the rollout re-syncs it before using it again.
    return [RolloutReplicaActor.options(num_cpus=spec.num_cpus_per_worker, num_gpus=spec.num_gpus_per_worker,
                                        max_restarts=config.rollout.max_replica_restarts, max_task_retries=0,
                                        scheduling_strategy=pools.strategy("rollout", index)).remote(
                config, index, threads) for index in range(spec.num_workers)]


def actor_pids(config: AsyncRLConfig, trainers: TrainerGroup, replicas: list[Any]) -> dict[str, int]:
    """Each trainer rank's and rollout replica's process id on its node, asked of the actor."""
    names = [*trainers.names, *(worker_name("rollout", index) for index in range(len(replicas)))]
    refs = [actor.pid.remote() for actor in [*trainers.actors, *replicas]]
    return dict(zip(names, wait_for_all(refs, names, "pid", config.ray.rpc_timeout_s)))


def connect_replicas(config: AsyncRLConfig, pools: Pools, replicas: list[Any], trainers: TrainerGroup) -> ReplicaRollout:
    """The replicas behind one handle, joined to trainer rank 0 by the weight-sync group."""
    engine_dtype = torch.bfloat16 if pools.spec("rollout").num_gpus_per_worker else torch.float32
    rollout = ReplicaRollout(replicas, trainers, config, engine_dtype, lambda: trainer_node_address(config, pools))
    rollout.connect_weights()
    return rollout


def resume_step(config: AsyncRLConfig, output_dir: Path) -> Optional[int]:
    """The first step this run will log: metrics.jsonl lines from that step on (a previous attempt's) are
    dropped; a run that starts from scratch drops them all."""
    if config.trainer.resume == "disable":
        return 0
    manager = CheckpointManager(output_dir / "checkpoints", config.trainer.max_checkpoints)
    folder = manager.find_resumable() if config.trainer.resume == "auto" else Path(config.trainer.resume)
    if folder is None:
        return 0
    return CheckpointManager.read_driver_state(folder)["step"] + 1


# Starts a mode's own actors from the config and the rollout replicas, without waiting for them.
LaunchModeActors = Callable[[AsyncRLConfig, list[Any]], dict[str, Any]]


def build_runtime(config: AsyncRLConfig, launch_mode_actors: Optional[LaunchModeActors] = None) -> Runtime:
    """Every actor of the run, started concurrently (replicas and the mode's actors load while the trainers
    start), then joined."""
    tokenizer, train_data, val_data = load_inputs(config)
    reward = RewardExecutor(config.reward.custom_function, config.reward.timeout_s, config.reward.num_workers)
    output_dir = Path(config.trainer.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "config.yaml").write_text(dump_config(config))
    start_ray(config.ray)
    pools = allocate_pools(pool_specs(config))
    logger.info("placement: %s", ", ".join(f"{name} on {where['node_ip']} ({where['node_id'][:8]})"
                                           for name, where in pools.placement().items()))
    colocated = num_rollout_replicas(config) == 0
    replicas = [] if colocated else launch_replicas(config, pools)
    mode_actors = launch_mode_actors(config, replicas) if launch_mode_actors is not None else {}
    trainers: Optional[TrainerGroup] = None
    try:
        trainers = start_trainers(config, pools, total_training_steps(config, len(train_data)), host_engine=colocated)
        rollout = ColocatedRollout(trainers) if colocated else connect_replicas(config, pools, replicas, trainers)
        logger.info("processes: %s", ", ".join(f"{name} pid {pid}"
                                               for name, pid in actor_pids(config, trainers, replicas).items()))
    except BaseException:
        # A failed start leaves nothing behind in a shared Ray cluster: actors, devices and scoring processes.
        for actor in [*mode_actors.values(), *replicas, *(trainers.actors if trainers is not None else [])]:
            ray.kill(actor)
        pools.release()
        reward.close()
        raise
    tracker = Tracker(output_dir, config.trainer.logger, config.trainer.project_name, config.trainer.experiment_name,
                      dataclasses.asdict(config), resume_step=resume_step(config, output_dir))
    timeline = Timeline()
    core = PPOCore(config, trainers, rollout, reward, tokenizer, tracker, timeline)
    return Runtime(config, output_dir, tokenizer, train_data, val_data, reward, pools, trainers, rollout, core,
                   tracker, timeline, mode_actors)
