"""One-step-off-policy PPO / GRPO: generation of batch s+1 runs on the rollout devices while the trainer
trains on batch s.

    asyncrl train config.yaml trainer.mode=one_step_off rollout.n_gpus_per_node=1

Step s: wait for batch s (`timing_s/wait_prev_gen`: the part of generation training did not hide), push
the trainer's weights to the replicas, start generating batch s+1, then score and train on batch s with
the same core stages as the sync recipe. Batch s was sampled by the weights pushed at step s-1, so every
token is exactly one version stale (`staleness/mean` = 1). A generation never sees a weight change half
way: the push happens between two generations. Old log-probs default to the rollout's (bypass mode);
`algorithm.rollout_correction.bypass_mode=false` recomputes them on the trainer (decoupled mode).

A checkpoint records the data cursor before the batch in flight, so a resumed run regenerates that batch
instead of losing it, and trains no prompt twice.
"""

from __future__ import annotations

from typing import Any, Optional

from asyncrl.core import Runtime
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
        samples = self.core.finish_generate(self.job, metrics)
        metrics["timing_s/wait_prev_gen"] = metrics["timing_s/gen"]
        self.core.sync_weights(metrics)
        self.job = self.start_next(step + 1)
        samples = self.core.compute_reward(samples, metrics)
        self.core.train(samples, step, metrics)
        return metrics, samples

    def maybe_checkpoint(self) -> None:
        # The batch in flight is not in the checkpoint: it is regenerated from the cursor before it.
        self.loop.maybe_save(sampler_state=self.cursor_before_in_flight if self.job is not None else None)

    def finish_training(self) -> None:
        self.core.sync_weights({})  # the final validation and the exported policy see the last update

    def save_final_checkpoint(self) -> None:
        # A run stopped by a signal still has a batch in flight: it is regenerated on resume.
        self.loop.save(sampler_state=self.cursor_before_in_flight if self.job is not None else None)

    def fit(self) -> dict[str, Any]:
        return self.loop.run(self)
