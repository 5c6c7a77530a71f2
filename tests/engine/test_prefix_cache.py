"""The prefix cache: shared prefixes computed once (prefill tokens counted); outputs those of a run with the
cache off (CPU fp32: the same tokens, log-probs within the engine's batch tolerance, bitwise for a group on the
development VM); invalidated by a weight update; the block manager's registration and eviction by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from asyncrl.engine import GenerationRequest, SamplingParams
from asyncrl.engine.block_manager import BlockManager
from asyncrl.engine.sequence import Sequence
from tests.engine.helpers import make_engine, prompt

BLOCK = 4


def assert_same_results(first, second, atol=0.0):
    """Same tokens; log-probs bitwise (atol 0) or within `atol`."""
    for one, other in zip(first, second, strict=True):
        assert one.request_id == other.request_id
        np.testing.assert_array_equal(one.response_ids, other.response_ids)
        np.testing.assert_allclose(one.response_log_probs, other.response_log_probs, rtol=0, atol=atol)


def group_one_at_a_time(engine, prompt_ids, n, max_new_tokens=6):
    """A group's n samples, each admitted in a step of its own (as a group arriving over time is)."""
    results = []
    for index in range(n):
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=100 + index, ignore_eos=True)
        results += engine.generate([GenerationRequest(f"s{index}", prompt_ids, params)])
    return results


def test_a_group_admitted_over_several_steps_computes_its_prompt_once(tiny_folder):
    prompt_ids = prompt(23)  # 5 full blocks of 4 and 3 tokens
    cached_engine, plain_engine = make_engine(tiny_folder), make_engine(tiny_folder, enable_prefix_caching=False)
    with_cache = group_one_at_a_time(cached_engine, prompt_ids, n=4)
    without = group_one_at_a_time(plain_engine, prompt_ids, n=4)
    # Bitwise on the 2-core development VM; another CPU's kernels may round a 7-row prefill differently from a
    # 23-row one (a Xeon host of the GPU machines did, by ~1e-7): held to the engine's batch tolerance.
    assert_same_results(with_cache, without, atol=1e-5)
    # Without the cache every sample prefills all 23 tokens; with it the later three compute the 7 tokens past
    # 4 cached blocks (a CPU engine computes at least 4 tokens: 5 cached blocks would leave 3).
    assert plain_engine.prefill_counts.computed == 4 * 23
    assert cached_engine.prefill_counts.computed == 23 + 3 * 7
    assert cached_engine.prefill_counts.cached == 3 * 16
    assert cached_engine.prefill_counts.requested == 4 * 23


def test_a_three_turn_trajectory_computes_its_history_once(tiny_folder):
    """Each turn is a new request whose prompt is the trajectory so far plus a tool's answer: with the cache its
    prefill computes only what the history's full blocks do not hold. Not bitwise: the cached history's KV was
    computed by decode steps and a shorter prefill, which round differently (the engine's own batch dependence,
    held to 1e-5 in test_engine_outputs)."""
    def run(engine):
        history, results = prompt(9), []
        for turn in range(3):
            params = SamplingParams(max_new_tokens=7, temperature=0.8, seed=turn, ignore_eos=True)
            [result] = engine.generate([GenerationRequest(f"turn{turn}", history, params)])
            results.append(result)
            tool_answer = prompt(5, offset=turn + 1)
            history = [*history, *result.response_ids.tolist(), *tool_answer]
        return results

    cached_engine, plain_engine = make_engine(tiny_folder), make_engine(tiny_folder, enable_prefix_caching=False)
    assert_same_results(run(cached_engine), run(plain_engine), atol=1e-5)
    # Turn prompts: 9, 9 + 7 + 5 = 21, 21 + 7 + 5 = 33 tokens. A finished turn's KV covers every token but its last
    # sampled one (15 of turn 1's 16 tokens, 27 of turn 2's 28): full blocks of 12 and 24 tokens, decode-filled ones
    # included.
    assert plain_engine.prefill_counts.computed == 9 + 21 + 33
    assert cached_engine.prefill_counts.cached == 12 + 24
    assert cached_engine.prefill_counts.computed == 9 + (21 - 12) + (33 - 24)


def test_a_weight_update_invalidates_the_cache(tiny_folder):
    engine, reference = make_engine(tiny_folder), make_engine(tiny_folder, enable_prefix_caching=False)
    prompt_ids = prompt(17)
    group_one_at_a_time(engine, prompt_ids, n=1)
    new_weights = [(name, parameter * 1.01) for name, parameter in engine.model.named_parameters()]
    engine.update_weights(new_weights, version=1)
    reference.update_weights(new_weights, version=1)
    assert engine.block_manager.num_cached_blocks == 0
    computed_before = engine.prefill_counts.computed
    assert_same_results(group_one_at_a_time(engine, prompt_ids, n=1), group_one_at_a_time(reference, prompt_ids, n=1))
    assert engine.prefill_counts.computed - computed_before == 17  # recomputed under the new weights


