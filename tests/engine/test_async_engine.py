"""The asyncio front: submit / stream, abort + resume, pause, weight updates and sleep while in flight."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from asyncrl.engine import AsyncEngine, GenerationRequest, SamplingParams
from asyncrl.models import iter_named_tensors

from .helpers import make_engine, prompt, request


def sampled_requests(count: int, max_new_tokens: int = 16) -> list[GenerationRequest]:
    return [request(f"q{index}", 5 + 3 * index, offset=index, temperature=1.0, max_new_tokens=max_new_tokens,
                    ignore_eos=True, seed=index) for index in range(count)]


async def wait_until(condition, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.002)


def longest_response(engine: AsyncEngine) -> int:
    running = engine.engine.scheduler.running
    return max((sequence.num_response_tokens for sequence in running), default=0)


def response_tokens(engine: AsyncEngine, request_id: str) -> int:
    """How many tokens the running request `request_id` has generated (0 while it is not running)."""
    running = engine.engine.scheduler.running
    return sum(sequence.num_response_tokens for sequence in running if sequence.request_id == request_id)


def test_generate_and_as_completed_equal_the_sync_engine(tiny_folder):
    expected = {result.request_id: result for result in make_engine(tiny_folder).generate(sampled_requests(4))}

    async def main():
        engine = AsyncEngine(make_engine(tiny_folder))
        single = await engine.generate(sampled_requests(1)[0])
        streamed = [result async for result in engine.as_completed(sampled_requests(4))]
        await engine.close()
        return single, streamed

    single, streamed = asyncio.run(main())
    np.testing.assert_array_equal(single.response_ids, expected["q0"].response_ids)
    assert sorted(result.request_id for result in streamed) == sorted(expected)
    for result in streamed:
        np.testing.assert_array_equal(result.response_ids, expected[result.request_id].response_ids)


def test_abort_then_resume_equals_an_uninterrupted_run(tiny_folder):
    params = SamplingParams(temperature=1.0, max_new_tokens=80, ignore_eos=True, seed=21)
    original = GenerationRequest("long", prompt(10), params)
    expected = make_engine(tiny_folder).generate([original])[0]

    async def main():
        engine = AsyncEngine(make_engine(tiny_folder))
        waiting = asyncio.create_task(engine.generate(original))
        await wait_until(lambda: longest_response(engine) >= 5)
        aborted = await engine.abort()
        from_generate = await waiting
        # Partial rollout across a weight sync: same weights, next version.
        await engine.update_weights(iter_named_tensors(engine.engine.model), version=1)
        resumed = await engine.generate(GenerationRequest.resume(from_generate, params))
        await engine.close()
        return aborted, from_generate, resumed

    aborted, from_generate, resumed = asyncio.run(main())
    assert len(aborted) == 1 and aborted[0].finish_reason == from_generate.finish_reason == "abort"
    num_before = from_generate.num_response_tokens
    assert 5 <= num_before < 80
    np.testing.assert_array_equal(aborted[0].response_ids, from_generate.response_ids)
    assert resumed.num_response_tokens == 80 and resumed.finish_reason == "length"
    np.testing.assert_array_equal(resumed.response_ids, expected.response_ids)
    np.testing.assert_allclose(resumed.response_log_probs, expected.response_log_probs, atol=1e-5)
    np.testing.assert_array_equal(resumed.response_versions, [0] * num_before + [1] * (80 - num_before))


def test_pause_stops_stepping_and_resume_finishes_identically(tiny_folder):
    expected = {result.request_id: result for result in make_engine(tiny_folder).generate(sampled_requests(3, 120))}

    async def main():
        engine = AsyncEngine(make_engine(tiny_folder))
        tasks = [asyncio.create_task(engine.generate(item)) for item in sampled_requests(3, 120)]
        await wait_until(lambda: longest_response(engine) >= 3)
        await engine.pause()
        progress = [len(sequence) for sequence in engine.engine.scheduler.running]
        await asyncio.sleep(0.1)
        assert [len(sequence) for sequence in engine.engine.scheduler.running] == progress
        assert not any(task.done() for task in tasks)
        await engine.resume()
        results = await asyncio.gather(*tasks)
        await engine.close()
        return results

    for result in asyncio.run(main()):
        np.testing.assert_array_equal(result.response_ids, expected[result.request_id].response_ids)
        assert result.finish_reason == "length"


def test_update_weights_and_sleep_while_requests_run(tiny_folder):
    expected = {result.request_id: result for result in make_engine(tiny_folder).generate(sampled_requests(3, 120))}

    async def main():
        engine = AsyncEngine(make_engine(tiny_folder))
        tasks = [asyncio.create_task(engine.generate(item)) for item in sampled_requests(3, 120)]
        await wait_until(lambda: longest_response(engine) >= 4)
        await engine.update_weights(iter_named_tensors(engine.engine.model), version=2)  # not paused
        await engine.sleep()
        assert not engine.engine.runner.kv_cache.is_allocated and not any(task.done() for task in tasks)
        await engine.wake()
        results = await asyncio.gather(*tasks)
        await engine.close()
        return results

    for result in asyncio.run(main()):
        reference = expected[result.request_id]
        np.testing.assert_array_equal(result.response_ids, reference.response_ids)
        versions = result.response_versions
        assert versions[0] == 0 and versions[-1] == 2 and (np.diff(versions) >= 0).all()


def test_cancelled_wait_aborts_and_a_bad_request_fails_only_its_caller(tiny_folder, monkeypatch):
    async def main():
        engine = AsyncEngine(make_engine(tiny_folder))
        aborted = []  # what the engine's abort returned: the cancelled request's partial result
        original_abort = engine.engine.abort

        def abort(request_ids=None):
            aborted.extend(original_abort(request_ids))
            return aborted

        monkeypatch.setattr(engine.engine, "abort", abort)

        long_request = request("slow", 8, temperature=1.0, max_new_tokens=200, ignore_eos=True, seed=0)
        good = asyncio.create_task(engine.generate(request("good", 6, temperature=1.0, max_new_tokens=8, seed=1,
                                                           ignore_eos=True)))
        slow = asyncio.create_task(engine.generate(long_request))
        # Cancelled once it is running and holds KV blocks, 198 tokens before it could finish by itself.
        await wait_until(lambda: response_tokens(engine, "slow") >= 2)
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        bad = GenerationRequest("bad", [5, 10_000], SamplingParams(max_new_tokens=4))
        with pytest.raises(ValueError, match="token ids"):
            await engine.generate(bad)
        good_result = await good
        await wait_until(lambda: engine.num_in_flight == 0 and not engine.engine.has_unfinished())
        blocks_used = engine.engine.block_manager.num_used_blocks
        again = await engine.generate(GenerationRequest("slow", prompt(8), SamplingParams(max_new_tokens=3)))
        await engine.close()
        return good_result, blocks_used, again, aborted

    good_result, blocks_used, again, aborted = asyncio.run(main())
    assert [(result.request_id, result.finish_reason) for result in aborted] == [("slow", "abort")]
    assert 2 <= aborted[0].num_response_tokens < 200
    assert good_result.num_response_tokens == 8 and good_result.finish_reason == "length"
    assert blocks_used == 0  # the cancelled request was aborted and its blocks freed
    assert again.request_id == "slow" and again.finish_reason in ("stop", "length")
