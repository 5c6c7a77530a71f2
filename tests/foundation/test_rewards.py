"""Reward functions: the verl protocol, user loading, failures that score 0 and are counted."""

import textwrap

import pytest

from asyncrl.rewards import RewardExecutor, RewardLoadError, RewardRequest
from asyncrl.rewards.loader import load_reward_function
from asyncrl.rewards.builtin import compute_score
from asyncrl.rewards.math_answers import extract_boxed, normalize_answer, score_boxed, score_gsm8k

USER_REWARDS = textwrap.dedent("""
    import os, time

    def exact(data_source, solution_str, ground_truth, extra_info=None):
        return float(solution_str.strip() == ground_truth)

    def with_extras(data_source, solution_str, ground_truth, extra_info=None):
        return {"score": 0.5, "acc": 1.0, "length": len(solution_str), "note": "ignored: not a number"}

    def raises(data_source, solution_str, ground_truth, extra_info=None):
        raise RuntimeError("scorer bug")

    def sleeps_on_slow(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str == "slow":
            time.sleep(60)
        return 1.0

    def returns_text(data_source, solution_str, ground_truth, extra_info=None):
        return "1.0"

    def exits(data_source, solution_str, ground_truth, extra_info=None):
        os._exit(7)

    not_callable = 3
""")


@pytest.fixture()
def user_file(tmp_path):
    path = tmp_path / "user_reward.py"
    path.write_text(USER_REWARDS)
    return path


def requests(*texts):
    return [RewardRequest("custom", text, "yes", {}) for text in texts]


def test_user_function_scores_in_order(user_file):
    executor = RewardExecutor(f"{user_file}:exact", timeout_s=5, num_workers=2)
    try:
        results = executor.score(requests("yes", "no", " yes ", "maybe"))
        assert [result.score for result in results] == [1.0, 0.0, 1.0, 0.0]
        assert executor.metrics()["reward/num_errors"] == 0
    finally:
        executor.close()


def test_dict_result_carries_score_and_numeric_extras(user_file):
    executor = RewardExecutor(f"{user_file}:with_extras", timeout_s=5)
    try:
        (result,) = executor.score(requests("abcd"))
        assert result.score == 0.5
        assert result.extra == {"acc": 1.0, "length": 4.0}
    finally:
        executor.close()


def test_raising_function_scores_zero_and_is_counted(user_file):
    executor = RewardExecutor(f"{user_file}:raises", timeout_s=5)
    try:
        results = executor.score(requests("a", "b"))
        assert [result.score for result in results] == [0.0, 0.0]
        assert "RuntimeError: scorer bug" in results[0].error
        assert executor.metrics()["reward/num_errors"] == 2
    finally:
        executor.close()


def test_function_past_timeout_scores_zero_is_counted_and_others_still_score(user_file):
    executor = RewardExecutor(f"{user_file}:sleeps_on_slow", timeout_s=1.0, num_workers=1)
    try:
        results = executor.score(requests("fast", "slow", "fast"))
        assert [result.score for result in results] == [1.0, 0.0, 1.0]
        assert results[1].error.startswith("timeout")
        assert executor.metrics()["reward/num_timeouts"] == 1
        # the hung worker was replaced: the executor still works
        assert [result.score for result in executor.score(requests("fast"))] == [1.0]
    finally:
        executor.close()


def test_wrong_return_type_and_dying_process_score_zero(user_file):
    for name, error in (("returns_text", "expected a float"), ("exits", "scoring process died: it exited with code 7")):
        executor = RewardExecutor(f"{user_file}:{name}", timeout_s=5)
        try:
            (result,) = executor.score(requests("x"))
            assert result.score == 0.0 and error in result.error
            assert executor.metrics()["reward/num_errors"] == 1
        finally:
            executor.close()


@pytest.mark.parametrize("spec, message", [
    ("{file}:missing", "defines no 'missing'"),
    ("{file}:not_callable", "is not callable"),
    ("{dir}/nope.py:f", "nope.py does not exist"),
    ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
    ("justaname", "must look like"),
])
def test_bad_spec_fails_at_load_naming_it(user_file, spec, message):
    with pytest.raises(RewardLoadError, match=message):
        load_reward_function(spec.format(file=user_file, dir=user_file.parent))
    with pytest.raises(RewardLoadError, match=message):
        RewardExecutor(spec.format(file=user_file, dir=user_file.parent), timeout_s=1)


def test_builtin_dispatch_by_data_source():
    assert compute_score("asyncrl/arithmetic", "42", "42") == 1.0
    assert compute_score("openai/gsm8k", "so #### 1,234", "1234") == 1.0
    assert compute_score("openai/gsm8k", "the answer is 1234", "1234") == 0.0  # strict: needs ####
    assert compute_score("lighteval/MATH", "we get $\\boxed{\\dfrac{1}{2}}$", "\\frac{1}{2}") == 1.0
    with pytest.raises(ValueError, match="no built-in scorer for data_source 'mystery'"):
        compute_score("mystery", "1", "1")


@pytest.mark.parametrize("answer, truth", [
    ("\\frac12", "\\frac{1}{2}"), ("1/2", "\\dfrac{1}{2}"), ("5.0", "5"), ("1,000", "1000"),
    ("\\left( 3, 4 \\right)", "(3,4)"), ("10\\text{ cm}", "10"), ("$7$", "7"), ("50\\%", "50"),
])
def test_math_normalisation_equates_spellings(answer, truth):
    assert normalize_answer(answer) == normalize_answer(truth)
    assert score_boxed(f"\\boxed{{{answer}}}", truth) == 1.0


def test_boxed_extraction_handles_nesting_and_absence():
    assert extract_boxed("x \\boxed{\\frac{a}{b}} and \\boxed{2}") == "2"
    assert extract_boxed("\\boxed{\\sqrt{\\frac{1}{2}}}") == "\\sqrt{\\frac{1}{2}}"
    assert extract_boxed("no box") is None
    assert score_boxed("no box here", "2") == 0.0
    assert score_gsm8k("#### 41", "42") == 0.0


@pytest.mark.parametrize("behaviour, problem, import_timeout_s", [
    # The exit comes as soon as the process runs: a long timeout costs nothing and a busy machine's slow spawn
    # cannot turn the exit into a timeout.
    ("os._exit(3)", r": its scoring process exited with code 3 while loading it", 120),
    ("time.sleep(60)", r" did not load within 2s in a scoring process", 2),
])
def test_a_scoring_process_that_cannot_start_raises_naming_the_function(tmp_path, behaviour, problem,
                                                                         import_timeout_s):
    """What a script without a main guard does to spawned workers (they re-run it and never serve): the
    executor does not start, with the reason, instead of timing out every sample."""
    path = tmp_path / "starts_badly.py"
    path.write_text(textwrap.dedent(f"""
        import multiprocessing, os, time

        if multiprocessing.parent_process() is not None:  # only in a scoring process
            {behaviour}

        def score(data_source, solution_str, ground_truth, extra_info=None):
            return 1.0
    """))
    with pytest.raises(RewardLoadError, match=rf"reward function {path}:score{problem}.*"
                                              r"if __name__ == \"__main__\""):
        RewardExecutor(f"{path}:score", timeout_s=5, import_timeout_s=import_timeout_s)
