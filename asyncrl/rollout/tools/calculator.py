"""The calculator tool: exact arithmetic on integers and decimals, evaluated from the expression's syntax tree.

    {"name": "calc", "arguments": {"expr": "1234*5678"}}   ->   "7006652"

Numbers, + - * / // % **, unary signs and parentheses; nothing else is evaluated (names, calls and
attributes are errors). Exponents are capped so that "9**9**9" is an error, not a hung process.
"""

from __future__ import annotations

import ast
import operator
from fractions import Fraction
from typing import Any

from asyncrl.rollout.tools.base import CallContext, Tool, ToolError, TOOLS, function_schema

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 256
MAX_DIGITS = 1000
BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
          ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def evaluate(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return Fraction(str(node.value)) if isinstance(node.value, float) else Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
        return UNARY[type(node.op)](evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        left, right = evaluate(node.left), evaluate(node.right)
        if isinstance(node.op, ast.Pow) and (right.denominator != 1 or abs(right) > MAX_EXPONENT):
            raise ToolError(f"exponents must be whole numbers up to {MAX_EXPONENT}")
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ToolError("division by zero")
        result = BINARY[type(node.op)](left, right)
        if len(str(result.numerator)) > MAX_DIGITS:
            raise ToolError(f"the result has more than {MAX_DIGITS} digits")
        return Fraction(result)
    raise ToolError(f"unsupported expression element: {ast.dump(node)[:60]}")


def format_number(value: Fraction) -> str:
    """An integer as digits; a fraction as a decimal rounded to 10 places, trailing zeros cut."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.10f}".rstrip("0").rstrip(".")


def calculate(expression: str) -> str:
    if not isinstance(expression, str) or not expression.strip():
        raise ToolError("expr must be a non-empty arithmetic expression, e.g. '12*34'")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"expressions are limited to {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as error:
        raise ToolError(f"cannot parse {expression!r}: {error.msg}") from None
    return format_number(evaluate(tree))


class Calculator(Tool):
    def __init__(self, name: str, config: dict[str, Any], schema: dict[str, Any], timeout_s: float | None):
        self.name, self.schema, self.timeout_s = name, schema, timeout_s
        self.argument = str(config.pop("argument", "expr"))
        if config:
            raise ValueError(f"calculator: unknown config keys {sorted(config)}; valid: argument, timeout_s, latency")

    async def call(self, arguments: dict[str, Any], context: CallContext) -> str:
        if set(arguments) != {self.argument}:
            raise ToolError(f"{self.name} takes one argument, {self.argument!r}; got {sorted(arguments)}")
        return calculate(arguments[self.argument])


TOOLS.register("calculator", runs="in the event loop (microseconds)",
               schema=function_schema("calc", "evaluate an arithmetic expression exactly",
                                      {"expr": "the expression, e.g. 1234*5678"}),
               summary="exact arithmetic: numbers, + - * / // % **, parentheses")(Calculator)
