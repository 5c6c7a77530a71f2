"""The default reward function: picks a scorer by the row's `data_source`.

| data_source | scorer |
|---|---|
| asyncrl/arithmetic, asyncrl/countdown | the built-in tasks' scorers |
| openai/gsm8k, gsm8k | `#### answer` |
| lighteval/MATH, DigitalLearningGmbH/MATH-lighteval, HuggingFaceH4/MATH-500, math, math_dapo, ... | `\\boxed{}` |
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from asyncrl.data.tasks import SCORERS as TASK_SCORERS
from asyncrl.rewards.math_answers import score_boxed, score_gsm8k

BOXED_SOURCES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500", "math",
                 "math_dapo", "aime", "aime24", "aime25", "amc")
GSM8K_SOURCES = ("openai/gsm8k", "gsm8k")


def scorer_for(data_source: str) -> Optional[Callable[[str, Any], float]]:
    """The built-in scorer of a data source, or None when there is none."""
    if data_source in TASK_SCORERS:
        return TASK_SCORERS[data_source]
    if data_source in GSM8K_SOURCES:
        return score_gsm8k
    if data_source in BOXED_SOURCES or data_source.lower().startswith(("math", "aime")):
        return score_boxed
    return None


# The built-in scorers that read a structured answer, and the keys it holds; the others compare text.
STRUCTURED_ANSWERS = {"asyncrl/countdown": ("numbers", "target")}


def ground_truth_problem(data_source: str, ground_truth: Any) -> Optional[str]:
    """Why the built-in scorer of `data_source` could never match `ground_truth` (every right answer would
    score 0), or None. A text scorer compares str(ground_truth): a list, a mapping, a bool or a float (5.0 for
    "5") never equals an answer the model writes."""
    if scorer_for(data_source) is None:
        return None
    keys = STRUCTURED_ANSWERS.get(data_source)
    if keys is not None:
        if not isinstance(ground_truth, dict) or not set(keys) <= set(ground_truth):
            return f"the built-in scorer of {data_source!r} reads a mapping with {list(keys)}, got {ground_truth!r:.60}"
        return None
    if isinstance(ground_truth, bool) or not isinstance(ground_truth, (str, int)):
        return (f"the built-in scorer of {data_source!r} compares text, so a {type(ground_truth).__name__} "
                f"({ground_truth!r:.60}) never matches an answer; give the answer as a string (or an integer), or "
                f"set reward.custom_function to a function that reads it")
    return None


def compute_score(data_source: str, solution_str: str, ground_truth: Any,
                  extra_info: Optional[dict[str, Any]] = None) -> float:
    scorer = scorer_for(data_source)
    if scorer is None:
        raise ValueError(f"no built-in scorer for data_source {data_source!r}; set reward.custom_function")
    return scorer(solution_str, ground_truth)
