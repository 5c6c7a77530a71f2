"""Arithmetic that needs a tool: "1234*5678=" -> "7006652", beyond what a tiny model computes in its head.

The model is meant to call the calculator (Hermes format, the tool named `calc` with one argument `expr`)
and copy its result:

    <|user|>1234*5678=<|assistant|><tool_call>{"name": "calc", "arguments": {"expr": "1234*5678"}}</tool_call>
    <|endoftext|><|user|><tool_response>7006652</tool_response><|assistant|>7006652<|endoftext|>

`extra_info.trace` holds a sloppy teacher's tool-use trace for the SFT warm start (`asyncrl sft` learns the
assistant turns and masks the tool turns): on `skip_tool` of the problems the teacher answers from its head
with a wrong guess (one digit off), on `typo` of them it mistypes a digit of an operand in its call and copies
the wrong result; otherwise it calls correctly and copies. The reward checks the final answer exactly and
reports `tool_call_correct` (a call whose expression is the question's), so RL should raise both.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from asyncrl.data.tasks.arithmetic import stable_fraction

DATA_SOURCE = "asyncrl/tool_arithmetic"
TOOL_NAME = "calc"
TOOL_ARGUMENT = "expr"
INTEGER = re.compile(r"-?\d+")
CALL_EXPRESSION = re.compile(r'<tool_call>\s*\{"name":\s*"calc",\s*"arguments":\s*\{"expr":\s*"([^"]*)"\}\}\s*</tool_call>')
RESPONSE_END = "</tool_response>"


@dataclass(frozen=True)
class ToolArithmeticTask:
    min_digits: int = 3
    max_digits: int = 4
    operators: str = "*"
    skip_tool: float = 0.4
    typo: float = 0.2

    data_source = DATA_SOURCE

    def __post_init__(self) -> None:
        if not 1 <= self.min_digits <= self.max_digits:
            raise ValueError(f"tool_arithmetic: need 1 <= min_digits <= max_digits, got {self.min_digits}, "
                             f"{self.max_digits}")
        if not self.operators or set(self.operators) - set("+-*"):
            raise ValueError(f"tool_arithmetic: operators must be a non-empty subset of '+-*', got {self.operators!r}")
        for name in ("skip_tool", "typo"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"tool_arithmetic: {name} must be in [0, 1], got {getattr(self, name)}")
        if self.skip_tool + self.typo > 1.0:
            raise ValueError(f"tool_arithmetic: skip_tool + typo must be at most 1, got {self.skip_tool + self.typo}")

    def make_problem(self, rng: np.random.Generator) -> tuple[str, str]:
        operands = []
        for _ in range(2):
            digits = int(rng.integers(self.min_digits, self.max_digits + 1))
            operands.append(int(rng.integers(10 ** (digits - 1), 10 ** digits)))
        expression = f"{operands[0]}{rng.choice(list(self.operators))}{operands[1]}"
        return expression + "=", str(evaluate(expression))

    def make_row(self, question: str, answer: str, split: str, index: int) -> dict[str, Any]:
        expression = question.rstrip("=")
        trace = self.teacher_trace(expression, answer) if split == "train" else correct_trace(expression, answer)
        return {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": question}],
            "ability": "tool_use",
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": split, "index": index, "answer": trace[-1]["content"],
                           "trace": json.dumps(trace)},
        }

    def teacher_trace(self, expression: str, answer: str) -> list[dict[str, Any]]:
        draw = stable_fraction("teacher:" + expression)
        if draw < self.skip_tool:
            return [{"role": "assistant", "content": change_a_digit(answer, expression)}]
        if draw < self.skip_tool + self.typo:
            mistyped = change_a_digit(expression, "typo:" + expression)
            return correct_trace(mistyped, str(evaluate(mistyped)))
        return correct_trace(expression, answer)


def correct_trace(expression: str, result: str) -> list[dict[str, Any]]:
    call = {"type": "function", "function": {"name": TOOL_NAME, "arguments": {TOOL_ARGUMENT: expression}}}
    return [{"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "content": result},
            {"role": "assistant", "content": result}]


def evaluate(expression: str) -> int:
    return int(eval(expression))  # only digits and + - * reach eval


def change_a_digit(text: str, key: str) -> str:
    """`text` with one digit replaced by another, both chosen by `key` (a fixed, plausible mistake)."""
    positions = [index for index, char in enumerate(text) if char.isdigit()]
    rng = np.random.default_rng(int(stable_fraction(key) * 2**32))
    position = positions[int(rng.integers(len(positions)))]
    digit = str((int(text[position]) + int(rng.integers(1, 10))) % 10)
    if digit == "0" and (position == 0 or not text[position - 1].isdigit()):
        digit = "9"   # a number does not start with 0
    return text[:position] + digit + text[position + 1:]


def score(solution_str: str, ground_truth: Any) -> dict[str, float]:
    """score 1.0 when the final answer (the first integer after the last tool result) is exact; extras:
    tool_call_correct (a calc call whose expression has the right value: the question's, not a mistyped one),
    tool_used (any readable calc call)."""
    answer_text = solution_str.rsplit(RESPONSE_END, 1)[-1]
    match = INTEGER.search(answer_text)
    correct = float(match is not None and match.group() == str(ground_truth).strip())
    expressions = CALL_EXPRESSION.findall(solution_str)
    right_call = any(evaluate_safely(expression) == int(ground_truth) for expression in expressions)
    return {"score": correct, "tool_call_correct": float(right_call), "tool_used": float(bool(expressions))}


def evaluate_safely(expression: str) -> int | None:
    if not re.fullmatch(r"\s*\d+\s*[-+*]\s*\d+\s*", expression):
        return None
    return evaluate(re.sub(r"\b0+(\d)", r"\1", expression))   # a sampled "0123" is 123, not Python's SyntaxError
