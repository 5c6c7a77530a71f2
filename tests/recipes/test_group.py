"""A fully-async group's slots and their requests (asyncrl/recipes/fully_async/group.py): the seeds a resumed run
draws again, the greedy slot's request, new and after an abort, and the samples a group hands on."""

from __future__ import annotations

import numpy as np

from asyncrl.core.lengths import LengthDistribution
from asyncrl.data.records import PromptRecord, TokenizedPrompt
from asyncrl.engine import GenerationResult, SamplingParams
from asyncrl.recipes.fully_async.group import Group, SlotRequests

SAMPLED = SamplingParams(temperature=1.0, max_new_tokens=64)
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=64)


def group(serial=3, epoch=0, prompt_id="train.parquet:7", num_samples=2):
    prompt = TokenizedPrompt(PromptRecord(prompt_id, [{"role": "user", "content": "1+1"}], "asyncrl/arithmetic", "2"),
                             [5, 6, 7])
    return Group(prompt, epoch, serial, [None] * (num_samples + 1), num_samples=num_samples)


def result(request_id, response, finish="stop"):
    return GenerationResult(request_id, np.array([5, 6, 7], np.int32), np.array(response, np.int32),
                            np.full(len(response), -0.5, np.float32), np.zeros(len(response), np.int32), finish)


def test_each_sampled_slot_has_its_own_seed_the_same_in_every_run_and_new_each_epoch():
    requests = SlotRequests(seed=1, params=SAMPLED, lengths=None, greedy_params=GREEDY)
    first, second = requests.sampled(group(), 0), requests.sampled(group(), 1)
    assert (first.request_id, second.request_id) == ("g3/0", "g3/1")
    assert list(first.prompt_ids) == [5, 6, 7] and first.params.max_new_tokens == 64
    assert first.params.seed != second.params.seed
    assert SlotRequests(1, SAMPLED, None, GREEDY).sampled(group(serial=9), 0).params.seed == first.params.seed
    assert requests.sampled(group(epoch=1), 0).params.seed != first.params.seed
    assert SlotRequests(2, SAMPLED, None, GREEDY).sampled(group(), 0).params.seed != first.params.seed
    assert requests.sampled_params(group(), 1) == second.params


def test_a_length_distribution_caps_each_slots_budget_by_its_seed():
    requests = SlotRequests(seed=1, params=SAMPLED, lengths=LengthDistribution.parse(5), greedy_params=None)
    assert requests.sampled(group(), 0).params.max_new_tokens == 5


def test_the_greedy_slot_is_the_last_and_resumes_its_partial_response():
    requests = SlotRequests(seed=1, params=SAMPLED, lengths=None, greedy_params=GREEDY)
    members = group()
    assert members.greedy_slot == 2 and group(num_samples=-1).greedy_slot is None
    new = requests.greedy(members)
    assert (new.request_id, new.params) == ("g3/greedy", GREEDY) and new.response_ids.size == 0
    members.results[2] = result("g3/greedy", [8, 9], finish="abort")
    resumed = requests.greedy(members)
    assert resumed.request_id == "g3/greedy" and resumed.response_ids.tolist() == [8, 9]
    assert not members.is_generated


def test_a_generated_group_hands_on_its_sampled_responses_with_the_greedy_one_riding_on_each():
    members = group()
    members.results = [result("g3/0", [1]), result("g3/1", [2, 3]), result("g3/greedy", [4])]
    assert members.is_generated
    samples = members.samples()
    assert [sample.result.response_ids.tolist() for sample in samples] == [[1], [2, 3]]
    assert all(sample.greedy.response_ids.tolist() == [4] for sample in samples)