def test_a_sequence_running_across_a_weight_update_registers_nothing(tiny_folder):
    """Its KV mixes both weights' (requests in flight continue with the new ones): released after the update, its
    blocks stay out of the cache, and the same prompt afterwards is computed whole."""
    engine = make_engine(tiny_folder)
    prompt_ids = prompt(17)
    engine.add_request(GenerationRequest("across", prompt_ids,
                                         SamplingParams(max_new_tokens=12, temperature=1.0, seed=1, ignore_eos=True)))
    engine.step()  # its prefill, registered under the old weights
    engine.step()
    engine.update_weights([(name, parameter * 1.01) for name, parameter in engine.model.named_parameters()], 1)
    while engine.has_unfinished():
        engine.step()
    assert engine.block_manager.num_cached_blocks == 0
    before = engine.prefill_counts.computed
    group_one_at_a_time(engine, prompt_ids + [5, 6, 7, 8, 9, 10, 11], n=1)
    assert engine.prefill_counts.computed - before == 24


def test_a_preempted_sequence_is_readmitted_from_its_cached_prefix(tiny_folder):
    """A cache too small for every sequence at once: preempted sequences come back through the prefix cache
    (their prompt blocks), with the responses of the same engine without it (to 1e-5, as the multi-turn case)."""
    requests = [GenerationRequest(f"r{index}", prompt(10, offset=index),
                                  SamplingParams(max_new_tokens=24, temperature=1.0, seed=index, ignore_eos=True))
                for index in range(6)]
    small = make_engine(tiny_folder, num_kv_blocks=24)
    small_without = make_engine(tiny_folder, num_kv_blocks=24, enable_prefix_caching=False)
    with_cache = small.generate(requests)
    assert_same_results(with_cache, small_without.generate(requests), atol=1e-5)
    assert sum(result.num_preemptions for result in with_cache) == small.scheduler.num_preemptions > 0
    assert small.prefill_counts.cached > 0
    assert small.prefill_counts.computed < small_without.prefill_counts.computed


def sequence_of(tokens: list[int], sequence_id: int = 0) -> Sequence:
    return Sequence(sequence_id, GenerationRequest(f"q{sequence_id}", tokens, SamplingParams()))


def test_released_blocks_stay_findable_until_their_memory_is_needed():
    manager = BlockManager(num_blocks=6, block_size=BLOCK, enable_prefix_caching=True)
    first = sequence_of(list(range(10, 22)) + [5])  # 3 full blocks and 1 token
    manager.allocate(first)
    manager.register(first, len(first))  # as its prefill is scheduled
    first_blocks = list(first.block_table)
    manager.free(first)
    assert manager.num_free_blocks == 6 and manager.num_cached_blocks == 3
    second = sequence_of(list(range(10, 22)) + [7, 8], sequence_id=1)
    cached = manager.cached_prefix(second)
    assert cached == first_blocks[:3]
    assert manager.num_blocks_to_allocate(second, None, cached) == 4  # the 3 cached ones are free: they count
    manager.allocate(second, cached=cached)
    assert second.num_cached_tokens == 12 and second.block_table[:3] == cached
    third = sequence_of(list(range(50, 58)), sequence_id=2)
    manager.allocate(third)  # the 2 blocks never registered
    assert manager.num_free_blocks == 0 and manager.num_cached_blocks == 3
    manager.free(second)  # its unregistered last block first, then the cached prefix, tail first
    fourth = sequence_of(list(range(60, 64)) + [1], sequence_id=3)
    manager.allocate(fourth)  # the unregistered block, then the prefix's tail block, evicted and forgotten
    assert manager.num_cached_blocks == 2
    assert manager.cached_prefix(sequence_of(list(range(10, 22)) + [9], sequence_id=4)) == first_blocks[:2]


def test_a_prompt_of_whole_blocks_still_computes_its_last_token():
    manager = BlockManager(num_blocks=8, block_size=BLOCK, enable_prefix_caching=True)
    first = sequence_of(list(range(10, 18)))  # exactly 2 blocks
    manager.allocate(first)
    manager.register(first, len(first))
    second = sequence_of(list(range(10, 18)), sequence_id=1)
    assert len(manager.cached_prefix(second)) == 1  # the block holding the last token is computed again


