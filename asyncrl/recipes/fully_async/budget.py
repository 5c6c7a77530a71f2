"""Admission control of the fully-async rollouter: how many prompts each parameter version may start.

With R prompts per local step (`actor.ppo_mini_batch_size` x `async_training.require_batches`), K local
steps per sync (`trigger_parameter_sync_step`) and staleness threshold s, a version may start at most
M = int(R x (1 + s) x K) prompts. Work still outstanding at a sync (generating, parked partial samples,
queued) is charged to the new version's budget, so outstanding work never exceeds M. Since the trainer
consumes K x R prompts per version, in oldest-first order, a prompt is trained at most ceil(s) versions
after the one that started it (s = 0 with K = 1 is the on-policy pipeline: staleness 0). Nothing is
ever dropped: a sample that finishes is trained, however long or old it is.

Dynamic sampling (`algorithm.filter_groups`) drops the groups whose rewards do not vary, after scoring. Such a
group is released from the budget (`release`): it will never be trained, so it is no part of the outstanding
work the bound is about, and keeping its charge would starve admission (a version that filters more than
s / (1 + s) of its prompts could never fill its K steps, and the pipeline would stop). So M bounds the prompts
of a version that are outstanding or trained, and a version may admit more than M prompts in all, the surplus
being exactly the filtered ones (`fully_async/rollouter/admitted_in_version` counts them all). The staleness
bound above holds unchanged for every trained sample.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from asyncrl.config import AsyncRLConfig


@dataclass
class StalenessBudget:
    prompts_per_step: int          # R
    steps_per_sync: int            # K
    staleness_threshold: float     # s
    charged: int = 0               # prompts charged to the current version

    @classmethod
    def from_config(cls, config: AsyncRLConfig) -> "StalenessBudget":
        asynchronous = config.async_training
        return cls(config.actor.ppo_mini_batch_size * asynchronous.require_batches,
                   asynchronous.trigger_parameter_sync_step, asynchronous.staleness_threshold)

    @property
    def max_per_version(self) -> int:
        """M = int(R (1 + s) K)."""
        return int(self.prompts_per_step * (1 + self.staleness_threshold) * self.steps_per_sync)

    @property
    def max_staleness(self) -> int:
        """The most versions a trained token can lag behind the trainer (without partial rollout)."""
        return math.ceil(self.staleness_threshold)

    def can_admit(self) -> bool:
        return self.charged < self.max_per_version

    def admit(self) -> None:
        self.charged += 1

    def release(self) -> None:
        """A prompt charged to this version will never be trained (dynamic sampling filtered its group)."""
        if self.charged <= 0:
            raise RuntimeError("staleness budget released below zero: a filtered group was released twice")
        self.charged -= 1

    def on_sync(self, outstanding: int) -> None:
        """A new version starts; what is still outstanding counts against its budget."""
        self.charged = outstanding
