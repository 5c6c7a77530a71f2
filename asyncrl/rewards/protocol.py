"""What a reward function is, and what scoring one sample yields.

A reward function has verl's signature, plain or `async def`:

    def compute_score(data_source: str, solution_str: str, ground_truth, extra_info: dict | None) -> float | dict
    async def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict

A multi-turn sample (rollout.multi_turn) is scored over its whole trajectory: `solution_str` is every token after
the prompt decoded (model turns and tool results), and a function that names a `messages` parameter (or takes
`**kwargs`) also receives the whole conversation as chat messages (the prompt's, then the assistant turns with
their parsed `tool_calls` and the tool results), and one naming `tool_calls` the trajectory's calls as dicts
(`name`, `arguments`, `status`, `output`, `latency_s`):

    def compute_score(data_source, solution_str, ground_truth, extra_info=None, messages=None, tool_calls=None)

A score is any real number: a Python int, float or bool, a numpy scalar (`np.float32`, `np.int64`) or a 0-d
array. A dict result carries `score` plus extra numeric metrics (e.g. `{"score": 1.0, "acc": 1.0}`); the
extras are averaged into `reward/<name>/mean` metrics and entries that are not numbers are left out. A NaN
or infinite score (or extra) would poison the advantages, so it scores 0 and is counted.
"""

from __future__ import annotations

import inspect
import math
import numbers
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Awaitable, Optional, Protocol

import numpy


class RewardFn(Protocol):
    def __call__(self, data_source: str, solution_str: str, ground_truth: Any, extra_info: Optional[dict[str, Any]]
                 ) -> float | dict[str, Any] | Awaitable[float | dict[str, Any]]: ...


@dataclass(frozen=True)
class RewardRequest:
    """One sample to score (plain data, so it crosses process boundaries cheaply). `messages` are the prompt's
    chat messages, which reward models and judges read; reward functions get verl's four arguments only."""
    data_source: str
    solution_str: str
    ground_truth: Any
    extra_info: dict[str, Any] = field(default_factory=dict)
    messages: tuple[dict[str, str], ...] = ()
    turns: tuple[dict[str, Any], ...] = ()        # multi-turn: the messages after the prompt (assistant, tool)
    tool_calls: tuple[dict[str, Any], ...] = ()   # multi-turn: every tool call and how it went


TRAJECTORY_KEYWORDS = ("messages", "tool_calls")


def trajectory_keywords(function: Any) -> frozenset[str]:
    """The trajectory keywords `function` accepts: those it names, or both when it takes **kwargs."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):   # a builtin or C callable without a signature: verl's four arguments
        return frozenset()
    if any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters.values()):
        return frozenset(TRAJECTORY_KEYWORDS)
    return frozenset(name for name in TRAJECTORY_KEYWORDS if name in parameters)


def call_reward_function(function: RewardFn, request: RewardRequest) -> Any:
    """verl's four arguments, plus `messages` / `tool_calls` for a multi-turn sample when the function takes them."""
    keywords: dict[str, Any] = {}
    if request.turns or request.tool_calls:
        accepted = trajectory_keywords(function)
        if "messages" in accepted:
            keywords["messages"] = [*request.messages, *request.turns]
        if "tool_calls" in accepted:
            keywords["tool_calls"] = list(request.tool_calls)
    return function(request.data_source, request.solution_str, request.ground_truth, request.extra_info, **keywords)


class Failure(Enum):
    """Why a sample scored 0; each kind has its counter (see `RewardCounters`)."""
    ERROR = "error"            # the function raised or returned something unusable, or its process died
    NONFINITE = "nonfinite"    # it returned NaN or inf (also counted as an error)
    TIMEOUT = "timeout"        # it ran past the per-sample or the per-batch time limit


@dataclass(frozen=True)
class RewardResult:
    """A sample's score; a failed sample scores 0, with the failure's kind and a message naming the cause."""
    score: float
    extra: dict[str, float] = field(default_factory=dict)
    error: Optional[str] = None
    failure: Optional[Failure] = None

    def __post_init__(self):
        if (self.error is None) != (self.failure is None):
            raise ValueError(f"a reward result has both an error and a failure kind or neither, got "
                             f"error={self.error!r}, failure={self.failure}")

    @classmethod
    def failed(cls, failure: Failure, error: str) -> RewardResult:
        return cls(score=0.0, error=error, failure=failure)


def as_real(value: Any) -> Optional[float]:
    """The value as a float when it is one real number (numpy and torch CPU scalars included), else None."""
    if isinstance(value, (str, bytes)):
        return None  # numpy would read "1.0" as a number; a text score is a bug in the function
    if isinstance(value, numbers.Real):  # bool, int, float, and numpy's registered scalar types
        return float(value)
    array = numpy.asarray(value)  # 0-d arrays, np.bool_, torch CPU scalars; anything else has a shape or dtype object
    if array.shape == () and array.dtype.kind in "biuf":
        return float(array)
    return None


def to_result(value: Any) -> RewardResult:
    """Normalise a reward function's return value; raises TypeError for anything unusable."""
    if isinstance(value, dict):
        if "score" not in value:
            raise TypeError(f"reward function returned a dict without 'score': keys {sorted(value)}")
        score = as_real(value["score"])
        if score is None:
            raise TypeError(f"reward function returned a dict whose 'score' is {type(value['score']).__name__}; "
                            f"expected a number")
        extra = {key: number for key, item in value.items()
                 if key != "score" and (number := as_real(item)) is not None}
    else:
        score = as_real(value)
        if score is None:
            raise TypeError(f"reward function returned {type(value).__name__}; "
                            f"expected a float or a dict with 'score'")
        extra = {}
    nonfinite = [f"{name}={number}" for name, number in [("score", score), *extra.items()] if not math.isfinite(number)]
    if nonfinite:
        return RewardResult.failed(Failure.NONFINITE, f"reward function returned a non-finite value: "
                                                      f"{', '.join(nonfinite)}")
    return RewardResult(score=score, extra=extra)