def test_without_the_cache_nothing_is_registered():
    manager = BlockManager(num_blocks=8, block_size=BLOCK, enable_prefix_caching=False)
    first = sequence_of(list(range(10, 19)))
    manager.allocate(first)
    manager.free(first)
    assert manager.num_cached_blocks == 0 and manager.cached_prefix(sequence_of(list(range(10, 19)), 1)) == []


@pytest.mark.parametrize("enable", [True, False])
def test_the_rollout_key_reaches_the_engine(enable):
    from asyncrl.config.rollout_schema import RolloutConfig
    from asyncrl.engine import EngineConfig

    assert EngineConfig.from_rollout(RolloutConfig(enable_prefix_caching=enable)).enable_prefix_caching is enable


def test_results_report_their_prefill_and_a_run_reports_the_hit_rate(tiny_folder):
    """The counts travel with each result (through pickling, as between actors), a trajectory sums its turns',
    and `rollout/prefix_hit_rate` is cached over requested prefill tokens."""
    import pickle

    from asyncrl.core.metrics import prefill_metrics
    from asyncrl.rollout.agent.trajectory import Trajectory

    engine = make_engine(tiny_folder)
    results = group_one_at_a_time(engine, prompt(23), n=2)
    assert [(r.num_prefill_tokens, r.num_cached_tokens) for r in results] == [(23, 0), (23, 16)]
    again = pickle.loads(pickle.dumps(results[1]))
    assert (again.num_prefill_tokens, again.num_cached_tokens) == (23, 16)
    trajectory = Trajectory.start("t", prompt(5))
    for result in results:
        trajectory.append_model(result)
    assert (trajectory.as_result().num_prefill_tokens, trajectory.as_result().num_cached_tokens) == (46, 16)
    assert prefill_metrics([trajectory.as_result()]) == {
        "rollout/prefix_hit_rate": 16 / 46, "rollout/prefill_tokens_requested": 46.0,
        "rollout/prefill_tokens_computed": 30.0, "rollout/preempted_fraction": 0.0}
    assert prefill_metrics([pickle.loads(pickle.dumps(r)) for r in results]) == prefill_metrics(results)


def test_an_engine_says_when_its_kv_cache_cannot_hold_a_step(tiny_folder):
    """The start-up line: how many sequences of the run's length fit, a warning naming the key and the value that
    holds a step's sequences when they do not."""
    import logging

    from asyncrl.config import load_config
    from asyncrl.rollout.kv_budget import kv_budget_report

    config = load_config(None, ["data.max_prompt_length=20", "data.max_response_length=12", "data.train_batch_size=8", "actor.ppo_mini_batch_size=8",
                                "rollout.n=4"])
    small = make_engine(tiny_folder, num_kv_blocks=24)   # 24 blocks of 4: 3 sequences of 32 tokens
    level, line = kv_budget_report(small, config, num_engines=2, name="rollout/replica0")
    assert level == logging.WARNING and "holds 3 sequences of 32 tokens" in line and "up to 16" in line
    # 16 sequences x 8 blocks x 4 tokens x (2 x layers x kv heads x head dim x 4 bytes): rounded up to whole MiB.
    assert "rollout.cpu_kv_cache_mb=1 holds them" in line
    level, line = kv_budget_report(make_engine(tiny_folder), config, num_engines=2, name="rollout/replica0")
    assert level == logging.INFO and "holds 32 sequences" in line


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_cached_prefixes_give_a_recompute_s_outputs(tiny_folder):
    """The CUDA engine reads a cached prefix through the paged path (its dense prefill attends only new tokens):
    a group over several steps and a three-turn trajectory sample what a run without the cache samples."""
    def engine(enable):
        return make_engine(tiny_folder, device="cuda", dtype=torch.float32, block_size=16, enforce_eager=True,
                           decode_attention="triton", decode_products="torch", enable_prefix_caching=enable)

    tolerance = 1e-4  # fp32: GPU products of another row count round differently, far below this
    cached, plain = engine(True), engine(False)
    prompt_ids = prompt(40)
    assert_same_results(group_one_at_a_time(cached, prompt_ids, n=3), group_one_at_a_time(plain, prompt_ids, n=3),
                        atol=tolerance)
    assert cached.prefill_counts.cached == 2 * 32
    history = prompt(20)
    for turn in range(3):
        params = SamplingParams(max_new_tokens=12, temperature=0.8, seed=turn, ignore_eos=True)
        [with_cache] = cached.generate([GenerationRequest(f"turn{turn}", history, params)])
        [without] = plain.generate([GenerationRequest(f"turn{turn}", history, params)])
        assert_same_results([with_cache], [without], atol=tolerance)
        history = [*history, *with_cache.response_ids.tolist(), *prompt(9, offset=turn + 1)]
    assert cached.prefill_counts.computed < plain.prefill_counts.computed
