"""Block allocation, prefix sharing and the scheduler's admission / preemption rules."""

from __future__ import annotations

import numpy as np
import pytest

from asyncrl.engine import GenerationRequest, SamplingParams
from asyncrl.engine.block_manager import BlockManager
from asyncrl.engine.scheduler import Scheduler
from asyncrl.engine.sequence import Sequence, SequenceStatus
from asyncrl.models import load_model

from .helpers import dense_log_probs, make_engine, prompt


def make_sequence(sequence_id: int, num_tokens: int, offset: int = 0) -> Sequence:
    request = GenerationRequest(f"s{sequence_id}", prompt(num_tokens, offset), SamplingParams(max_new_tokens=8))
    return Sequence(sequence_id, request)


def test_block_manager_shares_full_blocks_and_copies_the_partial_one():
    manager = BlockManager(num_blocks=10, block_size=4)
    leader, follower = make_sequence(0, 10), make_sequence(1, 10)  # 2 full blocks + 2 tokens
    manager.allocate(leader)
    manager.allocate(follower, leader)
    assert follower.block_table[:2] == leader.block_table[:2]
    assert follower.block_table[2] != leader.block_table[2]
    assert manager.num_used_blocks == 4  # not 6
    assert [manager.reference_counts[block] for block in leader.block_table] == [2, 2, 1]
    manager.free(leader)
    assert manager.num_used_blocks == 3  # the shared blocks survive while the follower holds them
    manager.free(follower)
    assert manager.num_free_blocks == 10 and sum(manager.reference_counts) == 0


def test_block_manager_needs_a_new_block_only_at_block_boundaries():
    manager = BlockManager(num_blocks=4, block_size=4)
    sequence = make_sequence(0, 4)
    manager.allocate(sequence)
    assert len(sequence.block_table) == 1
    sequence.append_token(9, -1.0, 0)  # 5 tokens: position 4 needs block 2
    assert manager.needs_new_block(sequence)
    manager.append_slot(sequence)
    assert len(sequence.block_table) == 2
    sequence.append_token(9, -1.0, 0)
    assert not manager.needs_new_block(sequence)


def test_block_manager_refuses_decode_writes_into_shared_blocks():
    manager = BlockManager(num_blocks=8, block_size=4)
    leader, follower = make_sequence(0, 8), make_sequence(1, 8)  # exactly 2 full blocks: all shared
    manager.allocate(leader)
    manager.allocate(follower, leader)
    assert manager.num_used_blocks == 2
    follower.append_token(9, -1.0, 0)
    manager.append_slot(follower)  # position 8 opens a private block
    assert manager.reference_counts[follower.block_table[-1]] == 1 and manager.num_used_blocks == 3


def test_scheduler_admits_identical_prompts_as_one_group_within_token_budget():
    manager = BlockManager(num_blocks=40, block_size=4)
    scheduler = Scheduler(manager, max_num_seqs=8, max_num_batched_tokens=24, eos_token_ids=frozenset({1}),
                          max_model_len=100)
    group = [make_sequence(index, 10) for index in range(4)]
    other = make_sequence(9, 20)
    for sequence in group + [other]:
        scheduler.add(sequence)
    batch = scheduler.schedule()
    # The group costs 10 computed tokens; the 20-token prompt would exceed 24 and waits.
    assert batch.is_prefill and batch.sequences == group and batch.leader_indices == [0, 0, 0, 0]
    assert list(scheduler.waiting) == [other]
    assert manager.num_used_blocks == 3 + 3  # leader's 3 blocks + one private tail block per follower


def test_scheduler_preempts_the_most_recent_sequence_when_blocks_run_out():
    manager = BlockManager(num_blocks=4, block_size=4)
    scheduler = Scheduler(manager, max_num_seqs=8, max_num_batched_tokens=100, eos_token_ids=frozenset(),
                          max_model_len=100)
    first, second = make_sequence(0, 8), make_sequence(1, 8, offset=1)
    scheduler.add(first)
    scheduler.add(second)
    prefill = scheduler.schedule()
    assert prefill.sequences == [first, second] and manager.num_free_blocks == 0
    assert scheduler.postprocess(prefill, [5, 5], [-1.0, -1.0], 0) == []
    batch = scheduler.schedule()  # both need a new block for position 8; only room after preempting `second`
    assert batch.sequences == [first] and not batch.is_prefill
    assert second.status is SequenceStatus.WAITING and second.block_table == [] and second.num_preemptions == 1
    assert list(scheduler.waiting) == [second] and second.token_ids[-1] == 5  # generated token kept


