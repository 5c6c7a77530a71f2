"""Score samples with the run's scorer: the one implementation used by the core's `compute_reward` stage and by
the fully-async rollouter, which scores each group as soon as it is generated.

    scored, metrics = score_samples(samples, scorer, tokenizer)

The scorer is a `RewardExecutor` (reward functions only) or a `Scorer` (the executor and, with
reward.model.enable, the reward-model actors); both score a list of requests in order.
"""

from __future__ import annotations

from typing import Any, Sequence

from asyncrl.core.records import Sample
from asyncrl.rewards import RewardExecutor, RewardRequest, Scorer


def decode_response(tokenizer: Any, sample: Sample) -> str:
    """The response text a reward function sees (special tokens such as EOS removed)."""
    return tokenizer.decode(sample.result.response_ids.tolist(), skip_special_tokens=True)


def reward_request(tokenizer: Any, sample: Sample) -> RewardRequest:
    record = sample.prompt.record
    turns, calls = (), ()
    if sample.trajectory is not None:   # multi-turn: the conversation after the prompt, and the tool calls
        turns = tuple(sample.trajectory.messages)
        calls = tuple({"name": call.name, "arguments": call.arguments, "status": call.status, "output": call.output,
                       "latency_s": call.latency_s} for call in sample.trajectory.calls)
    return RewardRequest(record.data_source, decode_response(tokenizer, sample), record.ground_truth,
                         record.extra_info, tuple(record.messages), turns, calls)


def score_samples(samples: Sequence[Sample], scorer: Scorer | RewardExecutor,
                  tokenizer: Any) -> tuple[list[Sample], dict[str, float]]:
    """Samples with their rewards, and metrics: the scorer's failure counters and the mean of every extra value
    (`reward/<name>/mean`: a dict-returning reward function's, and a reward model's `rule` and `model`)."""
    results = scorer.score([reward_request(tokenizer, sample) for sample in samples])
    metrics = dict(scorer.metrics())
    for name in sorted({name for result in results for name in result.extra}):
        values = [result.extra[name] for result in results if name in result.extra]
        metrics[f"reward/{name}/mean"] = sum(values) / len(values)
    scored = [sample.with_reward(result.score, result.extra, result.error) for sample, result in zip(samples, results)]
    return scored, metrics
