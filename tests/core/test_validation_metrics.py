"""Validation and evaluation metrics against hand computations: mean score per data source and the unbiased
pass@k (1 - C(n - c, k) / C(n, k)) per prompt, averaged overall and per data source."""

import numpy as np
import pytest

from asyncrl.config import ConfigError, load_config
from asyncrl.core.records import Sample
from asyncrl.core.validation import pass_at_k, validation_metrics
from asyncrl.data.records import PromptRecord, TokenizedPrompt
from asyncrl.engine import GenerationResult


def scored(prompt_id: str, source: str, index: int, score: float) -> Sample:
    record = PromptRecord(prompt_id, [{"role": "user", "content": "x"}], source, "")
    result = GenerationResult(f"eval/{prompt_id}/{index}", np.array([5], dtype=np.int32), np.array([7], dtype=np.int32),
                              np.zeros(1, dtype=np.float32), np.zeros(1, dtype=np.int32), "stop")
    return Sample(TokenizedPrompt(record, [5]), 0, index, result, score=score)


def test_pass_at_k_is_the_chance_that_k_of_n_samples_include_a_solved_one():
    # n = 4, c = 1: pass@1 = 1/4; pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 1/2; pass@4 = 1.
    assert [pass_at_k(4, 1, k) for k in (1, 2, 3, 4)] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    # c = 2: pass@2 = 1 - C(2,2)/C(4,2) = 5/6; none solved: 0 for every k.
    assert pass_at_k(4, 2, 2) == pytest.approx(5 / 6) and pass_at_k(4, 0, 3) == 0.0
    with pytest.raises(ValueError, match="pass@5 needs at least 5 samples"):
        pass_at_k(4, 1, 5)


def test_a_fixed_set_of_two_sources_gives_the_hand_computed_scores_and_pass_at_k():
    # "math": p1 solved by 1 of 4 samples (one half credit), p2 by 2 of 4; "code": p3 by none of 4.
    scores = {("p1", "math"): [1.0, 0.5, 0.0, 0.0], ("p2", "math"): [1.0, 0.0, 1.0, 0.0],
              ("p3", "code"): [0.0, 0.0, 0.0, 0.0]}
    samples = [scored(prompt, source, index, score) for (prompt, source), values in scores.items()
               for index, score in enumerate(values)]
    metrics = validation_metrics(samples, num_samples=4, pass_k=[1, 2, 4])
    assert metrics["val/score/mean"] == pytest.approx(3.5 / 12)
    assert metrics["val/math/score/mean"] == pytest.approx(3.5 / 8) and metrics["val/code/score/mean"] == 0.0
    assert metrics["val/num_prompts"] == 3.0
    # pass@1: p1 1/4, p2 2/4, p3 0; pass@2: 1/2, 5/6, 0; pass@4: 1, 1, 0.
    assert metrics["val/pass@1"] == pytest.approx((0.25 + 0.5 + 0.0) / 3)
    assert metrics["val/pass@2"] == pytest.approx((0.5 + 5 / 6 + 0.0) / 3)
    assert metrics["val/pass@4"] == pytest.approx(2 / 3)
    assert metrics["val/math/pass@2"] == pytest.approx((0.5 + 5 / 6) / 2) and metrics["val/code/pass@4"] == 0.0
    # The validation of trainer.test_freq, with its defaults: pass@n when n > 1, none with one sample per prompt.
    assert {key for key in validation_metrics(samples, 4) if "pass@" in key} == \
        {"val/pass@4", "val/math/pass@4", "val/code/pass@4"}
    assert not any("pass@" in key for key in validation_metrics(samples[:1], 1))


def test_the_evaluation_config_is_checked_when_it_loads():
    """Before anything starts: a pass@k that n samples cannot estimate, an evaluation without prompts, or one of an
    agent (the stage generates single responses)."""
    with pytest.raises(ConfigError, match=r"evaluation.pass_k: \[8\] exceed evaluation.n \(4\)"):
        load_config(None, ["evaluation.enable=true", "data.val_files=[v.parquet]", "evaluation.n=4",
                           "evaluation.pass_k=[1,8]"])
    with pytest.raises(ConfigError, match="evaluation.enable needs prompts"):
        load_config(None, ["evaluation.enable=true"])
    with pytest.raises(ConfigError, match="cannot run an agent"):
        load_config(None, ["evaluation.enable=true", "data.val_files=[v.parquet]", "rollout.multi_turn.enable=true",
                           "rollout.multi_turn.tool_config_path=asyncrl/configs/tools_calculator.yaml"])
    assert load_config(None, ["evaluation.enable=true", "evaluation.data_files=[e.parquet]"]).evaluation.enable
