"""Async scheduling (a decode launched before the previous one is postprocessed) changes no output: tokens,
log-probs, versions and finish reasons equal the synchronous engine's, across stops, groups, preemption,
weight updates and aborts."""

from __future__ import annotations

import numpy as np
import pytest

from asyncrl.engine import GenerationRequest, GenerationResult, LLMEngine, SamplingParams
from asyncrl.engine.block_manager import BlockManager
from asyncrl.engine.scheduler import ScheduledBatch, Scheduler
from asyncrl.engine.sequence import Sequence
from asyncrl.models import build_tiny_model, iter_named_tensors, load_model

from .helpers import EagerDecodeGraphs, make_engine, prompt, request


@pytest.fixture(scope="module")
def other_folder(tmp_path_factory):
    """Same shape as `tiny_folder`, other weights: the trainer's next policy."""
    return build_tiny_model(tmp_path_factory.mktemp("other") / "qwen2", family="qwen2", seed=11, init_std=0.2,
                            max_position_embeddings=256)


def count_decodes_ahead(engine: LLMEngine) -> list[int]:
    """A one-item counter of the decodes the engine launched ahead (wraps `schedule_ahead`)."""
    counter = [0]
    schedule_ahead = engine.scheduler.schedule_ahead

    def counting(batch):
        ahead = schedule_ahead(batch)
        counter[0] += ahead is not None
        return ahead

    engine.scheduler.schedule_ahead = counting
    return counter


def assert_same_results(actual: list[GenerationResult], expected: list[GenerationResult]) -> None:
    assert [result.request_id for result in actual] == [result.request_id for result in expected]
    for result, reference in zip(actual, expected):
        np.testing.assert_array_equal(result.response_ids, reference.response_ids)
        np.testing.assert_array_equal(result.response_log_probs, reference.response_log_probs)  # bitwise
        np.testing.assert_array_equal(result.response_versions, reference.response_versions)
        assert result.finish_reason == reference.finish_reason


def mixed_requests(stop_ids: dict[str, int] | None = None) -> list[GenerationRequest]:
    """Different prompt and response lengths, greedy and sampled rows, top-k / top-p, an n=3 group (same
    prompt, three seeds) and one request that may stop on EOS; `stop_ids` adds a stop token per request id."""
    stop_ids = stop_ids or {}
    requests = []
    for index in range(5):
        request_id = f"m{index}"
        stops = (stop_ids[request_id],) if request_id in stop_ids else ()
        requests.append(request(request_id, 3 + 5 * index, offset=index, temperature=[1.0, 0.0, 0.8][index % 3],
                                top_k=[-1, -1, 20][index % 3], top_p=[1.0, 1.0, 0.9][index % 3],
                                max_new_tokens=8 + 6 * index, ignore_eos=True, stop_token_ids=stops, seed=index))
    for sample in range(3):
        request_id = f"group/{sample}"
        stops = (stop_ids[request_id],) if request_id in stop_ids else ()
        requests.append(GenerationRequest(request_id, prompt(10, offset=7), SamplingParams(
            temperature=1.0, max_new_tokens=25, ignore_eos=True, stop_token_ids=stops, seed=100 + sample)))
    requests.append(request("eos", 6, offset=3, temperature=1.0, max_new_tokens=40, seed=5))  # EOS not ignored
    return requests


def decoding_scheduler(num_blocks: int) -> tuple[Scheduler, ScheduledBatch, list[Sequence]]:
    """Three 7-token prompts in 4-token blocks after a prefill and the first decode (position 7, no new
    block) is scheduled; the third reaches its budget with that decode's token."""
    scheduler = Scheduler(BlockManager(num_blocks, block_size=4), max_num_seqs=8, max_num_batched_tokens=100,
                          eos_token_ids=frozenset({1}), max_model_len=100)
    sequences = [Sequence(index, GenerationRequest(f"s{index}", prompt(7, index), SamplingParams(
        max_new_tokens=budget))) for index, budget in enumerate([8, 8, 2])]
    for sequence in sequences:
        scheduler.add(sequence)
    prefill = scheduler.schedule()
    assert scheduler.schedule_ahead(prefill) is None  # only after a decode
    assert scheduler.postprocess(prefill, [5, 5, 5], [-1.0] * 3, 0) == []  # 8 tokens each in 2 blocks
    decode = scheduler.schedule()
    assert decode.lookahead == 0 and scheduler.block_manager.num_free_blocks == num_blocks - 6
    return scheduler, decode, sequences


