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


def compute_score(data_source: str, solution_str: str, ground_truth: Any,
                  extra_info: Optional[dict[str, Any]] = None) -> float:
    scorer = scorer_for(data_source)
    if scorer is None:
        raise ValueError(f"no built-in scorer for data_source {data_source!r}; set reward.custom_function")
    return scorer(solution_str, ground_truth)
