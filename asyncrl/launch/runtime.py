"""The composition root: build what a run needs, in a fixed order, after the config is validated:

tokenizer, datasets and the rollout backend's name (errors here start no Ray worker) -> the checkpoint to resume
from, checked against the config (before any file is written) -> reward executor, the reward model's and the
distillation teacher's checks -> config.yaml -> Ray -> resource pools (one atomic reservation) -> the actors outside
the pools (reward models, teacher, evaluators: `side_actors.py`), rollout replicas and the mode's actors (loading
while) -> trainer ranks -> the rollout backend (built once, from its registry entry) -> the side actors joined ->
the PPO core, with tracker and timeline, and the evaluation stage.

    runtime = build_runtime(config)
    ... recipe uses runtime.core, runtime.train_data, runtime.val_data ...
    runtime.close()
"""

from __future__ import annotations

import dataclasses
import logging
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import ray

from asyncrl.config import AsyncRLConfig, ConfigError, check_environment, check_named_choices, dump_config
from asyncrl.core import PPOCore, Runtime, TrainerGroup
from asyncrl.core.evaluation import EvaluationStage
from asyncrl.core.trainer_rank import TrainerActor
from asyncrl.data.dataset import PromptDataset
from asyncrl.engine import EngineConfig
from asyncrl.launch.cpu_threads import threads_per_worker
from asyncrl.launch.input_checks import check_datasets, check_run_folders, warn_about_sampling
from asyncrl.launch.preflight import check_external_servers, check_model_inputs, check_tools
from asyncrl.launch.ray_cluster import start_ray
from asyncrl.launch.resource_pool import PoolSpec, Pools, ResourceError, allocate_pools
from asyncrl.launch.resume_check import check_resume
from asyncrl.launch.side_actors import SideActors
from asyncrl.launch.stop_signals import StopSignals
from asyncrl.recipes.training_loop import total_training_steps
from asyncrl.remote import RemoteCallError, wait_for, wait_for_all, worker_name
from asyncrl.rewards import RewardExecutor, RewardModelPool, Scorer, check_reward_model
from asyncrl.rollout import RolloutBackend, RolloutBackendSpec, RolloutContext, resolve_backend
from asyncrl.rollout.elastic import ReplicaLauncher
from asyncrl.teacher import TeacherPool, check_teacher
from asyncrl.telemetry import Timeline, Tracker


logger = logging.getLogger(__name__)


def load_inputs(config: AsyncRLConfig) -> tuple[Any, PromptDataset, Optional[PromptDataset]]:
    """Tokenizer and datasets: everything that can be wrong with the user's files and the machine (a CUDA
    device, the resume folder), checked before Ray."""
    check_environment(config, has_ray_cluster=ray.is_initialized())
    check_named_choices(config)   # rollout.backend, rollout.multi_turn.format: registries of asyncrl.rollout
    warn_about_sampling(config)
    model_config, tokenizer = check_model_inputs(config)
    check_tools(config)
    check_external_servers(config)
    budget = config.data.max_prompt_length + config.data.max_response_length
    if budget > model_config.max_position_embeddings:
        raise ConfigError(f"data.max_prompt_length + data.max_response_length = {budget} exceeds the model's "
                         f"max_position_embeddings ({model_config.max_position_embeddings}) in {config.model.path}")
    check_run_folders(config)
    train = PromptDataset.from_files(config.data.train_files, tokenizer, config.data)
    val = PromptDataset.from_files(config.data.val_files, tokenizer, config.data) if config.data.val_files else None
    check_datasets(config, train, val)
    return tokenizer, train, val


def evaluation_data(config: AsyncRLConfig, tokenizer: Any, val_data: Optional[PromptDataset]) -> Optional[PromptDataset]:
    """The evaluation stage's prompts: evaluation.data_files, or the validation prompts (checked before Ray)."""
    if not config.evaluation.enable or not config.evaluation.data_files:
        return val_data
    return PromptDataset.from_files(config.evaluation.data_files, tokenizer, config.data)


def uses_gpu(config: AsyncRLConfig) -> bool:
    return config.trainer.device == "cuda" or (config.trainer.device == "auto" and
                                                 ray.cluster_resources().get("GPU", 0) > 0)


def pool_specs(config: AsyncRLConfig, backend: RolloutBackendSpec) -> list[PoolSpec]:
    """The trainer pool, and for a backend on devices of its own the rollout pool (one device per replica)."""
    num_trainers = config.trainer.n_gpus_per_node * config.trainer.nnodes
    num_replicas = num_rollout_replicas(config, backend)
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


def num_rollout_replicas(config: AsyncRLConfig, backend: RolloutBackendSpec) -> int:
    """A backend on devices of its own runs one replica per rollout device; others reserve none."""
    if backend.placement != "separate":
        return 0
    return config.rollout.n_gpus_per_node * config.rollout.nnodes


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


def launch_replicas(config: AsyncRLConfig, pools: Pools, replica_actor: Any) -> list[Any]:
    """Rollout replica actors (the backend's `replica` class) on their own devices, started without waiting for
    them (they load their engines while the trainers start)."""
    spec = pools.spec("rollout")
    threads = threads_per_worker(spec, sum(pool.num_workers for pool in pools.specs))
    # Ray restarts a replica that dies (in its bundle); the rollout re-syncs it before using it again.
    return [replica_actor.options(num_cpus=spec.num_cpus_per_worker, num_gpus=spec.num_gpus_per_worker,
                                        max_restarts=config.rollout.max_replica_restarts, max_task_retries=0,
                                        scheduling_strategy=pools.strategy("rollout", index)).remote(
                config, index, threads) for index in range(spec.num_workers)]