def test_schedule_ahead_takes_the_next_blocks_and_leaves_out_length_finishers():
    scheduler, decode, sequences = decoding_scheduler(num_blocks=8)
    ahead = scheduler.schedule_ahead(decode)  # position 8: a third block for the first two
    assert ahead.sequences == sequences[:2] and ahead.source_rows == [0, 1] and ahead.lookahead == 1
    assert [len(sequence.block_table) for sequence in sequences] == [3, 3, 2]
    assert scheduler.block_manager.num_free_blocks == 0
    # The first samples EOS in the decode: its token from the step ahead is dropped.
    assert scheduler.postprocess(decode, [1, 6, 6], [-1.0] * 3, 0) == [sequences[0], sequences[2]]
    assert [sequence.finish_reason for sequence in sequences] == ["stop", None, "length"]
    assert scheduler.postprocess(ahead, [1, 7], [-2.0] * 2, 0) == []
    assert list(sequences[0].token_ids[-2:]) == [5, 1] and list(sequences[1].token_ids[-3:]) == [5, 6, 7]
    assert scheduler.block_manager.num_free_blocks == 3 + 2  # the finished ones' blocks


def test_schedule_ahead_refuses_when_admission_or_preemption_would_decide():
    scheduler, decode, _ = decoding_scheduler(num_blocks=7)
    assert scheduler.schedule_ahead(decode) is None  # 2 blocks needed, 1 free: preemption decides
    assert scheduler.block_manager.num_free_blocks == 1
    scheduler, decode, _ = decoding_scheduler(num_blocks=8)
    scheduler.add(Sequence(9, GenerationRequest("late", prompt(3), SamplingParams())))
    assert scheduler.schedule_ahead(decode) is None  # a waiting request is admitted first
    assert scheduler.block_manager.num_free_blocks == 2


@pytest.mark.parametrize("num_kv_blocks", [256, 24])  # 24 blocks of 4 tokens force preemptions
def test_outputs_equal_the_synchronous_engine(tiny_folder, num_kv_blocks):
    # Stop tokens taken from a free run, so that those requests stop before their token budget.
    free_run = make_engine(tiny_folder, async_scheduling=False).generate(mixed_requests())
    stop_ids = {result.request_id: int(result.response_ids[3]) for result in free_run[::2]}
    requests = mixed_requests(stop_ids)
    synchronous = make_engine(tiny_folder, num_kv_blocks=num_kv_blocks, async_scheduling=False)
    expected = synchronous.generate(requests)
    engine = make_engine(tiny_folder, num_kv_blocks=num_kv_blocks)
    num_ahead = count_decodes_ahead(engine)
    results = engine.generate(requests)
    assert_same_results(results, expected)
    assert num_ahead[0] > 10
    assert engine.scheduler.num_preemptions == synchronous.scheduler.num_preemptions
    assert (engine.scheduler.num_preemptions > 0) == (num_kv_blocks == 24)
    assert engine.block_manager.num_free_blocks == num_kv_blocks and not engine.has_unfinished()
    early_stops = [result for result in results if result.finish_reason == "stop"]
    assert len(early_stops) >= 3 and all(result.num_response_tokens <= 4 for result in early_stops[:3])


def test_update_between_steps_completes_the_step_in_flight_with_the_old_version(tiny_folder, other_folder):
    requests = [request(f"u{index}", 4 + 3 * index, offset=index, temperature=1.0, max_new_tokens=12 + index,
                        ignore_eos=True, seed=index) for index in range(4)]
    new_weights = load_model(other_folder)

    def run(async_scheduling: bool, num_steps: int) -> list[GenerationResult]:
        engine = make_engine(tiny_folder, async_scheduling=async_scheduling)
        for item in requests:
            engine.add_request(item)
        for _ in range(num_steps):
            assert engine.step() == []
        engine.update_weights(iter_named_tensors(new_weights), version=3)
        results = {}
        while engine.has_unfinished():
            results.update((result.request_id, result) for result in engine.step())
        return [results[item.request_id] for item in requests]

    # After 5 calls (a prefill, 4 decodes) a 6th step is in flight: it completes with the old weights and
    # version, exactly like a synchronous engine updated after 6 steps; later tokens use the new weights.
    results = run(async_scheduling=True, num_steps=5)
    assert_same_results(results, run(async_scheduling=False, num_steps=6))
    for result in results:
        np.testing.assert_array_equal(result.response_versions, [0] * 6 + [3] * (result.num_response_tokens - 6))
    unchanged = make_engine(tiny_folder).generate(requests)
    assert any(not np.array_equal(old.response_ids[6:], new.response_ids[6:]) for old, new in zip(unchanged, results))


def run_with_abort(engine: LLMEngine, requests: list[GenerationRequest], num_steps: int, aborted_ids: list[str]
                   ) -> tuple[list[GenerationResult], list[GenerationResult]]:
    """Aborts `aborted_ids` after `num_steps` calls of `step`: (aborted results, the others' results)."""
    for item in requests:
        engine.add_request(item)
    finished = []
    for _ in range(num_steps):
        finished += engine.step()
    aborted = engine.abort(aborted_ids)
    while engine.has_unfinished():
        finished += engine.step()
    assert engine.block_manager.num_free_blocks == engine.num_kv_blocks
    return aborted, sorted(finished, key=lambda result: result.request_id)


