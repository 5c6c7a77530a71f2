"""The greedy baseline of estimators that compare each response with the prompt's greedy one (remax).

Whoever generates a group (the core's `start_generate`, the fully-async rollouter) adds one greedy request per
prompt to the same dispatch as its sampled ones, so the baseline comes from the same engine and policy version.
The greedy response rides on every sample of its group (`Sample.greedy`) until scoring, which scores and shapes it
like the others and leaves its reward in `Sample.baseline_score`; it is never trained on.

    requests += greedy_requests(prompts, salts, greedy_params(max_response_length, ignore_eos))
    samples = with_greedy_results(samples, greedy_results)   # one greedy result per prompt, in prompt order
    baselines = baseline_samples(samples)                    # one per group, to score with the samples
    samples = with_baseline_scores(samples, scored_baselines)
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from asyncrl.core.records import Sample
from asyncrl.data.records import TokenizedPrompt
from asyncrl.engine import GenerationRequest, GenerationResult, SamplingParams

GREEDY_SUFFIX = "greedy"


def greedy_params(max_new_tokens: int, ignore_eos: bool) -> SamplingParams:
    """Temperature 0: the policy's most likely response (top-k / top-p do not change an argmax)."""
    return SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, ignore_eos=ignore_eos)


def greedy_requests(prompts: Sequence[TokenizedPrompt], salts: Sequence[str],
                    params: SamplingParams) -> list[GenerationRequest]:
    """One greedy request per prompt, id '<salt>/<prompt id>/greedy' (beside the sampled '<salt>/<prompt id>/<k>')."""
    return [GenerationRequest(f"{salt}/{prompt.record.prompt_id}/{GREEDY_SUFFIX}", prompt.prompt_ids, params)
            for prompt, salt in zip(prompts, salts)]


def with_greedy_results(samples: Sequence[Sample], greedy: Sequence[GenerationResult]) -> list[Sample]:
    """`samples` (group index = prompt position) with their prompt's greedy response in `Sample.greedy`."""
    return [replace(sample, greedy=greedy[sample.group_index]) for sample in samples]


def baseline_samples(samples: Sequence[Sample]) -> list[Sample]:
    """The greedy response of each group that has one, as a sample of that group, in the groups' order."""
    baselines: dict[int, Sample] = {}
    for sample in samples:
        if sample.greedy is not None and sample.group_index not in baselines:
            baselines[sample.group_index] = Sample(sample.prompt, sample.group_index, -1, sample.greedy)
    return list(baselines.values())


def with_baseline_scores(samples: Sequence[Sample], baselines: Sequence[Sample]) -> list[Sample]:
    """`samples` with the reward of their group's scored greedy response in `baseline_score`."""
    rewards = {baseline.group_index: baseline.reward for baseline in baselines}
    missing = sorted({sample.group_index for sample in samples if sample.greedy is not None} - set(rewards))
    if missing:
        raise ValueError(f"groups {missing} have a greedy response but no scored baseline")
    return [replace(sample, baseline_score=rewards[sample.group_index]) if sample.greedy is not None else sample
            for sample in samples]
