"""A generative judge: a causal LM on our engine answers a prompt about each sample, greedily; a parser reads
its answer as the score.

    judge = GenerativeJudge("my-judge", template="Q: {prompt} A: {response} Correct?", parser="yes_no")
    results = judge.score([RewardRequest(data_source, response, ground_truth, extra_info, messages), ...])

The template is the judge's user message: `{prompt}` (the text of the prompt's user messages), `{response}`
and `{ground_truth}` are filled in (`str.format`: other braces are written `{{` and `}}`); the judge's chat
template wraps it. A parser turns the answer text into a number, or None when it cannot: a built-in one of
`ANSWER_PARSERS` or a user's `path/to/file.py:function`. An unparsable answer, or a judge prompt longer than
`max_length`, scores 0 as an error. `RewardModelWorker` serves one in a Ray actor.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from asyncrl.data.chat_template import render_prompt
from asyncrl.engine import EngineConfig, GenerationRequest, LLMEngine, SamplingParams
from asyncrl.models import load_tokenizer
from asyncrl.rewards.loader import load_reward_function
from asyncrl.rewards.protocol import Failure, RewardRequest, RewardResult, to_result

TEMPLATE_FIELDS = ("prompt", "response", "ground_truth")
NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)
AnswerParser = Callable[[str], Optional[float]]


def parse_number(answer: str) -> Optional[float]:
    """The first number in the answer ("Score: 7/10" -> 7.0), None when there is none."""
    match = NUMBER.search(answer)
    return float(match.group()) if match else None


def parse_yes_no(answer: str) -> Optional[float]:
    """1.0 for the first word "yes", 0.0 for "no" (any case), None when neither appears."""
    match = YES_NO.search(answer)
    return None if match is None else float(match.group(1).lower() == "yes")


@dataclass(frozen=True)
class ParserEntry:
    fn: AnswerParser
    summary: str


ANSWER_PARSERS = {
    "number": ParserEntry(parse_number, "the first number in the answer"),
    "yes_no": ParserEntry(parse_yes_no, "yes -> 1, no -> 0 (the first of the two words)"),
}


def load_answer_parser(spec: str) -> AnswerParser:
    """A built-in parser by name, or a user's 'path/to/file.py:function' / 'package.module:function'."""
    if spec in ANSWER_PARSERS:
        return ANSWER_PARSERS[spec].fn
    return load_reward_function(spec)


def check_template(template: str) -> None:
    """Raises ValueError naming reward.model.prompt_template when it has a field other than TEMPLATE_FIELDS or
    unbalanced braces."""
    try:
        fields = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as error:
        raise ValueError(f"reward.model.prompt_template is not a valid format string ({error}); write a literal "
                         "brace as {{ or }}") from None
    unknown = sorted(fields - set(TEMPLATE_FIELDS))
    if unknown:
        raise ValueError(f"reward.model.prompt_template has unknown field(s) {unknown}; the fields are "
                         f"{{prompt}}, {{response}} and {{ground_truth}} (write a literal brace as {{{{ or }}}})")


def judge_prompt_ids(tokenizer, template: str, prompt: str, response: str, ground_truth: str) -> list[int]:
    """The judge's prompt: the template filled in, as the judge's user message in its chat template."""
    text = template.format(prompt=prompt, response=response, ground_truth=ground_truth)
    rendered = render_prompt(tokenizer, [{"role": "user", "content": text}], True, "plain")
    return list(tokenizer.encode(rendered, add_special_tokens=False))


def check_template_fits(tokenizer, template: str, context: int) -> None:
    """Raises ValueError when the template alone, its fields empty, leaves no room for an answer token in the
    judge's context: every judge prompt would exceed it and every sample would score 0."""
    num_tokens = len(judge_prompt_ids(tokenizer, template, "", "", ""))
    if num_tokens + 1 > context:
        raise ValueError(f"reward.model.prompt_template takes {num_tokens} of the judge's tokens before any sample's "
                         f"text, in its chat template, and the judge's context is {context} (reward.model.max_length, "
                         f"else its max_position_embeddings): no judge prompt would fit. Shorten the template, or "
                         f"use a judge with a longer context")


def user_text(messages: Sequence[dict[str, str]]) -> str:
    """The prompt as the judge reads it: its user messages' text."""
    return "\n".join(message["content"] for message in messages if message["role"] == "user")


class GenerativeJudge:
    """A judge model on an LLMEngine: one greedy answer per sample, all of a call's samples batched together."""

    def __init__(self, path: str, template: str, parser: str, max_new_tokens: int = 16, device: str = "cpu",
                 max_length: Optional[int] = None, gpu_memory_utilization: float = 0.5):
        check_template(template)
        self.template = template
        self.parse = load_answer_parser(parser)
        self.tokenizer = load_tokenizer(path)
        config = EngineConfig(device=device, max_model_len=max_length, gpu_memory_utilization=gpu_memory_utilization,
                              dtype=torch.bfloat16 if device == "cuda" else torch.float32)
        self.engine = LLMEngine(path, config)
        self.params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
        self.num_calls = 0

    def judge_prompt(self, request: RewardRequest) -> list[int]:
        return judge_prompt_ids(self.tokenizer, self.template, user_text(request.messages), request.solution_str,
                                request.ground_truth)

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardResult]:
        self.num_calls += 1
        results: list[Optional[RewardResult]] = [None] * len(requests)
        generation = []
        # Room for at least one answer token: a longer judge prompt scores 0 without reaching the engine.
        max_prompt = self.engine.max_model_len - 1
        for index, request in enumerate(requests):
            ids = self.judge_prompt(request)
            if len(ids) > max_prompt:
                results[index] = RewardResult.failed(Failure.ERROR, f"judge prompt of {len(ids)} tokens exceeds "
                                                                    f"the judge's {max_prompt}")
            else:
                generation.append(GenerationRequest(f"judge-{self.num_calls}-{index}", ids, self.params))
        for result in self.engine.generate(generation):
            index = int(result.request_id.rsplit("-", 1)[1])
            answer = self.tokenizer.decode(result.response_ids.tolist(), skip_special_tokens=True)
            results[index] = self.read_answer(answer)
        return results

    def read_answer(self, answer: str) -> RewardResult:
        try:
            value = self.parse(answer)
        except Exception as error:  # a user's parser: its failure is this sample's, not the run's
            return RewardResult.failed(Failure.ERROR, f"answer parser raised {type(error).__name__}: {error} "
                                                      f"on {answer!r}")
        if value is None:
            return RewardResult.failed(Failure.ERROR, f"judge answer {answer!r} has no score the parser can read")
        try:
            return to_result(value)
        except TypeError as error:
            return RewardResult.failed(Failure.ERROR, f"answer parser: {error} (answer {answer!r})")
