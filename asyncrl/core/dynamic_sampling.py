"""Dynamic sampling (DAPO, `algorithm.filter_groups`): train only the groups whose rewards vary.

Under a group estimator a group whose rollout.n responses all got the same reward has zero advantage: it costs
a forward and backward pass and teaches nothing. Dynamic sampling drops such groups after scoring and keeps
generating until a step has its groups. The filter is one pure function every mode uses (`has_signal`); what
feeds it differs by mode:

- sync and one_step_off (`GroupCollector`): a step scores a generation batch of data.train_batch_size prompts,
  keeps the groups with signal, and draws the next batch until it holds data.train_batch_size of them. Groups
  with signal beyond that in the last batch are dropped (`filter/num_surplus_groups`), as in the reference
  system, so that every prompt drawn is settled within its step and a checkpoint's cursor stays exact.
  `max_num_gen_batches` batches without enough signal stop the run (`DynamicSamplingError`).
- fully_async (the rollouter): each group is filtered as soon as it is scored; only groups with signal reach
  the queue, and the filtered group's prompt leaves the staleness budget (see `recipes/fully_async/budget.py`).

    samples = GroupCollector.from_config(config).fill(next_scored_batch, metrics)   # [] when the data ran out
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from asyncrl.config import AsyncRLConfig, prompts_per_step
from asyncrl.core.records import Sample


class DynamicSamplingError(RuntimeError):
    """Dynamic sampling used `algorithm.filter_groups.max_num_gen_batches` batches without filling a step."""


def filter_value(sample: Sample, metric: str) -> float:
    """The value dynamic sampling compares within a group (`algorithm.filter_groups.metric`): `acc` is the
    reward function's `acc` extra when it reports one, else its score; `score` the reward function's score;
    `seq_reward` the trained reward (score plus the overlong penalty)."""
    if metric == "acc":
        return sample.reward_extra["acc"] if "acc" in sample.reward_extra else score_of(sample)
    if metric == "score":
        return score_of(sample)
    if metric == "seq_reward":
        return sample.reward
    raise ValueError(f"algorithm.filter_groups.metric: unknown metric {metric!r}")


def score_of(sample: Sample) -> float:
    if sample.score is None:
        raise ValueError(f"sample {sample.result.request_id} has no score yet: compute_reward comes first")
    return sample.score


def has_signal(group: Sequence[Sample], metric: str) -> bool:
    """Whether the group's `metric` values are not all equal, so a group estimator gives it an advantage.
    A group of one response is kept (nothing to compare; the reference system keeps it too)."""
    return len(group) == 1 or len({filter_value(sample, metric) for sample in group}) > 1


def split_into_groups(samples: Sequence[Sample]) -> list[list[Sample]]:
    """The samples of one generation batch as groups (by group index), in the batch's order."""
    groups: dict[int, list[Sample]] = {}
    for sample in samples:
        groups.setdefault(sample.group_index, []).append(sample)
    return list(groups.values())


def renumber_groups(groups: Sequence[Sequence[Sample]]) -> list[Sample]:
    """Flatten groups drawn from several batches, group i getting group index i: a sample's group index is its
    prompt's position in its own batch and becomes the TrainBatch's group id, so groups of two batches would
    otherwise share ids and be normalised together."""
    return [dataclasses.replace(sample, group_index=index) for index, group in enumerate(groups) for sample in group]


