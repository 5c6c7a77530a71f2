"""What a reward function may return: numbers of any numeric type, NaN and inf caught and counted, dicts whose
numeric extras become metrics; and `async def` functions awaited with the same timeout and accounting."""

import math

import numpy as np
import pytest

from asyncrl.rewards import Failure, RewardExecutor
from asyncrl.rewards.protocol import to_result
from tests.rewards.helpers import requests, scores, write_reward_file


@pytest.mark.parametrize("value, score", [
    (1, 1.0), (0.25, 0.25), (True, 1.0), (np.float32(0.5), 0.5), (np.float64(-2.5), -2.5), (np.int64(3), 3.0),
    (np.bool_(True), 1.0), (np.array(0.75), 0.75), (np.array(2, dtype=np.int8), 2.0),
])
def test_a_real_number_of_any_numeric_type_is_a_score(value, score):
    result = to_result(value)
    assert result.score == score and type(result.score) is float and result.error is None


@pytest.mark.parametrize("value, problem", [
    ("1.0", "returned str; expected a float"), (None, "returned NoneType"), (np.array([1.0]), "returned ndarray"),
    ([1.0], "returned list"), ({"acc": 1.0}, "a dict without 'score'"), ({"score": "1"}, "'score' is str"),
])
def test_anything_else_is_refused_with_its_type(value, problem):
    with pytest.raises(TypeError, match=problem):
        to_result(value)


def test_numeric_extras_of_any_type_are_kept_and_others_left_out():
    result = to_result({"score": np.float32(1.0), "acc": np.int64(1), "length": 7, "ratio": np.array(0.5),
                        "note": "text", "tokens": [1, 2]})
    assert result.score == 1.0 and result.extra == {"acc": 1.0, "length": 7.0, "ratio": 0.5}


@pytest.mark.parametrize("value, named", [
    (math.nan, "score=nan"), (math.inf, "score=inf"), (np.float32("-inf"), "score=-inf"),
    ({"score": 1.0, "acc": math.nan}, "acc=nan"),
])
def test_a_non_finite_score_or_extra_scores_zero_as_a_nonfinite_failure(value, named):
    result = to_result(value)
    assert result.score == 0.0 and result.extra == {} and result.failure is Failure.NONFINITE
    assert named in result.error


SCORERS = """
import asyncio, math
import numpy as np

def from_text(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str)

def numpy_typed(data_source, solution_str, ground_truth, extra_info=None):
    return {"f32": np.float32(0.5), "i64": np.int64(2), "zero_d": np.array(0.25), "bool": np.bool_(True),
            "dict": {"score": np.float64(1.0), "acc": np.float32(0.5)}}[solution_str]

LOOPS = set()

async def async_exact(data_source, solution_str, ground_truth, extra_info=None):
    LOOPS.add(id(asyncio.get_running_loop()))
    if solution_str == "slow":
        await asyncio.sleep(600)
    if solution_str == "raise":
        raise ValueError("async scorer bug")
    if solution_str == "nan":
        return math.nan
    await asyncio.sleep(0.01)
    return {"score": float(solution_str == ground_truth), "num_loops": len(LOOPS)}
"""


@pytest.fixture()
def scorers(tmp_path):
    return write_reward_file(tmp_path, SCORERS, "scorers.py")


def test_nan_and_inf_score_zero_and_are_counted_as_errors_and_as_nonfinite(scorers):
    executor = RewardExecutor(f"{scorers}:from_text", timeout_s=10)
    try:
        results = executor.score(requests("nan", "0.5", "inf", "-inf"))
        assert scores(results) == [0.0, 0.5, 0.0, 0.0]
        assert "non-finite value: score=nan" in results[0].error
        metrics = executor.metrics()
        assert metrics["reward/num_nonfinite"] == 3 and metrics["reward/num_errors"] == 3
        assert metrics["reward/num_scored"] == 4 and metrics["reward/num_timeouts"] == 0
    finally:
        executor.close()


def test_numpy_scalars_and_0d_arrays_are_scores_through_a_scoring_process(scorers):
    executor = RewardExecutor(f"{scorers}:numpy_typed", timeout_s=10)
    try:
        results = executor.score(requests("f32", "i64", "zero_d", "bool", "dict"))
        assert scores(results) == [0.5, 2.0, 0.25, 1.0, 1.0]
        assert results[-1].extra == {"acc": 0.5}
        assert all(result.error is None for result in results)
    finally:
        executor.close()


def test_an_async_function_is_awaited_on_one_loop_per_process_with_extras(scorers):
    executor = RewardExecutor(f"{scorers}:async_exact", timeout_s=10)
    try:
        results = executor.score(requests("yes", "no", "yes"))
        assert scores(results) == [1.0, 0.0, 1.0]
        # One event loop for the process's life: loop-bound clients of a scorer keep working between calls.
        assert [result.extra for result in results] == [{"num_loops": 1.0}] * 3
        assert executor.metrics()["reward/num_errors"] == 0
    finally:
        executor.close()


def test_an_async_function_has_the_same_timeout_and_error_accounting(scorers):
    executor = RewardExecutor(f"{scorers}:async_exact", timeout_s=2, num_workers=2)
    try:
        results = executor.score(requests("slow", "raise", "nan", "yes"))
        assert scores(results) == [0.0, 0.0, 0.0, 1.0]
        assert results[0].failure is Failure.TIMEOUT and results[0].error == "timeout after 2s"
        assert results[1].error == "ValueError: async scorer bug"
        assert results[2].failure is Failure.NONFINITE
        metrics = executor.metrics()
        counts = (metrics["reward/num_timeouts"], metrics["reward/num_errors"], metrics["reward/num_nonfinite"])
        assert counts == (1, 2, 1)
        assert scores(executor.score(requests("yes"))) == [1.0]  # the timed-out process was replaced
    finally:
        executor.close()
