"""Fully-asynchronous PPO / GRPO: a streaming rollouter, a bounded queue, and this trainer loop.

    asyncrl train config.yaml trainer.mode=fully_async async_training.staleness_threshold=0.5 \
        async_training.trigger_parameter_sync_step=2 async_training.partial_rollout=true

Each local step takes R = actor.ppo_mini_batch_size x async_training.require_batches scored groups from
the queue (`timing_s/gen` is the time the trainer waited: `trainer/idle_ratio`), and runs the core's
stages on them. Every K = trigger_parameter_sync_step local steps it syncs: pause the rollouter (abort
in-flight requests with partial rollout, else let them finish) -> [checkpoint, while everything is
still] -> push weights -> version + 1 -> resume. The four operating modes of the reference system are
settings of the same loop: on-policy pipeline (K=1, s=0), stream off-policy (K>1, s=0), stale samples
(s>0) and partial rollout (s>0, partial_rollout=true).

Old log-probs are the rollout's (bypass) by default; with `bypass_mode=false` the proximal policy is the
last synced version: a host snapshot of the weights taken at the first local step after each sync.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Optional

import ray

from asyncrl.config import AsyncRLConfig, prompts_per_step
from asyncrl.core import Runtime
from asyncrl.core.records import Sample
from asyncrl.core.training_reward import extra_means
from asyncrl.data.dataset import PromptDataset
from asyncrl.recipes.fully_async.metrics import VersionMetrics, sample_version_metrics
from asyncrl.recipes.fully_async.rollouter import RolloutActor
from asyncrl.recipes.fully_async.state_codec import encode_state, load_state
from asyncrl.recipes.training_loop import TrainingLoop
from asyncrl.remote import RemoteCallError, wait_for
from asyncrl.rewards import RewardModelPool
from asyncrl.rollout import HostedRollout, RolloutBackend, RolloutBackendSpec, RolloutContext
from asyncrl.rollout.weight_group import sync_deadline_s
from asyncrl.teacher import TeacherPool

POLL_S = 2.0  # how often a waiting trainer checks for dead replicas and stalls


class PipelineStalledError(RuntimeError):
    """The fully-async pipeline stopped making progress (the watchdog fired)."""


class FullyAsyncRecipe:
    def __init__(self, runtime: Runtime):
        self.runtime = runtime
        self.core = runtime.core
        self.config = runtime.config
        self.loop = TrainingLoop.create(runtime)
        self.prompts_per_step = prompts_per_step(self.config)
        self.steps_per_sync = self.config.async_training.trigger_parameter_sync_step
        self.local_step = 0
        self.timeout_s = self.config.ray.rpc_timeout_s
        self.next_groups: Optional[list[list[Sample]]] = None
        self.wait_s = 0.0
        self.carried_metrics: dict[str, float] = {}   # of a sync done between steps, logged with the next
        self.stale_samples = 0
        self.trained_prompt_keys: set[str] = set()
        self.rollouter = runtime.mode_actors["rollouter"]
        self.rollouter_run: Any = None
        # The next step's groups are asked for as soon as this step's arrived, so their transfer overlaps
        # training. Groups that arrived but were not trained yet at a sync are `held`: charged to the next
        # version's budget and checkpointed at the head of the queue, as if they had never left it.
        self.prefetch: Any = None
        self.held: list[list[Sample]] = []
        self.version_metrics = VersionMetrics(runtime.output_dir / "metrics_by_version.jsonl")

    # ---- StepRecipe -----------------------------------------------------------------------------------
    @staticmethod
    def launch_actors(config: AsyncRLConfig, tokenizer: Any, train_data: PromptDataset,
                      reward_models: Optional[RewardModelPool], teacher: Optional[TeacherPool]) -> dict[str, Any]:
        """The rollouter (with the queue inside), started while the trainers start (it takes seconds to
        import and start its scoring processes); it waits for `host_rollout`, then for `begin`."""
        return {"rollouter": RolloutActor.options(num_cpus=0.05).remote(config, tokenizer, train_data, reward_models,
                                                                        teacher)}

    @staticmethod
    def host_rollout(actors: dict[str, Any], backend: RolloutBackendSpec, context: RolloutContext) -> RolloutBackend:
        """The rollout backend is built inside the rollouter, which streams into it; the driver's stages
        (validation, weight sync) reach it through the rollouter."""
        rollouter, config = actors["rollouter"], context.config
        wait_for(rollouter.host_rollout.remote(backend.fn, context), "fully_async/rollouter", "host_rollout",
                 config.ray.rpc_timeout_s + sync_deadline_s(config))
        return HostedRollout(rollouter, "fully_async/rollouter", config)

    def begin(self) -> None:
        """Stream, from the checkpointed data cursor, parked groups and queue contents when resuming."""
        saved = self.load_saved_state()
        # Without a saved rollouter state (fresh run, or a checkpoint written at the end) the cursor is the driver's.
        rollouter_state = saved["rollouter"] if saved else \
            {"sampler": self.loop.sampler.state_dict(), "parked": [], "next_serial": 0}
        self.rollouter_run = self.rollouter.run.remote(self.core.version, rollouter_state,
                                                       saved["queue"] if saved else [])

    def has_next(self) -> bool:
        """Sync first when a cycle of K local steps ended (the sync belongs between steps, so a checkpoint
        written during it records the finished step), then wait for the next R groups."""
        self.carried_metrics = {}
        if self.local_step % self.steps_per_sync == 0 and self.core.updates_since_sync:
            self.sync(self.carried_metrics)
        if self.loop.step >= self.loop.total_steps:
            return False
        started = time.monotonic()
        self.next_groups = self.take(self.prompts_per_step)
        self.wait_s = time.monotonic() - started
        if self.next_groups is not None and self.loop.step + 1 < self.loop.total_steps:
            self.prefetch = self.rollouter.take.remote(self.prompts_per_step, POLL_S)
        return self.next_groups is not None

    def take(self, count: int) -> Optional[list[list[Sample]]]:
        """Up to `count` groups (fewer only at the end of the data; a short last batch is trained, not dropped).
        While waiting: a replica that died is repaired (a sync re-joins and re-loads it), and a pipeline that
        produces nothing for `ray.watchdog_s` stops the run with every component's state."""
        started = time.monotonic()
        while True:
            if self.held:
                groups, self.held = self.held[:count], self.held[count:]
                return groups
            ready, _ = ray.wait([self.rollouter_run], timeout=0)
            if ready:
                wait_for(self.rollouter_run, "fully_async/rollouter", "run", self.timeout_s)  # surfaces its errors
            request, self.prefetch = self.prefetch or self.rollouter.take.remote(count, POLL_S), None
            groups = wait_for(request, "fully_async/rollouter", "take", POLL_S + 30)
            if groups != []:
                return groups
            if self.runtime.rollout.health().needs_repair:
                self.sync(self.carried_metrics)
            elif time.monotonic() - started > self.config.ray.watchdog_s:
                raise PipelineStalledError(f"no sample reached the trainer for {time.monotonic() - started:.0f}s "
                                           f"(ray.watchdog_s={self.config.ray.watchdog_s}); state: {self.states()}")

    def states(self) -> dict[str, Any]:
        """Every component's state, for the watchdog's report."""
        states: dict[str, Any] = {"trainer": {"step": self.loop.step, "local_step": self.local_step,
                                              "version": self.core.version, "held_groups": len(self.held)}}
        try:
            states.update(wait_for(self.rollouter.states.remote(), "fully_async/rollouter", "states", 30))
        except (RemoteCallError, TimeoutError) as error:
            states["queue"] = states["rollouter"] = f"not answering: {error}"
        return states

    def step(self, step: int) -> tuple[dict[str, float], list[Sample]]:
        metrics: dict[str, float] = {"timing_s/gen": self.wait_s, **self.carried_metrics}
        samples = [dataclasses.replace(sample, group_index=index)
                   for index, group in enumerate(self.next_groups) for sample in group]
        self.local_step += 1
        self.core.train(samples, step, metrics, anchor="last_sync")
        # The rollouter scores in batches of its own: the reward extras' means (a reward function's dict extras,
        # a reward model's `rule` and `model`) are taken here, over the samples this step trains.
        metrics.update(extra_means(samples))
        self.record_samples(samples, metrics)
        self.version_metrics.add(step, metrics)
        return metrics, samples

    def record_samples(self, samples: list[Sample], metrics: dict[str, float]) -> None:
        version_metrics, num_stale = sample_version_metrics(samples, self.core.version)
        self.stale_samples += num_stale
        metrics.update(version_metrics)
        metrics["fully_async/count/stale_samples_processed"] = float(self.stale_samples)
        metrics["trainer/idle_ratio"] = self.wait_s / max(self.wait_s + sum(
            value for key, value in metrics.items() if key.startswith("timing_s/") and key != "timing_s/gen"), 1e-9)
        for sample in samples:
            if sample.sample_index == 0:
                self.trained_prompt_keys.add(prompt_key(sample))

    def sync(self, metrics: dict[str, float]) -> None:
        """Pause the rollouter, checkpoint if due (everything is still; the checkpoint names the trainer's weights
        by the version this sync gives them), push weights, resume."""
        self.pause_rollouter(metrics)
        version = self.core.version + 1
        save_freq = self.config.trainer.save_freq
        if save_freq > 0 and version % save_freq == 0:
            self.save_checkpoint()
        self.core.sync_weights(metrics)
        rollouter_metrics, busy_spans = wait_for(self.rollouter.resume.remote(self.core.version, len(self.held)),
                                                 "fully_async/rollouter", "resume", self.timeout_s)
        metrics.update(rollouter_metrics)
        self.version_metrics.close(self.core.version, rollouter_metrics)
        for start_s, end_s in busy_spans:
            self.runtime.timeline.add_span("rollouter", "generate", start_s, end_s)

    def pause_rollouter(self, metrics: dict[str, float]) -> None:
        """Pause generation (a take still waiting in the rollouter returns empty), then hold whatever the
        prefetch brought: nothing is in transit while the trainer checkpoints or syncs."""
        metrics.update(wait_for(self.rollouter.pause.remote(), "fully_async/rollouter", "pause", self.timeout_s))
        if self.prefetch is not None:
            groups = wait_for(self.prefetch, "fully_async/rollouter", "take", POLL_S + 30)
            self.prefetch = None
            self.held += groups or []  # None (the stream ended) is seen again by the next take

    def maybe_checkpoint(self) -> None:
        """Nothing here: fully-async checkpoints are written inside syncs, while everything is still."""

    def finish_training(self) -> None:
        """Stop generating (a run may end on its step budget with work in flight) and push the last update,
        so the final validation and the exported policy see it (pitfall P1: a cycle may be incomplete)."""
        self.pause_rollouter({})
        if self.core.updates_since_sync:
            self.core.sync_weights({})
        self.version_metrics.close(self.core.version, wait_for(self.rollouter.final_report.remote(),
                                                               "fully_async/rollouter", "final_report", self.timeout_s))

    def save_final_checkpoint(self) -> None:
        self.save_checkpoint()

    def fit(self) -> dict[str, Any]:
        return self.loop.run(self)

    # ---- lossless checkpoints -------------------------------------------------------------------------
    def save_checkpoint(self) -> None:
        """Called while the rollouter is paused: the data cursor, parked partial groups and queued groups
        (the held ones first: they left the head of the queue) are saved with the trainer, so a resume
        neither loses nor repeats a prompt."""
        snapshot = wait_for(self.rollouter.snapshot.remote(), "fully_async/rollouter", "snapshot", self.timeout_s)
        # The driver state records the rollouter's cursor.
        self.loop.sampler.load_state_dict(snapshot["rollouter"]["sampler"])
        artifacts = encode_state({"rollouter": snapshot["rollouter"], "queue": self.held + snapshot["queue"],
                                  "local_step": self.local_step,
                                  "stale_samples": self.stale_samples,
                                  "trained_prompt_keys": sorted(self.trained_prompt_keys)})
        self.loop.save(extra={"trained_prompts": len(self.trained_prompt_keys)}, artifacts=artifacts)

    def load_saved_state(self) -> Optional[dict[str, Any]]:
        folder = self.loop.resumed_from
        saved = None if folder is None else load_state(folder)
        if saved is None:
            return None
        self.local_step = saved["local_step"]
        self.stale_samples = saved["stale_samples"]
        self.trained_prompt_keys = set(saved["trained_prompt_keys"])
        return saved


def prompt_key(sample: Sample) -> str:
    return sample.prompt.record.prompt_id
