"""An agent written with the official `openai` package, trained by asyncrl as it is (docs/byo-agent.md).

    asyncrl train examples/grpo.yaml rollout.agent.path=examples/openai_agent.py:rollout \
        model.path=outputs/demo/setup/arithmetic/model trainer.output_dir=outputs/byo-agent \
        data.train_files=[outputs/demo/setup/arithmetic/data/train.parquet] \
        data.val_files=[outputs/demo/setup/arithmetic/data/val.parquet]

A two-try solver for the demo's arithmetic task (`asyncrl demo --setup-only` makes its data and model): it asks
the model, checks the answer with a calculator of its own (its tool), and when the answer is wrong says so and
asks once more in the same conversation. The reward compares the final answer with the dataset's ground truth:
1 for a right first answer, 0.5 for a right second one, else 0.
Both tries are one trajectory: the second prompt extends the first (question, answer, the feedback), so the
feedback tokens are masked and the model's two answers train with the run's reward.

It leaves the sampling to the run (temperature, token budget and seed come from rollout.* for training and
rollout.val_kwargs for validation); pass them to `create` to choose yourself. A multi-turn agent with feedback
rather than a `tools` call: the demo's tiny model has a 64-token context and was never taught the tool-call
format, while this conversation fits and uses what it knows.
"""

from __future__ import annotations

import ast
import operator

FEEDBACK = "no. "   # what the agent says before repeating the question
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
served_models: list[str] = []   # the served model's name, asked once per process (it does not change in a run)


def calculate(expression: str) -> int:
    """The value of an integer expression of + - * ("37+85" -> 122), without eval."""
    def value(node: ast.AST) -> int:
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        raise ValueError(f"not an integer expression: {expression!r}")
    return value(ast.parse(expression, mode="eval").body)


def checks_out(answer: str, question: str) -> bool:
    """The calculator's verdict on an answer to "37+85=" (the agent's own check, without the ground truth)."""
    return answer.strip() == str(calculate(question.rstrip("=")))


async def rollout(client, sample) -> dict[str, float]:
    """client: openai.AsyncOpenAI (recording this run); sample: the prompt record (messages, ground_truth, ...)."""
    if not served_models:
        served_models.append((await client.models.list()).data[0].id)
    model = served_models[0]
    messages = [dict(message) for message in sample.messages]
    question = messages[-1]["content"]
    reply = await client.chat.completions.create(model=model, messages=messages)
    first = reply.choices[0].message.content or ""
    if checks_out(first, question):
        return {"reward": float(first.strip() == sample.ground_truth), "tries": 1.0}
    messages += [{"role": "assistant", "content": first}, {"role": "user", "content": FEEDBACK + question}]
    reply = await client.chat.completions.create(model=model, messages=messages)
    second = reply.choices[0].message.content or ""
    return {"reward": 0.5 * (second.strip() == sample.ground_truth), "tries": 2.0}
