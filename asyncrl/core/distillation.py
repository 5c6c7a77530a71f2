"""On-policy distillation in the core (algorithm.distillation): the teacher scores the responses a step trains,
and its per-token signal joins their advantages (`asyncrl.algos.distillation`).

    samples = with_teacher_scores(samples, pool)            # every sample the teacher has not scored yet
    metrics |= teacher_failure_metrics(samples)             # per step: responses left without a signal
    batch = distill(batch, config.algorithm.distillation, metrics)   # in compute_advantage, after the estimator

Where the teacher runs differs by mode only in time: sync and one-step-off score a step's samples at the start of
its training stages (in one-step-off, while the next batch generates); the fully-async rollouter scores each
group before it is queued, so the trainer never waits for the teacher and its samples arrive scored.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from asyncrl.algos.distillation import distillation_advantages
from asyncrl.config.distillation_schema import DistillationConfig
from asyncrl.core.records import Sample
from asyncrl.teacher import TeacherPool
from asyncrl.teacher.records import ERROR, TIMEOUT
from asyncrl.train import TrainBatch


def with_teacher_scores(samples: Sequence[Sample], pool: TeacherPool) -> list[Sample]:
    """The samples, each with the teacher's score (the ones that had one keep it); one call to the actors."""
    unscored = [index for index, sample in enumerate(samples) if sample.teacher is None]
    if not unscored:
        return list(samples)
    rows = [(samples[index].result.prompt_ids, samples[index].result.response_ids) for index in unscored]
    scored = list(samples)
    for index, score in zip(unscored, pool.collect(pool.start(rows))):
        scored[index] = replace(samples[index], teacher=score)
    return scored


def teacher_failure_metrics(samples: Sequence[Sample]) -> dict[str, float]:
    """How many of a step's responses the teacher could not score, by cause."""
    failures = [sample.teacher.failure for sample in samples if sample.teacher is not None]
    return {"distillation/teacher_errors": float(failures.count(ERROR)),
            "distillation/teacher_timeouts": float(failures.count(TIMEOUT))}


def distill(batch: TrainBatch, settings: DistillationConfig, metrics: dict[str, float]) -> TrainBatch:
    """The batch with the teacher's signal in its advantages (student log-probs: the PPO anchor, old_log_probs)."""
    advantages, distill_metrics = distillation_advantages(
        batch.need("advantages", "distillation"), batch.need("old_log_probs", "distillation"),
        batch.need("teacher_log_probs", "distillation"), batch.response_mask,
        batch.need("teacher_mask", "distillation"), settings.coef, settings.task_reward_weight)
    metrics.update(distill_metrics)
    return batch.replace(advantages=advantages)
