"""Multi-digit arithmetic: "37+85=" -> "122".

Difficulty knobs: operand digits, number of operands and the operators.

`sloppy_teacher` imitates warm-start data from a sloppy teacher: with that probability, the reference
answer used by SFT (`extra_info.answer`) stutters, repeating its last digit ("37+85=" taught as "1222"
instead of "122"). The ground truth the reward checks stays exact. A model warm-started on such data
computes the sum but picks up the habit; RL with an exact-match verifier removes it.

`tail_median` > 0 makes the responses' lengths long-tailed, as a reasoning model's are: the teacher follows
each answer with a run of '.' whose length is drawn once per problem from a lognormal distribution (median
`tail_median`, shape `tail_sigma`, capped at `tail_cap`). The reward reads the first integer, so the run
costs generation time without changing the score; a warm-started model keeps writing it, ending each
response at its own EOS. This is the workload where the asynchronous modes pay off (`asyncrl demo --task
longtail`): a synchronous batch waits for its longest response.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

DATA_SOURCE = "asyncrl/arithmetic"
INTEGER = re.compile(r"-?\d+")


@dataclass(frozen=True)
class ArithmeticTask:
    min_digits: int = 1
    max_digits: int = 2
    num_operands: int = 2
    operators: str = "+-"
    sloppy_teacher: float = 0.0
    tail_median: int = 0
    tail_cap: int = 64
    tail_sigma: float = 1.0

    data_source = DATA_SOURCE

    def __post_init__(self) -> None:
        if not 1 <= self.min_digits <= self.max_digits:
            raise ValueError(f"arithmetic: need 1 <= min_digits <= max_digits, got {self.min_digits}, {self.max_digits}")
        if self.num_operands < 2:
            raise ValueError(f"arithmetic: num_operands must be >= 2, got {self.num_operands}")
        if not self.operators or set(self.operators) - set("+-*"):
            raise ValueError(f"arithmetic: operators must be a non-empty subset of '+-*', got {self.operators!r}")
        if not 0.0 <= self.sloppy_teacher <= 1.0:
            raise ValueError(f"arithmetic: sloppy_teacher must be in [0, 1], got {self.sloppy_teacher}")
        if self.tail_median < 0 or (self.tail_median and not self.tail_median <= self.tail_cap):
            raise ValueError(f"arithmetic: need 0 <= tail_median <= tail_cap, got {self.tail_median}, {self.tail_cap}")
        if self.tail_sigma <= 0:
            raise ValueError(f"arithmetic: tail_sigma must be > 0, got {self.tail_sigma}")

    def make_problem(self, rng: np.random.Generator) -> tuple[str, str]:
        """(question, answer), e.g. ("37+85=", "122")."""
        operands = []
        for _ in range(self.num_operands):
            digits = int(rng.integers(self.min_digits, self.max_digits + 1))
            low = 0 if digits == 1 else 10 ** (digits - 1)
            operands.append(int(rng.integers(low, 10 ** digits)))
        expression = str(operands[0])
        for operand in operands[1:]:
            expression += str(rng.choice(list(self.operators))) + str(operand)
        return expression + "=", str(eval(expression))  # only digits and + - * reach eval

    def make_row(self, question: str, answer: str, split: str, index: int) -> dict[str, Any]:
        taught = answer
        if split == "train" and self.sloppy_teacher and stable_fraction(question) < self.sloppy_teacher:
            taught = answer + answer[-1]
        if split == "train" and self.tail_median:
            taught += "." * self.tail_length(question)
        return {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": question}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": split, "index": index, "answer": taught},
        }

    def tail_length(self, question: str) -> int:
        """The length of the run of '.' after the taught answer, fixed by the question."""
        rng = np.random.default_rng(int(stable_fraction("tail:" + question) * 2**32))
        return int(min(round(rng.lognormal(np.log(self.tail_median), self.tail_sigma)), self.tail_cap))


def stable_fraction(text: str) -> float:
    """A number in [0, 1) fixed by the text (so the same problem is always taught the same way)."""
    return int(hashlib.blake2b(text.encode(), digest_size=4).hexdigest(), 16) / 2**32


def score(solution_str: str, ground_truth: Any) -> float:
    """1.0 when the first integer of the answer equals the ground truth, else 0.0."""
    match = INTEGER.search(solution_str)
    return float(match is not None and match.group() == str(ground_truth).strip())
