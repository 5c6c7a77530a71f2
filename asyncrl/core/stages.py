"""The reusable PPO step: one method per stage. Recipes compose them; no recipe re-implements one.

    metrics = {}
    prompts, salts = loop.next_prompts()
    samples = core.generate(prompts, salts, metrics)
    samples = core.compute_reward(samples, metrics)
    batch = core.train(samples, step, metrics)             # the stage tail, written once:
    #   samples = core.compute_teacher_log_prob(samples, metrics)   # no-op without distillation
    #   batch = core.build_batch(samples, metrics)
    #   batch = core.compute_old_log_prob(batch, metrics)
    #   batch = core.compute_ref_log_prob(batch, metrics)  # no-op without a KL term
    #   batch = core.compute_values(batch, metrics)        # no-op without a critic
    #   batch = core.compute_advantage(batch, metrics)
    #   core.update_critic(batch, step, metrics)
    #   core.update_actor(batch, step, metrics)
    core.sync_weights(metrics)
    core.log(metrics, step)

Every stage adds its wall time to `metrics["timing_s/<stage>"]` and a span to the timeline. Stages take
the metrics dict explicitly, so stages of different steps can run concurrently (one-step-off). Generation
and weight sync go through the run's rollout backend (`asyncrl.rollout.RolloutBackend`), whichever it is.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Optional, Sequence

from asyncrl.algos import (ADVANTAGE_ESTIMATORS, AdaptiveKLController, AdvantageKnobs, FixedKLController,
                           apply_kl_penalty)
from asyncrl.config import AsyncRLConfig, needs_critic, needs_greedy_baseline, needs_reference
from asyncrl.core.advantage import rollout_correction
from asyncrl.core.byo_agent import agent_samples, load_agent_runner, score_agent_samples, start_agent_runs
from asyncrl.core.distillation import distill, teacher_failure_metrics, with_teacher_scores
from asyncrl.core.greedy_baseline import greedy_params, greedy_requests, with_greedy_results
from asyncrl.core.lengths import LengthDistribution
from asyncrl.core.metrics import advantage_metrics, prefill_metrics, sample_metrics
from asyncrl.core.records import Sample, samples_to_batch
from asyncrl.core.requests import make_requests
from asyncrl.core.scoring import decode_response, score_samples
from asyncrl.core.training_reward import score_for_training
from asyncrl.core.trainer_group import TrainerGroup
from asyncrl.core.validation import validation_metrics
from asyncrl.data.dataset import PromptDataset
from asyncrl.data.records import TokenizedPrompt
from asyncrl.engine import SamplingParams
from asyncrl.rewards import Scorer
from asyncrl.rollout import PendingGeneration, RolloutBackend
from asyncrl.rollout.agent.generation import start_agent_generation
from asyncrl.rollout.agent.loop import AgentLoop
from asyncrl.rollout.agent.metrics import agent_metrics, tool_spans
from asyncrl.teacher import TeacherPool
from asyncrl.telemetry import Timeline, Tracker, timed
from asyncrl.train import CriticUpdateSpec, PolicyUpdateSpec, TrainBatch


logger = logging.getLogger(__name__)

TRAINER_STAGES = frozenset({"old_log_prob", "ref", "values", "update_critic", "update_actor"})
MEASURED_BY_SYNC = ("weight_sync/bytes",)   # also counted by the trainer (a dense sync), measured by a sync


@dataclass
class GenerationJob:
    """Generation dispatched by `start_generate`, collected by `finish_generate`."""
    prompts: list[TokenizedPrompt]
    num_samples: int
    pending: PendingGeneration
    with_greedy: bool = False   # one greedy request per prompt follows the sampled ones (remax's baseline)
    validation: bool = False


class PPOCore:
    def __init__(self, config: AsyncRLConfig, trainers: TrainerGroup, rollout: RolloutBackend,
                 reward: Scorer, tokenizer: Any, tracker: Tracker, timeline: Timeline,
                 teacher: Optional[TeacherPool] = None):
        self.config = config
        self.teacher = teacher   # algorithm.distillation's teacher actors
        self.trainers = trainers
        self.rollout = rollout
        self.reward = reward
        self.tokenizer = tokenizer
        self.tracker = tracker
        self.timeline = timeline
        self.version = 0  # owned here; the engines stamp it on every token after a sync
        self.updates_since_sync = 0
        kl = config.algorithm.kl_ctrl
        self.kl_controller = AdaptiveKLController(kl.kl_coef, kl.target_kl, kl.horizon) if kl.type == "adaptive" \
            else FixedKLController(kl.kl_coef)
        self.lengths = LengthDistribution.parse(config.rollout.length_distribution) \
            if config.rollout.length_distribution else None
        self.use_critic = needs_critic(config)
        # Multi-turn rollouts (rollout.multi_turn): each request becomes a trajectory of turns and tool calls.
        self.agent = AgentLoop.from_config(config.rollout.multi_turn, tokenizer) \
            if config.rollout.multi_turn.enable else None
        # Your own agent (rollout.agent.path): each request is one run of it against a recording endpoint.
        self.agents = load_agent_runner(config, tokenizer)
        self.use_reference = needs_reference(config)
        self.use_greedy_baseline = needs_greedy_baseline(config)

    def timed(self, metrics: dict[str, float], stage: str):
        """Time a stage into metrics and the timeline (trainer-side stages on the "trainer" row)."""
        return timed(metrics, stage, self.timeline, "trainer" if stage in TRAINER_STAGES else "driver")

    def sampling(self, validation: bool) -> SamplingParams:
        rollout, budget = self.config.rollout, self.config.data.max_response_length
        if not validation:
            return SamplingParams.from_rollout(rollout, budget)
        val = rollout.val_kwargs
        return SamplingParams(temperature=val.temperature, top_p=val.top_p, top_k=val.top_k, max_new_tokens=budget)

    # ---- stages ---------------------------------------------------------------------------------------
    def generate(self, prompts: Sequence[TokenizedPrompt], salts: str | Sequence[str], metrics: dict[str, float],
                 validation: bool = False) -> list[Sample]:
        return self.finish_generate(self.start_generate(prompts, salts, validation), metrics)

    def start_generate(self, prompts: Sequence[TokenizedPrompt], salts: str | Sequence[str],
                       validation: bool = False) -> GenerationJob:
        """Dispatch generation for `prompts` (rollout.n samples each, or val_kwargs.n) and return at once.
        `salts` seed the requests (one per prompt, or one for all; see `make_requests`). When the estimator
        needs a greedy baseline, one greedy request per prompt goes in the same dispatch (same engines, same
        version)."""
        num_samples = self.config.rollout.val_kwargs.n if validation else self.config.rollout.n
        lengths = None if validation else self.lengths
        requests = make_requests(prompts, num_samples, self.sampling(validation), self.config.rollout.seed, salts,
                                 lengths)
        with_greedy = self.use_greedy_baseline and not validation
        if with_greedy:
            salts = [salts] * len(prompts) if isinstance(salts, str) else list(salts)
            requests += greedy_requests(prompts, salts, greedy_params(self.config.data.max_response_length,
                                                                      self.config.rollout.ignore_eos))
        return GenerationJob(list(prompts), num_samples, self.dispatch(requests, prompts, num_samples), with_greedy,
                             validation)

    def dispatch(self, requests: list, prompts: Sequence[TokenizedPrompt], num_samples: int) -> PendingGeneration:
        """To the rollout backend, through the agent loop with rollout.multi_turn, or to your own agent."""
        if self.agents is not None:
            records = [prompts[index // num_samples].record for index in range(len(requests))]
            return start_agent_runs(self.agents, self.rollout, requests, records, self.config.ray.rpc_timeout_s)
        if self.agent is None:
            return self.rollout.start_generate(requests)
        num_sampled = len(prompts) * num_samples   # then one greedy request per prompt, if any
        extra_infos = [prompts[index // num_samples if index < num_sampled else index - num_sampled].record.extra_info
                       for index in range(len(requests))]
        return start_agent_generation(self.rollout, self.agent, requests, extra_infos, self.config.ray.rpc_timeout_s)

    def finish_generate(self, job: GenerationJob, metrics: dict[str, float]) -> list[Sample]:
        """Wait for a dispatched generation. `timing_s/gen` is the time this call blocked; the generation
        itself took `timing_s/generate_async` (less blocking than generating means generation was hidden)."""
        with self.timed(metrics, "gen"):
            results = job.pending.results()
        metrics["timing_s/generate_async"] = job.pending.generation_seconds
        started_s = job.pending.started_s
        for output in job.pending.outputs:
            self.timeline.add_span(output.name, "generate", started_s, started_s + output.seconds)
        num_samples, num_sampled = job.num_samples, len(job.prompts) * job.num_samples
        samples = [Sample(job.prompts[index // num_samples], index // num_samples, index % num_samples, result)
                   for index, result in enumerate(results[:num_sampled])]
        if self.agent is not None:
            trajectories = job.pending.trajectories   # an AgentGeneration: one trajectory per request
            samples = [replace(sample, trajectory=trajectory) for sample, trajectory in zip(samples, trajectories)]
        if self.agents is not None:   # an AgentRunsGeneration: each run gives the samples it recorded
            samples = [sample for index, outcome in enumerate(job.pending.outcomes) for sample in
                       agent_samples(job.prompts[index // num_samples], index // num_samples, index % num_samples,
                                     outcome, empty=results[index] if job.validation else None)]
            metrics.update(self.agents.counters.metrics())
        return with_greedy_results(samples, results[num_sampled:]) if job.with_greedy else samples

    def compute_reward(self, samples: Sequence[Sample], metrics: dict[str, float],
                       validation: bool = False) -> list[Sample]:
        """Score samples. Training samples are also shaped (`reward.overlong_buffer`) and their greedy baselines
        scored (`core.training_reward`); validation scores are the reward function's alone."""
        with self.timed(metrics, "reward"):
            if self.agents is not None:   # scored by the agent's own reward
                scored, reward_metrics = score_agent_samples(samples, self.config, validation)
            elif validation:
                scored, reward_metrics = score_samples(samples, self.reward, self.tokenizer)
            else:
                scored, reward_metrics = score_for_training(samples, self.reward, self.tokenizer, self.config)
        metrics.update(reward_metrics)
        failed = [sample for sample in scored if sample.reward_error is not None]
        if failed:
            logger.warning("the reward failed on %d of %d samples (scored 0, counted in reward/num_errors and "
                           "reward/num_timeouts for the reward function, reward/model_errors and "
                           "reward/model_timeouts for the reward model); last error: %s",
                           len(failed), len(scored), failed[-1].reward_error)
        return scored

    def decode(self, sample: Sample) -> str:
        return decode_response(self.tokenizer, sample)

    def train(self, samples: Sequence[Sample], step: int, metrics: dict[str, float],
              anchor: str = "current") -> TrainBatch:
        """The stage tail every recipe shares, from scored samples to updated weights: batch -> old
        log-probs (`anchor`: see `compute_old_log_prob`) -> reference log-probs -> values -> advantages ->
        critic and actor updates; with distillation the teacher scores the samples first. Returns the batch it
        trained on."""
        samples = self.compute_teacher_log_prob(samples, metrics)
        batch = self.build_batch(samples, metrics)
        batch = self.compute_old_log_prob(batch, metrics, anchor)
        batch = self.compute_ref_log_prob(batch, metrics)
        batch = self.compute_values(batch, metrics)
        batch = self.compute_advantage(batch, metrics)
        self.update_critic(batch, step, metrics)
        self.update_actor(batch, step, metrics)
        return batch

    def compute_teacher_log_prob(self, samples: Sequence[Sample], metrics: dict[str, float]) -> list[Sample]:
        """algorithm.distillation: the teacher's log-probs of every response token, for the samples that have none
        yet (the fully-async rollouter scores its groups before queueing them)."""
        if self.teacher is None:
            return list(samples)
        with self.timed(metrics, "teacher"):
            samples = with_teacher_scores(samples, self.teacher)
        metrics.update(teacher_failure_metrics(samples))
        return samples

    def build_batch(self, samples: Sequence[Sample], metrics: dict[str, float]) -> TrainBatch:
        batch = samples_to_batch(samples)
        metrics.update(sample_metrics(batch, [sample.result.finish_reason for sample in samples], self.version))
        metrics.update(prefill_metrics([sample.result for sample in samples]))
        trajectories = [sample.trajectory for sample in samples if sample.trajectory is not None]
        metrics.update(agent_metrics(trajectories))   # multi-turn: turns, tool calls, tokens by source; every mode
        for name, start, end in tool_spans(trajectories):
            self.timeline.add_span("tools", name, start, end)
        metrics["param_version"] = float(self.version)
        return batch

    def compute_old_log_prob(self, batch: TrainBatch, metrics: dict[str, float],
                             anchor: str = "current") -> TrainBatch:
        """Bypass mode: the rollout's log-probs are the PPO anchor. Decoupled: recomputed by the trainer,
        with the current weights (`anchor="current"`) or with the last synced version (`"last_sync"`, for
        recipes that update several times between syncs: a host snapshot taken at the first update after
        each sync, while the weights still are that version)."""
        if self.config.algorithm.rollout_correction.bypass_mode:
            return batch.replace(old_log_probs=batch.need("rollout_log_probs", "compute_old_log_prob"))
        with self.timed(metrics, "old_log_prob"):
            use_snapshot = anchor == "last_sync" and self.updates_since_sync > 0
            if anchor == "last_sync" and not use_snapshot:
                self.trainers.snapshot_policy()
            old_log_probs, entropy = self.trainers.compute_log_prob(batch, use_snapshot=use_snapshot)
        mask = batch.response_mask
        metrics["actor/entropy"] = float((entropy * mask).sum() / mask.sum().clamp_min(1))
        return batch.replace(old_log_probs=old_log_probs)

    def compute_ref_log_prob(self, batch: TrainBatch, metrics: dict[str, float]) -> TrainBatch:
        if not self.use_reference:
            return batch
        with self.timed(metrics, "ref"):
            return batch.replace(ref_log_probs=self.trainers.compute_ref_log_prob(batch))

    def compute_values(self, batch: TrainBatch, metrics: dict[str, float]) -> TrainBatch:
        if not self.use_critic:
            return batch
        with self.timed(metrics, "values"):
            return batch.replace(values=self.trainers.compute_values(batch))

    def compute_advantage(self, batch: TrainBatch, metrics: dict[str, float]) -> TrainBatch:
        algorithm = self.config.algorithm
        with self.timed(metrics, "adv"):
            scores = batch.need("token_level_scores", "compute_advantage")
            rewards = scores
            if algorithm.use_kl_in_reward:
                rewards, kl_metrics = apply_kl_penalty(
                    scores, batch.need("old_log_probs", "KL in reward"), batch.need("ref_log_probs", "KL in reward"),
                    batch.response_mask, self.kl_controller.kl_coef, algorithm.kl_penalty)
                self.kl_controller.update(kl_metrics["actor/reward_kl_penalty"], batch.num_rows)
                metrics.update(kl_metrics)
            advantages, returns = ADVANTAGE_ESTIMATORS[algorithm.adv_estimator](
                rewards, batch.response_mask, batch.group_ids, AdvantageKnobs.from_sections(algorithm),
                values=batch.values, reward_baselines=batch.reward_baselines)
            batch = batch.replace(token_level_rewards=rewards, advantages=advantages, returns=returns)
            if algorithm.distillation.enable:
                batch = distill(batch, algorithm.distillation, metrics)
            # Rejection changes which tokens train, after advantages were computed over whole groups.
            batch = rollout_correction(batch, algorithm.rollout_correction, metrics)
        metrics.update(advantage_metrics(batch))
        return batch

    def update_critic(self, batch: TrainBatch, step: int, metrics: dict[str, float]) -> None:
        if not self.use_critic:
            return
        with self.timed(metrics, "update_critic"):
            metrics.update(self.trainers.update_critic(batch, CriticUpdateSpec.from_config(
                self.config, batch.num_rows, step)))

    def update_actor(self, batch: TrainBatch, step: int, metrics: dict[str, float]) -> None:
        if step <= self.config.trainer.critic_warmup:
            return
        with self.timed(metrics, "update_actor"):
            update = self.trainers.update_actor(batch, PolicyUpdateSpec.from_config(self.config, batch.num_rows, step))
        # The trainer counts the bytes a dense sync of its weights moves; a sync that ran in this step (before the
        # update) measured what it really moved, sparse deltas included, and that is kept.
        metrics.update({**update, **{name: metrics[name] for name in MEASURED_BY_SYNC if name in metrics}})
        self.updates_since_sync += 1

    def sync_weights(self, metrics: dict[str, float]) -> None:
        with self.timed(metrics, "sync_weights"):
            self.version += 1
            self.rollout.sync_weights(self.version)
        self.updates_since_sync = 0
        metrics["param_version"] = float(self.version)
        stats = self.rollout.sync_stats()
        if stats is not None:
            metrics.update(stats.metrics())
        metrics.update(self.rollout.health().metrics())

    def validate(self, dataset: PromptDataset, metrics: dict[str, float]) -> list[Sample]:
        """Generate for every validation prompt with `rollout.val_kwargs` and score; adds val/* metrics."""
        samples: list[Sample] = []
        size = self.config.data.val_batch_size
        with self.timed(metrics, "validate"):
            for start in range(0, len(dataset), size):
                prompts = dataset.prompts[start:start + size]
                samples += self.compute_reward(self.generate(prompts, "val", {}, validation=True), {}, validation=True)
        metrics.update(validation_metrics(samples, self.config.rollout.val_kwargs.n))
        return samples

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.tracker.log(metrics, step)

    # ---- state ----------------------------------------------------------------------------------------
    @property
    def weights_version(self) -> int:
        """The version the trainer's weights carry: the rollout's version, or the next one when updates were
        made since the last sync (the version the next sync will give them)."""
        return self.version + 1 if self.updates_since_sync else self.version

    def state_dict(self) -> dict[str, Any]:
        """A checkpoint names its weights by the version they carry, not by the rollout's: a checkpoint written
        between an update and the sync that pushes it (fully_async saves inside the sync, before the push;
        one_step_off after its update) would otherwise give the rollout's version to two weight sets."""
        return {"version": self.weights_version, "kl_controller": self.kl_controller.state_dict()}

    def load_state_dict(self, state: dict[str, Any], trainer_folder: Optional[str]) -> None:
        """Loading pushes the checkpoint's weights to the rollout under their version: that push is the sync
        the saving run had not made yet, so nothing is pending afterwards (`updates_since_sync` = 0) and the
        next sync bumps the version once, as it does in a run that was never interrupted."""
        self.version = state["version"]
        self.updates_since_sync = 0
        self.kl_controller.load_state_dict(state["kl_controller"])
        if trainer_folder is not None:
            self.trainers.load_checkpoint(trainer_folder)
            self.rollout.sync_weights(self.version)