@pytest.mark.parametrize("num_steps", [1, 2, 6])
def test_abort_mid_run_returns_a_prefix_of_the_uninterrupted_run(tiny_folder, num_steps):
    requests, aborted_ids = mixed_requests(), ["m4", "group/1"]
    expected = {result.request_id: result for result in
                make_engine(tiny_folder, async_scheduling=False).generate(requests)}
    aborted, others = run_with_abort(make_engine(tiny_folder), requests, num_steps, aborted_ids)
    assert [result.request_id for result in aborted] == aborted_ids
    # The decode launched ahead by the last call (after the first, a prefill) completes before the abort.
    num_completed = num_steps + (num_steps > 1)
    for result in aborted:
        reference = expected[result.request_id]
        num_tokens = result.num_response_tokens
        assert result.finish_reason == "abort" and num_tokens == num_completed
        np.testing.assert_array_equal(result.response_ids, reference.response_ids[:num_tokens])
        np.testing.assert_array_equal(result.response_log_probs, reference.response_log_probs[:num_tokens])
        np.testing.assert_array_equal(result.response_versions, reference.response_versions[:num_tokens])
    # The others continue exactly as with a synchronous engine aborting at the same point.
    synchronous = make_engine(tiny_folder, async_scheduling=False)
    expected_aborted, expected_others = run_with_abort(synchronous, requests, num_completed, aborted_ids)
    assert_same_results(aborted, expected_aborted)
    assert_same_results(others, expected_others)
    for result in others:  # and draw the same tokens as in the uninterrupted run
        np.testing.assert_array_equal(result.response_ids, expected[result.request_id].response_ids)


def test_drain_completes_the_step_in_flight_and_sleep_recomputes_after_it(tiny_folder):
    requests = [request(f"d{index}", 5 + index, offset=index, temperature=1.0, max_new_tokens=10, ignore_eos=True,
                        seed=index) for index in range(3)]

    def run(async_scheduling: bool, num_steps: int, num_steps_before_sleep: int) -> list[GenerationResult]:
        engine = make_engine(tiny_folder, async_scheduling=async_scheduling)
        for item in requests:
            engine.add_request(item)
        for _ in range(num_steps):
            engine.step()
        assert engine.drain() == [] and engine.drain() == []
        assert [sequence.num_response_tokens for sequence in engine.scheduler.running] == [5, 5, 5]
        for _ in range(num_steps_before_sleep):
            engine.step()
        engine.sleep()  # completes a step in flight first, then preempts everything
        assert engine.block_manager.num_used_blocks == 0 and len(engine.scheduler.waiting) == 3
        assert [sequence.num_response_tokens for sequence in engine.scheduler.waiting] == [7, 7, 7]
        engine.wake()
        results = {}
        while engine.has_unfinished():
            results.update((result.request_id, result) for result in engine.step())
        return [results[item.request_id] for item in requests]

    # 4 calls, then a drain: a prefill and 4 decodes, as 5 synchronous calls. After the drain nothing is in
    # flight, so the next call is a synchronous decode that launches one ahead, which sleep completes.
    assert_same_results(run(True, num_steps=4, num_steps_before_sleep=1), run(False, 5, 2))


def test_decode_graph_path_reads_input_ids_from_the_previous_step(tiny_folder):
    """The CUDA-graph decode path (static buffers, bucket padding) on this device, with each graph replaced
    by an eager rerun: a decode ahead copies its input ids from the previous step's sampled tokens."""
    requests = mixed_requests()

    def run(async_scheduling: bool) -> tuple[list[GenerationResult], int]:
        engine = make_engine(tiny_folder, max_num_seqs=16, async_scheduling=async_scheduling)
        runner = engine.runner
        runner.graphs = EagerDecodeGraphs(runner.model, runner.kv_cache, None, runner.sampler, 16,
                                          -(-engine.max_model_len // 4), num_processors=8)
        num_ahead = count_decodes_ahead(engine)
        return engine.generate(requests), num_ahead[0]

    (results, num_ahead), (expected, _) = run(async_scheduling=True), run(async_scheduling=False)
    assert num_ahead > 10  # the graph path really ran decodes ahead
    assert_same_results(results, expected)
    # Against the engine without graphs: the same tokens (top-k / top-p rows included, whose thresholds the
    # graph path computes between its two graphs); log-probs up to the LM head's row count changing its sums.
    plain = make_engine(tiny_folder, max_num_seqs=16).generate(requests)
    for result, reference in zip(results, plain):
        np.testing.assert_array_equal(result.response_ids, reference.response_ids)
        np.testing.assert_allclose(result.response_log_probs, reference.response_log_probs, atol=1e-5)
