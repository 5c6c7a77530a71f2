"""Weight updates, versions, sleep / wake and abort + resume on the synchronous engine."""

from __future__ import annotations

import numpy as np
import pytest

from asyncrl.engine import GenerationRequest, SamplingParams
from asyncrl.models import build_tiny_model, iter_named_tensors, load_model

from .helpers import make_engine, prompt, request


@pytest.fixture(scope="module")
def other_folder(tmp_path_factory):
    """Same shape as `tiny_folder`, other weights: the trainer's next policy."""
    return build_tiny_model(tmp_path_factory.mktemp("other") / "qwen2", family="qwen2", seed=11, init_std=0.2,
                            max_position_embeddings=256)


def greedy_requests() -> list[GenerationRequest]:
    return [request(f"w{index}", 5 + 4 * index, offset=index, temperature=0.0, max_new_tokens=12, ignore_eos=True)
            for index in range(3)]


def test_update_weights_in_place_changes_outputs_and_versions(tiny_folder, other_folder):
    engine = make_engine(tiny_folder)
    before = engine.generate(greedy_requests())
    pointers = {name: tensor.data_ptr() for name, tensor in iter_named_tensors(engine.model)}
    kv_pointer = engine.runner.kv_cache.tensor.data_ptr()
    num_copied = engine.update_weights(iter_named_tensors(load_model(other_folder)), version=7)
    assert num_copied == len(pointers) and engine.version == 7
    assert {name: tensor.data_ptr() for name, tensor in iter_named_tensors(engine.model)} == pointers
    assert engine.runner.kv_cache.tensor.data_ptr() == kv_pointer
    after = engine.generate(greedy_requests())
    expected = make_engine(other_folder).generate(greedy_requests())
    assert any(not np.array_equal(old.response_ids, new.response_ids) for old, new in zip(before, after))
    for result, reference in zip(after, expected):
        np.testing.assert_array_equal(result.response_ids, reference.response_ids)
        assert (result.response_versions == 7).all()
    assert all((result.response_versions == 0).all() for result in before)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_tokens_sampled_across_an_update_carry_both_versions(tiny_folder, other_folder, async_scheduling):
    engine = make_engine(tiny_folder, async_scheduling=async_scheduling)
    engine.add_request(request("v", 6, temperature=1.0, max_new_tokens=10, ignore_eos=True, seed=2))
    for _ in range(4):  # one prefill (1 token) + 3 decodes
        assert engine.step() == []
    engine.update_weights(iter_named_tensors(load_model(other_folder)), version=1)
    results = []
    while engine.has_unfinished():
        results += engine.step()
    # With async scheduling the 4th call launched a 5th step ahead: it completes with the old weights first.
    num_old = 5 if async_scheduling else 4
    np.testing.assert_array_equal(results[0].response_versions, [0] * num_old + [1] * (10 - num_old))


def test_sleep_releases_the_cache_and_wake_restores_generation(tiny_folder):
    engine = make_engine(tiny_folder)
    requests = [request(f"s{index}", 7 + index, offset=index, temperature=1.0, max_new_tokens=15, ignore_eos=True,
                        seed=index) for index in range(3)]
    before = engine.generate(requests)
    engine.sleep()
    assert engine.is_sleeping and not engine.runner.kv_cache.is_allocated
    with pytest.raises(RuntimeError, match="asleep"):
        engine.step()
    engine.wake()
    after = engine.generate(requests)
    for old, new in zip(before, after):
        np.testing.assert_array_equal(old.response_ids, new.response_ids)


def test_sleep_with_requests_in_flight_recomputes_them_after_wake(tiny_folder):
    requests = [request(f"f{index}", 6 + index, offset=index, temperature=1.0, max_new_tokens=14, ignore_eos=True,
                        seed=index) for index in range(3)]
    expected = make_engine(tiny_folder).generate(requests)
    engine = make_engine(tiny_folder)
    for item in requests:
        engine.add_request(item)
    for _ in range(5):
        engine.step()
    engine.sleep()
    assert engine.block_manager.num_used_blocks == 0 and len(engine.scheduler.waiting) == 3
    engine.wake()
    results = {}
    while engine.has_unfinished():
        results.update((result.request_id, result) for result in engine.step())
    for reference in expected:
        np.testing.assert_array_equal(results[reference.request_id].response_ids, reference.response_ids)
        np.testing.assert_allclose(results[reference.request_id].response_log_probs, reference.response_log_probs,
                                   atol=1e-5)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_abort_returns_partial_results_and_resume_continues_exactly(tiny_folder, async_scheduling):
    params = SamplingParams(temperature=1.0, max_new_tokens=20, ignore_eos=True, seed=9)
    original = GenerationRequest("a", prompt(9), params)
    expected = make_engine(tiny_folder).generate([original])[0]
    engine = make_engine(tiny_folder, async_scheduling=async_scheduling)
    engine.add_request(original)
    engine.add_request(request("b", 5, temperature=1.0, max_new_tokens=20, seed=1))
    for _ in range(7):
        engine.step()
    partial = engine.abort(["a"])[0]
    num_tokens = 8 if async_scheduling else 7  # the step launched ahead by the 7th call completes first
    assert partial.finish_reason == "abort" and partial.num_response_tokens == num_tokens
    np.testing.assert_array_equal(partial.response_ids, expected.response_ids[:num_tokens])
    assert engine.abort(["a"]) == []  # already gone
    engine.abort()
    assert engine.block_manager.num_used_blocks == 0 and not engine.has_unfinished()
    resumed = engine.generate([GenerationRequest.resume(partial, params)])[0]
    assert resumed.num_response_tokens == 20 and resumed.finish_reason == "length"
    np.testing.assert_array_equal(resumed.response_ids, expected.response_ids)
    np.testing.assert_allclose(resumed.response_log_probs, expected.response_log_probs, atol=1e-5)


def test_resumed_request_with_exhausted_budget_finishes_without_a_step(tiny_folder):
    engine = make_engine(tiny_folder)
    done = engine.generate([request("d", 5, temperature=1.0, max_new_tokens=4, ignore_eos=True, seed=0)])[0]
    again = engine.generate([GenerationRequest.resume(done, SamplingParams(max_new_tokens=4, ignore_eos=True,
                                                                           seed=0))])[0]
    assert again.finish_reason == "length"
    np.testing.assert_array_equal(again.response_ids, done.response_ids)


def test_add_request_rejects_what_cannot_fit(tiny_folder):
    engine = make_engine(tiny_folder, num_kv_blocks=4)  # 16 tokens
    with pytest.raises(ValueError, match="KV cache"):
        engine.add_request(request("big", 10, max_new_tokens=10))
    with pytest.raises(ValueError, match="token ids"):
        engine.add_request(GenerationRequest("bad", [5, 500], SamplingParams(max_new_tokens=2)))
    engine.add_request(request("ok", 10, max_new_tokens=6))
    with pytest.raises(ValueError, match="in flight"):
        engine.add_request(request("ok", 10, max_new_tokens=6))
