"""Records between the generation stage and the training batch.

A `Sample` is one response to one prompt: who asked (the prompt record and its tokens), what the engine
returned (tokens, log-probs, per-token versions, finish reason), and, once scored, its reward: the reward
function's `score` plus the `overlong_penalty` of reward shaping. An estimator that compares each response with
the prompt's greedy one (remax) finds that response in `greedy`, shared by the group, and its reward in
`baseline_score`. `samples_to_batch` packs samples into the padded `TrainBatch` the trainer consumes.

A multi-turn sample also holds its `trajectory` (`asyncrl.rollout.agent.Trajectory`): its `result` is the
trajectory as one response (model turns and tool results in order), and the trajectory's loss mask zeroes
the tool tokens in the batch's `response_mask`, so no loss, advantage, KL or entropy term sees them; the
reward sits on the last model token.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional, Sequence

import numpy as np
import torch

from asyncrl.data.records import TokenizedPrompt
from asyncrl.engine import GenerationResult
from asyncrl.models.routing import pack_routing_records
from asyncrl.rollout.agent import Trajectory
from asyncrl.teacher import TeacherScore
from asyncrl.train.batch import TrainBatch


@dataclass(frozen=True)
class Sample:
    prompt: TokenizedPrompt
    group_index: int                   # which prompt of the batch: the GRPO group
    sample_index: int                  # 0 .. rollout.n - 1 within the group
    result: GenerationResult
    score: Optional[float] = None      # filled by compute_reward
    reward_extra: dict[str, float] = field(default_factory=dict)
    reward_error: Optional[str] = None
    overlong_penalty: float = 0.0      # <= 0: DAPO's overlong shaping (reward.overlong_buffer), added to the score
    greedy: Optional[GenerationResult] = None   # the prompt's greedy response, when the estimator needs a baseline
    baseline_score: Optional[float] = None      # the greedy response's reward, scored and shaped like this one
    trajectory: Optional[Trajectory] = None     # multi-turn: the token log `result` was made from
    teacher: Optional[TeacherScore] = None      # the distillation teacher's log-probs of the response tokens

    @property
    def reward(self) -> float:
        """What trains: the score plus the overlong penalty (the score must be set)."""
        if self.score is None:
            raise ValueError(f"sample {self.result.request_id} has no score yet: compute_reward comes first")
        return self.score + self.overlong_penalty

    @property
    def prompt_id(self) -> str:
        return self.prompt.record.prompt_id

    @property
    def num_response_tokens(self) -> int:
        return self.result.num_response_tokens

    @property
    def loss_mask(self) -> np.ndarray:
        """(R,) 1 on response tokens that train: all of a single-turn response, the model's tokens of a
        trajectory."""
        if self.trajectory is None:
            return np.ones(self.num_response_tokens, dtype=np.int8)
        return self.trajectory.loss_mask

    @property
    def last_trained_index(self) -> int:
        """Index of the response token the reward sits on: the last one that trains (-1 if none)."""
        if self.trajectory is None:
            return self.num_response_tokens - 1
        trained = np.flatnonzero(self.trajectory.loss_mask)
        return int(trained[-1]) if trained.size else -1

    def with_reward(self, score: float, extra: dict[str, float], error: Optional[str]) -> "Sample":
        return replace(self, score=score, reward_extra=extra, reward_error=error)


def samples_to_batch(samples: Sequence[Sample], pad_id: int = 0) -> TrainBatch:
    """Pack samples (in order) into a TrainBatch with rollout log-probs, versions, the response mask (0 on a
    trajectory's tool tokens) and, if scored, token-level scores (the reward sits on the last trained token)
    and, if every sample has one, the greedy baselines (B,), and the MoE engine's routing records (B, T, L, k)."""
    batch = TrainBatch.from_sequences([sample.result.prompt_ids.tolist() for sample in samples],
                                      [sample.result.response_ids.tolist() for sample in samples],
                                      [sample.group_index for sample in samples], pad_id)
    width = batch.max_response_length
    log_probs = np.zeros((len(samples), width), dtype=np.float32)
    versions = np.zeros((len(samples), width), dtype=np.int64)
    for row, sample in enumerate(samples):
        length = sample.num_response_tokens
        log_probs[row, :length] = sample.result.response_log_probs
        versions[row, :length] = sample.result.response_versions
    batch = batch.replace(rollout_log_probs=torch.from_numpy(log_probs), versions=torch.from_numpy(versions))
    if any(sample.trajectory is not None for sample in samples):
        mask = batch.response_mask.clone()
        for row, sample in enumerate(samples):
            mask[row, :sample.num_response_tokens] = torch.from_numpy(sample.loss_mask.astype(np.float32))
        batch = batch.replace(response_mask=mask)
    if all(sample.score is not None for sample in samples):
        scores = np.zeros((len(samples), width), dtype=np.float32)
        for row, sample in enumerate(samples):
            index = sample.last_trained_index
            if index >= 0:
                scores[row, index] = sample.reward
        batch = batch.replace(token_level_scores=torch.from_numpy(scores))
    if samples and all(sample.baseline_score is not None for sample in samples):
        batch = batch.replace(reward_baselines=torch.tensor([sample.baseline_score for sample in samples]))
    if any(sample.teacher is not None for sample in samples):
        batch = batch.replace(**teacher_fields(samples, width))
    routed = pack_routing_records([sample.result.routed_experts for sample in samples], batch.input_ids.shape[1])
    if routed is not None:
        batch = batch.replace(routed_experts=torch.from_numpy(routed))
    return batch


def teacher_fields(samples: Sequence[Sample], width: int) -> dict[str, torch.Tensor]:
    """teacher_log_probs and teacher_mask (B, width): the rows the teacher scored, 0 elsewhere."""
    log_probs = np.zeros((len(samples), width), dtype=np.float32)
    mask = np.zeros((len(samples), width), dtype=np.float32)
    for row, sample in enumerate(samples):
        if sample.teacher is not None and sample.teacher.is_scored:
            length = sample.num_response_tokens
            log_probs[row, :length] = sample.teacher.log_probs
            mask[row, :length] = 1.0
    return {"teacher_log_probs": torch.from_numpy(log_probs), "teacher_mask": torch.from_numpy(mask)}
