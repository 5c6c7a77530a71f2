"""One-step-off-policy PPO / GRPO: generation of batch s+1 runs on the rollout devices while the trainer
trains on batch s.

    asyncrl train config.yaml trainer.mode=one_step_off rollout.n_gpus_per_node=1

Step s: wait for batch s (`timing_s/wait_prev_gen`: the part of generation training did not hide), push
the trainer's weights to the replicas, start generating batch s+1, then score and train on batch s with
the same core stages as the sync recipe. Batch s was sampled by the weights pushed at step s-1, so every
token is exactly one version stale (`staleness/mean` = 1). A generation never sees a weight change half
way: the push happens between two generations. Old log-probs default to the rollout's (bypass mode);
`algorithm.rollout_correction.bypass_mode=false` recomputes them on the trainer (decoupled mode). With dynamic
sampling (`algorithm.filter_groups.enable`) a step that lacks groups with signal takes the next batches of the
pipeline too (each dispatched as its predecessor is collected), without a weight push between them.

A push happens only when the weights changed, except the first step's, which names the initial weights
version 1 so that every batch is one version behind the weights it trains. A version therefore names one set of
weights, also across a resume: the resumed rollout already holds the checkpoint's weights, under the version the
push would have given them (`PPOCore.state_dict`), so its first step pushes nothing.

A checkpoint records the data cursor before the batch in flight, so a resumed run regenerates that batch
instead of losing it, and trains no prompt twice.
"""

from __future__ import annotations

from typing import Any, Optional

from asyncrl.core import Runtime
from asyncrl.core.dynamic_sampling import GroupCollector
from asyncrl.core.records import Sample
from asyncrl.core.stages import GenerationJob
from asyncrl.recipes.training_loop import TrainingLoop


class OneStepOffRecipe:
    def __init__(self, runtime: Runtime):
        self.runtime = runtime
        self.core = runtime.core
        self.loop = TrainingLoop.create(runtime)
        self.cursor_before_in_flight: Optional[dict[str, int]] = None
        self.job: Optional[GenerationJob] = None
        self.synced_in_step = False   # whether this step pushed the last update's weights yet

    def start_next(self, step: int) -> Optional[GenerationJob]:
        """Dispatch generation of the batch for `step` (None when the data or the step budget is used up)."""
        if step > self.loop.total_steps or self.loop.sampler.is_exhausted:
            return None
        self.cursor_before_in_flight = self.loop.sampler.state_dict()
        return self.core.start_generate(*self.loop.next_prompts())

    def begin(self) -> None:
        self.job = self.start_next(self.loop.step + 1)

    def has_next(self) -> bool:
        return self.job is not None

    def step(self, step: int) -> tuple[dict[str, float], list[Sample]]:
        metrics: dict[str, float] = {}
        self.synced_in_step = False
        samples = GroupCollector.from_config(self.runtime.config).fill(lambda: self.next_batch(step, metrics),
                                                                       metrics)
        metrics["timing_s/wait_prev_gen"] = metrics["timing_s/gen"]
        if samples:  # none only when dynamic sampling found no group with signal before the data ran out
            self.core.train(samples, step, metrics)
        return metrics, samples

    def next_batch(self, step: int, metrics: dict[str, float]) -> Optional[list[Sample]]:
        """The batch in flight, scored, once the next one is dispatched; the first batch of a step pushes the last
        update's weights before that dispatch. With dynamic sampling a step may take several batches: the later
        ones come from the same pipeline, sampled by the weights just pushed."""
        if self.job is None:
            # The pipeline stopped at the last step's batch; a last step that needs more generates them now.
            self.job = self.start_next(step)
            if self.job is None:
                return None
        samples = self.core.finish_generate(self.job, metrics)
        if not self.synced_in_step:
            if self.core.updates_since_sync or step == 1:
                self.core.sync_weights(metrics)
            self.synced_in_step = True
        self.job = self.start_next(step + 1)
        return self.core.compute_reward(samples, metrics)

    def maybe_checkpoint(self) -> None:
        # The batch in flight is not in the checkpoint: it is regenerated from the cursor before it.
        self.loop.maybe_save(sampler_state=self.cursor_before_in_flight if self.job is not None else None)

    def finish_training(self) -> None:
        if self.core.updates_since_sync:
            self.core.sync_weights({})  # the final validation and the exported policy see the last update

    def save_final_checkpoint(self) -> None:
        # A run stopped by a signal still has a batch in flight: it is regenerated on resume.
        self.loop.save(sampler_state=self.cursor_before_in_flight if self.job is not None else None)

    def fit(self) -> dict[str, Any]:
        return self.loop.run(self)
