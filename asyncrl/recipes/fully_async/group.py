"""One admitted prompt in the fully-async rollouter: its group of response slots, and the request of each slot.

    requests = SlotRequests.from_config(config)
    group = Group(prompt, epoch, serial, [None] * (n + 1), num_samples=n)   # the last slot: the greedy baseline
    requests.sampled(group, slot)          # a sampled slot's first request, seeded by (rollout.seed, prompt, slot, epoch)
    requests.greedy(group)                 # the greedy slot's request, new or resumed after an abort

A `Group` is a checkpoint record (`state_codec.py` writes it by field name): a field added later needs a default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from asyncrl.config import AsyncRLConfig, needs_greedy_baseline
from asyncrl.core.greedy_baseline import GREEDY_SUFFIX, greedy_params
from asyncrl.core.lengths import LengthDistribution
from asyncrl.core.records import Sample
from asyncrl.core.requests import request_params, request_seed
from asyncrl.data.records import TokenizedPrompt
from asyncrl.engine import GenerationRequest, GenerationResult, SamplingParams
from asyncrl.rollout.agent import Trajectory


@dataclass
class Group:
    """One prompt's rollout.n responses, then its greedy response when the estimator needs a baseline (the last
    slot); a slot is None until its response finished (or was aborted)."""
    prompt: TokenizedPrompt
    epoch: int
    serial: int
    results: list[Optional[GenerationResult]]
    scored: list[Sample] = field(default_factory=list)
    num_samples: int = -1     # rollout.n; -1: every slot is a sampled response (no greedy slot)
    trajectories: dict[int, Trajectory] = field(default_factory=dict)   # rollout.multi_turn: each slot's log
    agent_samples: dict[int, list[Sample]] = field(default_factory=dict)   # rollout.agent: each finished run's

    @property
    def is_generated(self) -> bool:
        return all(result is not None and result.finish_reason != "abort" for result in self.results)

    @property
    def greedy_slot(self) -> Optional[int]:
        return self.num_samples if 0 <= self.num_samples < len(self.results) else None

    def samples(self) -> list[Sample]:
        """The sampled responses as samples (group index 0: the trainer renumbers), the greedy one riding on each."""
        if self.agent_samples:   # rollout.agent: a run gives as many samples as it recorded histories
            return [sample for slot in sorted(self.agent_samples) for sample in self.agent_samples[slot]]
        greedy = None if self.greedy_slot is None else self.results[self.greedy_slot]
        sampled = self.results if self.greedy_slot is None else self.results[:self.greedy_slot]
        return [Sample(self.prompt, 0, slot, result, greedy=greedy, trajectory=self.trajectories.get(slot))
                for slot, result in enumerate(sampled)]


@dataclass(frozen=True)
class SlotRequests:
    """The run's sampling for a group's slots: each sampled slot has its own seed, so a resumed run draws the same
    numbers, and its own token budget under rollout.length_distribution; the greedy slot has the whole budget."""
    seed: int                                  # rollout.seed
    params: SamplingParams
    lengths: Optional[LengthDistribution]
    greedy_params: Optional[SamplingParams]    # None unless the estimator needs a greedy baseline

    @classmethod
    def from_config(cls, config: AsyncRLConfig) -> "SlotRequests":
        max_length = config.data.max_response_length
        lengths = config.rollout.length_distribution
        return cls(config.rollout.seed, SamplingParams.from_rollout(config.rollout, max_length),
                   LengthDistribution.parse(lengths) if lengths else None,
                   greedy_params(max_length, config.rollout.ignore_eos) if needs_greedy_baseline(config) else None)

    def sampled_params(self, group: Group, slot: int) -> SamplingParams:
        seed = request_seed(self.seed, group.prompt.record.prompt_id, slot, f"epoch{group.epoch}")
        return request_params(self.params, seed, self.lengths)

    def sampled(self, group: Group, slot: int) -> GenerationRequest:
        """A sampled slot's first request, named `g<serial>/<slot>`."""
        return GenerationRequest(f"g{group.serial}/{slot}", group.prompt.prompt_ids, self.sampled_params(group, slot))

    def greedy(self, group: Group) -> GenerationRequest:
        """The group's greedy response (temperature 0, the whole token budget), new or resumed after an abort."""
        previous = group.results[group.greedy_slot]
        if previous is None:
            return GenerationRequest(f"g{group.serial}/{GREEDY_SUFFIX}", group.prompt.prompt_ids, self.greedy_params)
        return GenerationRequest.resume(previous, self.greedy_params)
