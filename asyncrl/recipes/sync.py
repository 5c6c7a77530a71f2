"""Colocated synchronous PPO / GRPO: generate, score, train, sync, on the same devices, one step at a time.

    asyncrl train config.yaml trainer.mode=sync

With the default backend (`rollout.backend=colocated`) the engines live inside the trainer ranks (they sleep
while training on GPU), and weights move in process after each update, so every token is sampled by the
current policy (staleness 0). The step is only stage calls; the stages live in `asyncrl.core`. With dynamic
sampling (`algorithm.filter_groups.enable`) a step generates and scores batches until it has
data.train_batch_size groups whose rewards vary (`core.dynamic_sampling`).
"""

from __future__ import annotations

from typing import Any, Optional

from asyncrl.core import Runtime
from asyncrl.core.dynamic_sampling import GroupCollector
from asyncrl.core.records import Sample
from asyncrl.recipes.training_loop import TrainingLoop


class SyncRecipe:
    def __init__(self, runtime: Runtime):
        self.runtime = runtime
        self.core = runtime.core
        self.loop = TrainingLoop.create(runtime)

    def begin(self) -> None:
        pass

    def has_next(self) -> bool:
        return not self.loop.is_done

    def step(self, step: int) -> tuple[dict[str, float], list[Sample]]:
        metrics: dict[str, float] = {}
        samples = GroupCollector.from_config(self.runtime.config).fill(lambda: self.next_batch(metrics), metrics)
        if samples:  # none only when dynamic sampling found no group with signal before the data ran out
            self.core.train(samples, step, metrics)
            self.core.sync_weights(metrics)
        return metrics, samples

    def next_batch(self, metrics: dict[str, float]) -> Optional[list[Sample]]:
        """The next data.train_batch_size prompts, generated and scored (None once the data is used up)."""
        prompts, salts = self.loop.next_prompts()
        if not prompts:
            return None
        samples = self.core.generate(prompts, salts, metrics)
        return self.core.compute_reward(samples, metrics)

    def maybe_checkpoint(self) -> None:
        self.loop.maybe_save()  # nothing runs ahead of training: the live cursor is the right one

    def finish_training(self) -> None:
        pass

    def save_final_checkpoint(self) -> None:
        self.loop.save()

    def fit(self) -> dict[str, Any]:
        return self.loop.run(self)
