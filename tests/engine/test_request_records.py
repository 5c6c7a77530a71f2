"""Requests and results survive pickling (how they cross Ray process boundaries) field for field."""

from __future__ import annotations

import pickle

import numpy as np

from asyncrl.engine import GenerationRequest, GenerationResult, SamplingParams
from asyncrl.engine.sequence import Sequence


def test_a_result_round_trips_through_pickle_with_dtypes_and_writable_arrays():
    result = GenerationResult("g3/1", np.array([5, 6, 7], dtype=np.int32), np.array([9, 2], dtype=np.int32),
                              np.array([-0.5, -1.25], dtype=np.float32), np.array([3, 4], dtype=np.int32), "abort")
    back = pickle.loads(pickle.dumps(result))
    assert (back.request_id, back.finish_reason) == ("g3/1", "abort")
    for name in ("prompt_ids", "response_ids", "response_log_probs", "response_versions"):
        original, copy = getattr(result, name), getattr(back, name)
        assert copy.dtype == original.dtype and np.array_equal(copy, original) and copy.flags.writeable


def test_a_resumed_request_round_trips_with_its_params_and_partial_response():
    params = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=12, seed=11)
    partial = GenerationResult("g1/0", np.array([1, 2], dtype=np.int32), np.array([4], dtype=np.int32),
                               np.array([-0.1], dtype=np.float32), np.array([2], dtype=np.int32), "abort")
    request = GenerationRequest.resume(partial, params)
    back = pickle.loads(pickle.dumps(request))
    assert back.request_id == "g1/0" and back.params == params
    assert back.prompt_ids.tolist() == [1, 2] and back.response_ids.tolist() == [4]
    assert back.response_log_probs.tolist() == [np.float32(-0.1)] and back.response_versions.tolist() == [2]


def test_a_sequence_result_owns_its_arrays_and_the_sequence_keeps_growing():
    """`Sequence.to_result` copies out of the sequence's typed buffers: the result's arrays own their memory
    (a view would pin the buffer and make the next append raise), and a resumed request's partial response
    comes back in front of the new tokens."""
    partial = GenerationResult("g2/0", np.array([7, 8, 9], dtype=np.int32), np.array([4], dtype=np.int32),
                               np.array([-0.25], dtype=np.float32), np.array([1], dtype=np.int32), "abort")
    sequence = Sequence(0, GenerationRequest.resume(partial, SamplingParams(max_new_tokens=4)))
    sequence.append_token(5, -1.5, 2)
    first = sequence.to_result()
    sequence.append_token(6, -0.75, 3)  # would raise BufferError while a view of the buffer lived
    second = sequence.to_result()
    assert first.prompt_ids.tolist() == [7, 8, 9] and first.response_ids.tolist() == [4, 5]
    assert second.response_ids.tolist() == [4, 5, 6] and second.response_log_probs.tolist() == [-0.25, -1.5, -0.75]
    assert second.response_versions.tolist() == [1, 2, 3]
    for array in (second.prompt_ids, second.response_ids, second.response_log_probs, second.response_versions):
        assert array.flags.owndata and array.flags.writeable
    assert (second.response_ids.dtype, second.response_log_probs.dtype) == (np.int32, np.float32)
