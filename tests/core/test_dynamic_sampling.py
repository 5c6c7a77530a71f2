"""Dynamic sampling's group filter and the step collector of sync / one_step_off, on hand-made scored groups."""

import numpy as np
import pytest

from asyncrl.config import load_config
from asyncrl.core.dynamic_sampling import (DynamicSamplingError, GroupCollector, filter_metrics, has_signal,
                                           split_into_groups)
from asyncrl.core.records import Sample, samples_to_batch
from asyncrl.data.records import PromptRecord, TokenizedPrompt
from asyncrl.engine import GenerationResult


def sample(group: int, index: int, score: float, acc: float | None = None, penalty: float = 0.0,
           batch: int = 0) -> Sample:
    record = PromptRecord(f"b{batch}p{group}", [{"role": "user", "content": "1+1="}], "test", "2")
    result = GenerationResult(f"b{batch}/{group}/{index}", np.array([5, 6], dtype=np.int32),
                              np.array([7, 8], dtype=np.int32), np.zeros(2, dtype=np.float32),
                              np.zeros(2, dtype=np.int32), "stop")
    extra = {} if acc is None else {"acc": acc}
    return Sample(TokenizedPrompt(record, [5, 6]), group, index, result, score=score, reward_extra=extra,
                  overlong_penalty=penalty)


def batch_of(scores_per_group: list[list[float]], batch: int = 0) -> list[Sample]:
    return [sample(group, index, score, batch=batch) for group, scores in enumerate(scores_per_group)
            for index, score in enumerate(scores)]


def test_each_metric_reads_its_own_value():
    # Scores differ but acc does not: filtered by acc, kept by score.
    group = [sample(0, 0, 0.3, acc=1.0), sample(0, 1, 0.7, acc=1.0)]
    assert (has_signal(group, "acc"), has_signal(group, "score")) == (False, True)
    # Equal scores, one penalised for length: only the trained reward (seq_reward) varies.
    group = [sample(0, 0, 1.0), sample(0, 1, 1.0, penalty=-0.5)]
    assert (has_signal(group, "score"), has_signal(group, "seq_reward"), has_signal(group, "acc")) == \
        (False, True, False)  # acc falls back to the score without an acc extra
    assert has_signal([sample(0, 0, 1.0)], "score")  # a group of one is kept


def collector(num_groups: int = 2, max_batches: int = 0, enabled: bool = True) -> GroupCollector:
    return GroupCollector(num_groups, "score", max_batches, enabled)


def test_a_step_takes_batches_until_it_has_its_groups_and_counts_add_up():
    batches = iter([batch_of([[1, 1], [0, 1], [0, 0]], 0),       # one group with signal
                    batch_of([[0, 0], [1, 0], [0, 1]], 1)])      # two more: one is surplus
    metrics: dict[str, float] = {}
    samples = collector().fill(lambda: next(batches), metrics)
    assert [s.prompt_id for s in samples] == ["b0p1", "b0p1", "b1p1", "b1p1"]
    assert samples_to_batch(samples).group_ids.tolist() == [0, 0, 1, 1]  # renumbered across batches
    assert metrics == {"filter/num_gen_batches": 2.0, "filter/num_generated_groups": 6.0,
                       "filter/num_filtered_groups": 3.0, "filter/num_trained_groups": 2.0,
                       "filter/num_surplus_groups": 1.0, "filter/kept_ratio": 0.5}


def test_the_data_running_out_ends_the_step_with_what_it_has():
    batches = iter([batch_of([[1, 1], [0, 1]])])
    metrics: dict[str, float] = {}
    samples = collector(num_groups=3).fill(lambda: next(batches, None), metrics)
    assert len(samples) == 2 and metrics["filter/num_trained_groups"] == 1.0
    assert collector().fill(lambda: None, {}) == []


def test_the_generation_cap_stops_the_run_with_the_counts():
    batches = iter([batch_of([[1, 1], [0, 1]]), batch_of([[0, 0], [1, 1]])])
    with pytest.raises(DynamicSamplingError, match=r"generated 2 batches \(algorithm\.filter_groups\."
                                                   r"max_num_gen_batches=2\) and kept 1 of the 2 groups a step "
                                                   r"needs: 3 of 4 groups got the same score"):
        collector(max_batches=2).fill(lambda: next(batches), {})


def test_without_filtering_one_batch_passes_unchanged_and_no_filter_metrics():
    samples = batch_of([[1, 1], [0, 1], [0, 0]])
    metrics: dict[str, float] = {}
    assert collector(enabled=False).fill(lambda: samples, metrics) == samples
    assert metrics == {}


def test_from_config_reads_the_keys():
    config = load_config(None, ["algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=seq_reward",
                                "algorithm.filter_groups.max_num_gen_batches=5", "data.train_batch_size=8",
                                "actor.ppo_mini_batch_size=4"])
    assert GroupCollector.from_config(config) == GroupCollector(8, "seq_reward", 5, True)


def test_filter_metrics_split_generated_into_trained_filtered_and_surplus():
    metrics = filter_metrics(3, 12, 5, 4)
    assert metrics["filter/num_trained_groups"] + metrics["filter/num_filtered_groups"] + \
        metrics["filter/num_surplus_groups"] == metrics["filter/num_generated_groups"]
    assert metrics["filter/kept_ratio"] == pytest.approx(7 / 12)


def test_split_into_groups_keeps_batch_order():
    groups = split_into_groups(batch_of([[1], [2, 3]]))
    assert [[s.score for s in group] for group in groups] == [[1], [2, 3]]
