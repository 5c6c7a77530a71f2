"""Countdown: combine the given numbers with + - * into an expression that equals the target.

    prompt "3 5 7 -> 22"   answer "3*5+7"   (every number used exactly once)

Difficulty knobs: how many numbers and how large. The reward checks the expression itself, so any
correct expression scores, not only the reference one.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

DATA_SOURCE = "asyncrl/countdown"
EXPRESSION = re.compile(r"[\d+\-*() ]+")


@dataclass(frozen=True)
class CountdownTask:
    num_numbers: int = 3
    max_number: int = 9
    operators: str = "+-*"

    data_source = DATA_SOURCE

    def __post_init__(self) -> None:
        if self.num_numbers < 2 or self.max_number < 1:
            raise ValueError(f"countdown: need num_numbers >= 2 and max_number >= 1, got "
                             f"{self.num_numbers}, {self.max_number}")
        if not self.operators or set(self.operators) - set("+-*"):
            raise ValueError(f"countdown: operators must be a non-empty subset of '+-*', got {self.operators!r}")

    def make_problem(self, rng: np.random.Generator) -> tuple[str, str]:
        while True:
            numbers = [int(n) for n in rng.integers(1, self.max_number + 1, size=self.num_numbers)]
            order = [numbers[i] for i in rng.permutation(self.num_numbers)]
            expression = str(order[0])
            for number in order[1:]:
                expression += str(rng.choice(list(self.operators))) + str(number)
            target = eval(expression)  # only digits and + - * reach eval
            if target > 0:
                return f"{' '.join(map(str, numbers))} -> {target}", expression

    def make_row(self, question: str, answer: str, split: str, index: int) -> dict[str, Any]:
        numbers_text, target_text = question.split(" -> ")
        return {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": question}],
            "ability": "math",
            "reward_model": {"style": "rule",
                             "ground_truth": {"numbers": [int(n) for n in numbers_text.split()],
                                              "target": int(target_text)}},
            "extra_info": {"split": split, "index": index, "answer": answer},
        }


def score(solution_str: str, ground_truth: Any) -> float:
    """1.0 when the expression uses each given number once and equals the target, else 0.0."""
    match = EXPRESSION.search(solution_str)
    if match is None:
        return 0.0
    expression = match.group().strip()
    used = [int(token) for token in re.findall(r"\d+", expression)]
    if Counter(used) != Counter(int(n) for n in ground_truth["numbers"]):
        return 0.0
    value = safe_eval(expression)
    return float(value is not None and value == int(ground_truth["target"]))


def safe_eval(expression: str) -> int | None:
    """Evaluate an expression of integers, + - * and parentheses; None when it is anything else."""
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        return None
    allowed = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Add, ast.Sub, ast.Mult, ast.USub)
    if not all(isinstance(node, allowed) for node in ast.walk(tree)):
        return None
    if any(isinstance(node, ast.Constant) and not isinstance(node.value, int) for node in ast.walk(tree)):
        return None
    return eval(compile(tree, "<countdown>", "eval"))
