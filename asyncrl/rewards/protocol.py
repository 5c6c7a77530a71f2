"""What a reward function is, and what scoring one sample yields.

A reward function has verl's signature:

    def compute_score(data_source: str, solution_str: str, ground_truth, extra_info: dict | None) -> float | dict

A dict result carries `score` plus extra numeric metrics (e.g. `{"score": 1.0, "acc": 1.0}`); the extras
are averaged into `reward/<name>` metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Protocol


class RewardFn(Protocol):
    def __call__(self, data_source: str, solution_str: str, ground_truth: Any,
                 extra_info: Optional[dict[str, Any]]) -> float | dict[str, Any]: ...


@dataclass(frozen=True)
class RewardRequest:
    """One sample to score (plain data, so it crosses process boundaries cheaply)."""
    data_source: str
    solution_str: str
    ground_truth: Any
    extra_info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RewardResult:
    """A sample's score; `error` says why a failed sample scored 0 ("timeout" or the exception)."""
    score: float
    extra: dict[str, float] = field(default_factory=dict)
    error: Optional[str] = None


def to_result(value: Any) -> RewardResult:
    """Normalise a reward function's return value; raises TypeError for anything unusable."""
    if isinstance(value, dict):
        if "score" not in value:
            raise TypeError(f"reward function returned a dict without 'score': keys {sorted(value)}")
        extra = {key: float(item) for key, item in value.items()
                 if key != "score" and isinstance(item, (int, float))}
        return RewardResult(score=float(value["score"]), extra=extra)
    if isinstance(value, (int, float)):  # bool is an int: True scores 1.0
        return RewardResult(score=float(value))
    raise TypeError(f"reward function returned {type(value).__name__}; expected a float or a dict with 'score'")
