"""Score samples with a reward executor: the one implementation used by the core's `compute_reward`
stage and by the fully-async rollouter, which scores each group as soon as it is generated.

    scored, metrics = score_samples(samples, executor, tokenizer)
"""

from __future__ import annotations

from typing import Any, Sequence

from asyncrl.core.records import Sample
from asyncrl.rewards import RewardExecutor, RewardRequest


def decode_response(tokenizer: Any, sample: Sample) -> str:
    """The response text a reward function sees (special tokens such as EOS removed)."""
    return tokenizer.decode(sample.result.response_ids.tolist(), skip_special_tokens=True)


def score_samples(samples: Sequence[Sample], executor: RewardExecutor,
                  tokenizer: Any) -> tuple[list[Sample], dict[str, float]]:
    """Samples with their rewards, and metrics: the executor's failure counters and the mean of every
    extra value a dict-returning reward function reported (`reward/<name>/mean`)."""
    requests = [RewardRequest(sample.prompt.record.data_source, decode_response(tokenizer, sample),
                              sample.prompt.record.ground_truth, sample.prompt.record.extra_info)
                for sample in samples]
    results = executor.score(requests)
    metrics = dict(executor.metrics())
    for name in sorted({name for result in results for name in result.extra}):
        values = [result.extra[name] for result in results if name in result.extra]
        metrics[f"reward/{name}/mean"] = sum(values) / len(values)
    scored = [sample.with_reward(result.score, result.extra, result.error) for sample, result in zip(samples, results)]
    return scored, metrics