def test_engine_shares_prompt_blocks_between_n_responses(tiny_folder):
    engine = make_engine(tiny_folder)
    num_responses, prompt_ids = 6, prompt(18)  # 4 full blocks + 2 tokens
    requests = [GenerationRequest(f"n{index}", prompt_ids, SamplingParams(max_new_tokens=1, seed=index))
                for index in range(num_responses)]
    for request in requests:
        engine.add_request(request)
    batch = engine.scheduler.schedule()
    shared_blocks = engine.block_manager.num_used_blocks
    assert batch.leader_indices == [0] * num_responses
    assert shared_blocks == 5 + (num_responses - 1) < num_responses * 5
    # The sampled tokens and log-probs are those of independent runs.
    assert len(engine.abort()) == num_responses and engine.block_manager.num_used_blocks == 0
    results = engine.generate([GenerationRequest(f"m{index}", prompt_ids,
                                                 SamplingParams(max_new_tokens=9, seed=index, ignore_eos=True))
                               for index in range(num_responses)])
    model = load_model(tiny_folder)
    for index, result in enumerate(results):
        alone = make_engine(tiny_folder).generate(
            [GenerationRequest("x", prompt_ids, SamplingParams(max_new_tokens=9, seed=index, ignore_eos=True))])[0]
        np.testing.assert_array_equal(result.response_ids, alone.response_ids)
        assert np.abs(result.response_log_probs - dense_log_probs(model, result, 1.0)).max() <= 1e-5
    assert len({tuple(result.response_ids) for result in results}) > 1


@pytest.mark.parametrize("num_prompt_tokens", [16, 13])
def test_shared_prefix_decoding_matches_unshared(tiny_folder, num_prompt_tokens):
    prompt_ids = prompt(num_prompt_tokens)
    requests = [GenerationRequest(f"q{index}", prompt_ids, SamplingParams(max_new_tokens=10, seed=index,
                                                                           ignore_eos=True)) for index in range(3)]
    shared = make_engine(tiny_folder).generate(requests)
    unshared = [make_engine(tiny_folder).generate([request])[0] for request in requests]
    for together, alone in zip(shared, unshared):
        np.testing.assert_array_equal(together.response_ids, alone.response_ids)
        np.testing.assert_allclose(together.response_log_probs, alone.response_log_probs, atol=1e-5)


def test_block_table_cache_rewrites_exactly_the_changed_rows():
    from asyncrl.engine.step_inputs import BlockTableCache, _block_tables

    manager = BlockManager(num_blocks=64, block_size=4)
    sequences = [make_sequence(index, 5 + 4 * index, offset=index) for index in range(3)]
    for sequence in sequences:
        manager.allocate(sequence)
    cache = BlockTableCache(sink_block=64)
    np.testing.assert_array_equal(cache.build(sequences), _block_tables(sequences, 64))
    sequences[0].append_block(40)  # grows by one block
    # Freed and reallocated with the same number of blocks (a preempted sequence after wake): new ids.
    old_table = list(sequences[2].block_table)
    manager.free(sequences[2])
    manager.allocate(make_sequence(7, 30, offset=7))
    manager.allocate(sequences[2])
    assert len(sequences[2].block_table) == len(old_table) and sequences[2].block_table != old_table
    np.testing.assert_array_equal(cache.build(sequences), _block_tables(sequences, 64))
    np.testing.assert_array_equal(cache.build(sequences[:2]), _block_tables(sequences[:2], 64))


def test_admission_keeps_a_one_percent_watermark_while_sequences_run():
    manager = BlockManager(num_blocks=200, block_size=4)
    scheduler = Scheduler(manager, max_num_seqs=8, max_num_batched_tokens=1000, eos_token_ids=frozenset(),
                          max_model_len=1000)
    assert scheduler.watermark_blocks == 2
    scheduler.add(make_sequence(0, 4 * 190))  # 190 blocks: admitted, nothing was running
    scheduler.add(make_sequence(1, 4 * 9, offset=1))  # 9 blocks of the 10 free: would leave 1 < 2
    batch = scheduler.schedule()
    assert [sequence.sequence_id for sequence in batch.sequences] == [0] and len(scheduler.waiting) == 1
    scheduler.waiting[0].token_ids = scheduler.waiting[0].token_ids[:4 * 8]  # 8 blocks leave exactly 2
    assert [sequence.sequence_id for sequence in scheduler.schedule().sequences] == [1]
