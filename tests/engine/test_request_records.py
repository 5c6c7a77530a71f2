"""Requests and results survive pickling (how they cross Ray process boundaries) field for field."""

from __future__ import annotations

import pickle

import numpy as np

from asyncrl.engine import GenerationRequest, GenerationResult, SamplingParams


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
