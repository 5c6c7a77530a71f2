"""The tool task: problems need the calculator, the sloppy teacher's traces have the stated mix of mistakes,
the scorer reads the final answer and the call, and SFT learns assistant turns with tool turns masked."""

from __future__ import annotations

import json

import numpy as np
import pytest

from asyncrl.data.make import make_task, write_task
from asyncrl.data.reader import read_prompt_files
from asyncrl.data.tasks.tool_arithmetic import score
from asyncrl.models import build_tiny_model, load_tokenizer
from asyncrl.train.sft import tokenize_examples

CALL = '<tool_call>{"name": "calc", "arguments": {"expr": "%s"}}</tool_call>'


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("tool_task")
    paths = write_task(make_task("tool_arithmetic"), root / "data", 600, 50, seed=0)
    tokenizer = load_tokenizer(build_tiny_model(root / "model", hidden_size=32, num_layers=1))
    return read_prompt_files([str(paths["train"])], "prompt"), read_prompt_files([str(paths["val"])], "prompt"), \
        tokenizer


def test_the_teacher_skips_the_tool_or_mistypes_at_the_stated_rates(data):
    train, val, _ = data
    traces = [json.loads(record.extra_info["trace"]) for record in train]
    skipped = np.mean([len(trace) == 1 for trace in traces])
    mistyped = np.mean([len(trace) == 3 and trace[0]["tool_calls"][0]["function"]["arguments"]["expr"] + "="
                        != record.messages[0]["content"] for trace, record in zip(traces, train)])
    assert 0.3 < skipped < 0.5 and 0.12 < mistyped < 0.28          # skip_tool 0.4, typo 0.2
    for record in val:   # validation traces are always right
        trace = json.loads(record.extra_info["trace"])
        assert trace[-1]["content"] == record.ground_truth and len(trace) == 3
    assert all(len(record.ground_truth) >= 5 for record in train)   # 3-4 digit products: not a head computation


@pytest.mark.parametrize("text, expected", [
    (CALL % "1234*5678" + "<tool_response>7006652</tool_response>7006652", (1.0, 1.0, 1.0)),
    (CALL % "1234*5679" + "<tool_response>7012330</tool_response>7012330", (0.0, 0.0, 1.0)),   # mistyped call
    (CALL % "1234*5678" + "<tool_response>7006652</tool_response>7006653", (0.0, 1.0, 1.0)),   # miscopied
    ("7006652", (1.0, 0.0, 0.0)),                                                               # a lucky guess
    (CALL % "01234*005678" + "<tool_response>7006652</tool_response>7006652", (1.0, 1.0, 1.0)),   # leading zeros
    ('<tool_call>{"name": "calc"', (0.0, 0.0, 0.0)),
])
def test_the_score_reads_the_final_answer_and_the_call(text, expected):
    result = score(text, "7006652")
    assert (result["score"], result["tool_call_correct"], result["tool_used"]) == expected


def test_sft_learns_the_assistant_turns_and_masks_the_tool_turn(data):
    train, _, tokenizer = data
    record = next(record for record in train if len(json.loads(record.extra_info["trace"])) == 3)
    (prompt_ids, ids, mask), = tokenize_examples([record], tokenizer, tokenizer.eos_token_id)
    trace = json.loads(record.extra_info["trace"])
    conversation = record.messages + trace
    whole = tokenizer.encode(tokenizer.apply_chat_template(conversation, tokenize=False), add_special_tokens=False)
    assert prompt_ids + ids == whole                                  # the template's own ids, nothing else
    learned = tokenizer.decode([token for token, keep in zip(ids, mask) if keep])
    context = tokenizer.decode([token for token, keep in zip(ids, mask) if not keep])
    expression = trace[0]["tool_calls"][0]["function"]["arguments"]["expr"]
    assert learned == CALL % expression + "<|endoftext|>" + trace[2]["content"] + "<|endoftext|>"
    assert context == f"<|user|><tool_response>{trace[1]['content']}</tool_response><|assistant|>"
