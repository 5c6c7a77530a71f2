"""Scorers for math answers: GSM8K's `#### 42` and LaTeX `\\boxed{...}`, with normalisation.

Normalisation makes equal answers compare equal however they are written: spaces, `$`, `\\left`/`\\right`,
`\\text{...}` units, thousands separators, `\\dfrac`/`\\tfrac`, `a/b` vs `\\frac{a}{b}`, and trailing `.0`.
"""

from __future__ import annotations

import re
from typing import Any, Optional

GSM8K_ANSWER = re.compile(r"####\s*(-?[\d,\.]+)")
LAST_NUMBER = re.compile(r"-?\d[\d,]*\.?\d*")


def extract_gsm8k_answer(text: str, strict: bool = True) -> Optional[str]:
    """The number after the last '####'; without strict, the last number in the text."""
    matches = GSM8K_ANSWER.findall(text)
    if matches:
        return matches[-1].replace(",", "").rstrip(".")
    if strict:
        return None
    numbers = LAST_NUMBER.findall(text)
    return numbers[-1].replace(",", "").rstrip(".") if numbers else None


def score_gsm8k(solution_str: str, ground_truth: Any, strict: bool = True) -> float:
    answer = extract_gsm8k_answer(solution_str, strict)
    return float(answer is not None and normalize_answer(answer) == normalize_answer(str(ground_truth)))


def extract_boxed(text: str) -> Optional[str]:
    """Content of the last \\boxed{...} (or \\fbox{...}), with nested braces handled."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    brace = text.find("{", start)
    if brace < 0:
        rest = text[start:].split(maxsplit=1)  # "\boxed 5"
        return rest[1].split("$")[0].strip() if len(rest) > 1 else None
    depth = 0
    for position in range(brace, len(text)):
        if text[position] == "{":
            depth += 1
        elif text[position] == "}":
            depth -= 1
            if depth == 0:
                return text[brace + 1:position]
    return None


def score_boxed(solution_str: str, ground_truth: Any) -> float:
    answer = extract_boxed(solution_str)
    truth = extract_boxed(str(ground_truth)) or str(ground_truth)
    return float(answer is not None and normalize_answer(answer) == normalize_answer(truth))


def normalize_answer(answer: str) -> str:
    text = answer.strip()
    text = re.sub(r"\\text\{\s*[a-zA-Z ]*\}", "", text)          # units: \text{ cm}
    text = re.sub(r"\\(?:left|right)\b", "", text)
    text = re.sub(r"\\[dt]frac", r"\\frac", text)
    text = text.replace("\\!", "").replace("\\,", "").replace("\\%", "").replace("%", "")
    text = text.replace("$", "").replace(" ", "").rstrip(".")
    text = re.sub(r"^\\frac(\d)(\d)$", r"\\frac{\1}{\2}", text)      # \frac12
    text = re.sub(r"^(-?\d+)/(\d+)$", r"\\frac{\1}{\2}", text)         # 1/2
    if re.fullmatch(r"-?[\d,]+(\.\d+)?", text):
        text = text.replace(",", "")
        if "." in text:
            text = text.rstrip("0").rstrip(".")
    return text