@dataclass
class GroupCollector:
    """The groups of one step, from as many generation batches as it takes (sync and one_step_off). With
    filtering off it passes one batch through unchanged."""
    num_groups: int                 # groups a step trains: data.train_batch_size
    metric: str
    max_num_gen_batches: int        # 0 = no limit
    enabled: bool = True
    kept: list[list[Sample]] = field(default_factory=list)
    num_gen_batches: int = 0
    num_generated_groups: int = 0
    num_filtered_groups: int = 0

    @classmethod
    def from_config(cls, config: AsyncRLConfig) -> "GroupCollector":
        settings = config.algorithm.filter_groups
        return cls(config.data.train_batch_size, settings.metric, settings.max_num_gen_batches, settings.enable)

    @property
    def is_full(self) -> bool:
        """Whether the step has its groups (without filtering: once one batch came)."""
        return len(self.kept) >= self.num_groups if self.enabled else self.num_gen_batches > 0

    def add(self, samples: Sequence[Sample]) -> None:
        """A scored generation batch: keep its groups with signal (all of them without filtering)."""
        self.num_gen_batches += 1
        for group in split_into_groups(samples):
            self.num_generated_groups += 1
            if not self.enabled or has_signal(group, self.metric):
                self.kept.append(group)
            else:
                self.num_filtered_groups += 1
        if self.enabled and not self.is_full and 0 < self.max_num_gen_batches <= self.num_gen_batches:
            raise DynamicSamplingError(
                f"dynamic sampling generated {self.num_gen_batches} batches (algorithm.filter_groups."
                f"max_num_gen_batches={self.max_num_gen_batches}) and kept {len(self.kept)} of the "
                f"{self.num_groups} groups a step needs: {self.num_filtered_groups} of "
                f"{self.num_generated_groups} groups got the same {self.metric} for every response. The data is "
                f"too easy or too hard for the policy; raise max_num_gen_batches (0 = no limit) or change the data")

    def fill(self, next_batch: Callable[[], Optional[list[Sample]]], metrics: dict[str, float]) -> list[Sample]:
        """Add the scored batches `next_batch` returns until the step is full or it returns None (the data ran
        out), then `take`."""
        while not self.is_full:
            samples = next_batch()
            if samples is None:
                break
            self.add(samples)
        return self.take(metrics)

    def take(self, metrics: dict[str, float]) -> list[Sample]:
        """The step's samples (the first num_groups groups kept, renumbered) and its `filter/*` metrics. Fewer
        groups only when the data ran out first."""
        if not self.enabled:
            return [sample for group in self.kept for sample in group]
        trained = self.kept[:self.num_groups]
        metrics.update(filter_metrics(self.num_gen_batches, self.num_generated_groups, self.num_filtered_groups,
                                      len(trained)))
        return renumber_groups(trained)


def filter_metrics(num_gen_batches: int, num_generated: int, num_filtered: int, num_trained: int) -> dict[str, float]:
    """A step's `filter/*` metrics: generated = trained + filtered + surplus (groups with signal beyond the step's
    needs in its last batch, dropped)."""
    return {"filter/num_gen_batches": float(num_gen_batches),
            "filter/num_generated_groups": float(num_generated),
            "filter/num_filtered_groups": float(num_filtered),
            "filter/num_trained_groups": float(num_trained),
            "filter/num_surplus_groups": float(num_generated - num_filtered - num_trained),
            "filter/kept_ratio": (num_generated - num_filtered) / max(num_generated, 1)}


@dataclass
class FilterWindow:
    """Dynamic sampling's cap on a stream of groups (the fully-async rollouter), in verl's unit: a window closes
    once it kept the groups of one step (R); `max_num_gen_batches` x R groups scored in one window without
    that stops the run (`DynamicSamplingError`)."""
    enabled: bool
    metric: str
    num_groups: int                 # R: the groups of one fully_async step
    max_num_gen_batches: int        # 0 = no limit
    num_generated: int = 0
    num_kept: int = 0

    @classmethod
    def from_config(cls, config: AsyncRLConfig) -> "FilterWindow":
        settings = config.algorithm.filter_groups
        return cls(settings.enable, settings.metric, prompts_per_step(config), settings.max_num_gen_batches)

    def count(self, is_kept: bool) -> None:
        """One more scored group (kept or filtered)."""
        self.num_generated += 1
        self.num_kept += is_kept
        if self.num_kept >= self.num_groups:
            self.num_generated = self.num_kept = 0
        elif 0 < self.max_num_gen_batches and self.num_generated >= self.max_num_gen_batches * self.num_groups:
            raise DynamicSamplingError(
                f"dynamic sampling scored {self.num_generated} groups ({self.max_num_gen_batches} batches of "
                f"{self.num_groups}, algorithm.filter_groups.max_num_gen_batches={self.max_num_gen_batches}) and "
                f"kept {self.num_kept} of the {self.num_groups} a step needs: the others got the same "
                f"{self.metric} for every response. The data is too easy or too hard for the policy; raise "
                f"max_num_gen_batches (0 = no limit) or change the data")