def actor_pids(config: AsyncRLConfig, trainers: TrainerGroup, replicas: list[Any]) -> dict[str, int]:
    """Each trainer rank's and rollout replica's process id on its node, asked of the actor; logs their threads."""
    names = [*trainers.names, *(worker_name("rollout", index) for index in range(len(replicas)))]
    actors = [*trainers.actors, *replicas]
    pids = wait_for_all([actor.pid.remote() for actor in actors], names, "pid", config.ray.rpc_timeout_s)
    threads = wait_for_all([actor.threads.remote() for actor in actors], names, "threads", config.ray.rpc_timeout_s)
    logger.info("cpu threads: %s", ", ".join(f"{name} {count} (OMP_WAIT_POLICY={policy or 'unset'})"
                                            for name, (count, policy) in zip(names, threads)))
    return dict(zip(names, pids))


def rollout_context(config: AsyncRLConfig, pools: Pools, replicas: list[Any], trainers: TrainerGroup,
                    replica_actor: Any = None) -> RolloutContext:
    """What every rollout backend is built from; with the backend's `replica_actor`, its replicas can grow."""
    engine_dtype = EngineConfig.weights_dtype(config.model.dtype, pools.spec("trainer").num_gpus_per_worker > 0)
    launch = None
    if replica_actor is not None and replicas:
        spec = pools.spec("rollout")
        launch = ReplicaLauncher(replica_actor, config, spec.num_gpus_per_worker, spec.num_cpus_per_worker,
                                 spec.node_resource).launch
    return RolloutContext(config, trainers, replicas, engine_dtype, lambda: trainer_node_address(config, pools),
                          launch)


@dataclass(frozen=True)
class ModeActors:
    """A mode's own actors: started with the runtime, not after it, and able to own the rollout backend."""
    # Starts them from what the runtime loaded, without waiting for them.
    launch: Callable[[AsyncRLConfig, Any, PromptDataset, Optional[RewardModelPool], Optional[TeacherPool]],
                     dict[str, Any]]
    # Builds the backend inside one of them and returns the driver's handle on it.
    host_rollout: Callable[[dict[str, Any], RolloutBackendSpec, RolloutContext], RolloutBackend]


def build_runtime(config: AsyncRLConfig, mode_actors: Optional[ModeActors] = None) -> Runtime:
    """Every actor of the run, started concurrently (replicas and the mode's actors load while the trainers
    start), then joined; the rollout backend named by `rollout.backend` is resolved once, here."""
    backend = resolve_backend(config)
    tokenizer, train_data, val_data = load_inputs(config)
    eval_data = evaluation_data(config, tokenizer, val_data)
    output_dir = Path(config.trainer.output_dir)
    # A refused or finished resume is found here, before the earlier run's config.yaml (or anything) is written.
    resume = check_resume(config, output_dir, len(train_data))
    reward = RewardExecutor.from_config(config.reward)
    try:
        check_reward_model(config.reward.model)
        check_teacher(config, tokenizer, config.model.tokenizer_path or config.model.path)
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / "config.yaml").write_text(dump_config(config))
        start_ray(config.ray)
        pools = allocate_pools(pool_specs(config, backend))
    except BaseException:
        reward.close()
        raise
    logger.info("placement: %s", ", ".join(f"{name} on {where['node_ip']} ({where['node_id'][:8]})"
                                           for name, where in pools.placement().items()))
    replicas: list[Any] = []
    actors: dict[str, Any] = {}
    trainers: Optional[TrainerGroup] = None
    side = SideActors()
    try:
        side = SideActors.launch(config)
        replicas = launch_replicas(config, pools, backend.replica) if backend.placement == "separate" else []
        actors = mode_actors.launch(config, tokenizer, train_data, side.reward_models, side.teacher) \
            if mode_actors is not None else {}
        trainers = start_trainers(config, pools, total_training_steps(config, len(train_data)),
                                  host_engine=backend.placement == "colocated")
        context = rollout_context(config, pools, replicas, trainers, backend.replica)
        rollout = mode_actors.host_rollout(actors, backend, context) if mode_actors is not None else \
            backend.fn(context)
        pids = {**actor_pids(config, trainers, replicas),
                **{f"reward/scorer{index}": pid for index, pid in enumerate(reward.pids())},
                **side.wait_ready(config.ray.rpc_timeout_s)}
        logger.info("processes: %s", ", ".join(f"{name} pid {pid}" for name, pid in pids.items()))
    except BaseException:
        # A failed start leaves nothing behind in a shared Ray cluster: actors, devices and scoring processes.
        for actor in [*actors.values(), *replicas, *side.actors, *(trainers.actors if trainers is not None else [])]:
            ray.kill(actor)
        pools.release()
        reward.close()
        raise
    tracker = Tracker(output_dir, config.trainer.logger, config.trainer.project_name, config.trainer.experiment_name,
                      # metrics.jsonl lines from the first step this run logs on (a previous attempt's) are dropped
                      dataclasses.asdict(config), resume_step=resume.step + 1 if resume.folder is not None else 0)
    timeline = Timeline()
    scorer = Scorer(reward, side.reward_models, config.reward.model)
    core = PPOCore(config, trainers, rollout, scorer, tokenizer, tracker, timeline, side.teacher)
    evaluation = EvaluationStage(config, eval_data, scorer, tokenizer, trainers, side.evaluators) \
        if side.evaluators else None
    return Runtime(config, output_dir, tokenizer, train_data, val_data, scorer, pools, trainers, rollout, core,
                   tracker, timeline, StopSignals(), actors, [*actors.values(), *replicas, *trainers.actors,
                                                               *side.actors],
                   resume.folder, evaluation)
