"""A run's reward: the rule score of the reward function, combined with a reward model's or judge's score when
`reward.model.enable`.

    scorer = Scorer(RewardExecutor.from_config(config.reward), RewardModelPool.launch(config.reward.model),
                    config.reward.model)
    results = scorer.score(requests)      # like RewardExecutor.score: one RewardResult per request, in order
    scorer.metrics()                      # the executor's counters and the pool's (reward/model_errors, ...)

The model's share is dispatched first and the rules are scored while it runs. Each result's `score` is the
combination `reward.model.combine` names (with `weight` on the model's score), and its extras carry both parts,
`rule` and `model` (the model's own score, 0 where its call failed), which become `reward/rule/mean` and
`reward/model/mean`. A failed model call leaves its error on the sample and never fails the step.
"""

from __future__ import annotations

from typing import Optional

from asyncrl.config.reward_schema import RewardModelConfig
from asyncrl.rewards.executor import RewardExecutor
from asyncrl.rewards.protocol import RewardRequest, RewardResult
from asyncrl.rewards.reward_model_pool import RewardModelPool


def combine(rule: RewardResult, model: RewardResult, config: RewardModelConfig) -> RewardResult:
    """One sample's reward from its rule and model results (a failed model result has score 0)."""
    weighted = config.weight * model.score
    if config.combine == "sum":
        score = rule.score + weighted
    elif config.combine == "model_only":
        score = weighted
    else:  # rule_if_model_failed
        score = rule.score if model.failure is not None else weighted
    errors = [error for error in (rule.error, model.error and f"reward model: {model.error}") if error]
    return RewardResult(score=score, extra={**rule.extra, "rule": rule.score, "model": model.score},
                        error="; ".join(errors) or None,
                        failure=rule.failure or model.failure if errors else None)


class Scorer:
    """The reward executor and, optionally, the reward-model pool; `score`, `metrics` and `close` as the
    executor's. Closing stops the scoring processes; the actors belong to the composition root."""

    def __init__(self, executor: RewardExecutor, models: Optional[RewardModelPool], config: RewardModelConfig):
        self.executor = executor
        self.models = models
        self.config = config

    def score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        if self.models is None:
            return self.executor.score(requests)
        pending = self.models.start(requests)
        rules = self.executor.score(requests)
        return [combine(rule, model, self.config) for rule, model in zip(rules, self.models.collect(pending))]

    def metrics(self) -> dict[str, float]:
        return {**self.executor.metrics(), **(self.models.metrics() if self.models is not None else {})}

    def close(self) -> None:
        self.executor.close()
