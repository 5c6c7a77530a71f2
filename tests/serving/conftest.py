"""Fixtures of the server's tests: a tiny character-level model SFT-warm-started to answer every chat with one tool
call (so the tool-call path runs on what the model really sampled), and one `asyncrl serve` process over it,
with an API key, shared by the module that asks for it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl.models import build_tiny_model
from asyncrl.train.sft import SFTSettings, run_sft
from tests.serving.server_process import running_server

API_KEY = "test-key"
TOOL_CALL = '<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>'
ADD_TOOL = {"type": "function", "function": {"name": "add", "parameters": {}}}


@pytest.fixture(scope="session")
def tool_model(tmp_path_factory) -> Path:
    """Answers with TOOL_CALL (greedy) when ADD_TOOL is offered, after SFT on prompts that render the tool's
    schema the way the chat template does for a request with `tools` (a system turn holding <tools>...</tools>)."""
    root = tmp_path_factory.mktemp("tool_model")
    model = build_tiny_model(root / "raw", family="qwen2", seed=0, max_position_embeddings=256)
    tools_turn = {"role": "system", "content": "<tools>\n" + json.dumps(ADD_TOOL) + "\n</tools>"}
    rows = [{"prompt": [tools_turn, {"role": "user", "content": f"add {index}"}],
             "reward_model": {"ground_truth": TOOL_CALL}} for index in range(32)]
    data = root / "tool_calls.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return run_sft(model, [str(data)], root / "sft", SFTSettings(epochs=80, batch_size=16, lr=1e-2, seed=0,
                                                                  warmup_steps=5))


@pytest.fixture(scope="module")
def server(tool_model, tmp_path_factory):
    with running_server(tool_model, "--api-key", API_KEY, "--max-request-bytes", "100000",
                        log_dir=tmp_path_factory.mktemp("serve_logs")) as process:
        yield process
