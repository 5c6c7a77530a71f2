"""rollout.backend=external against servers that lie, over real HTTP (scripted servers on 127.0.0.1): a server
whose answer breaks the request (too many tokens, ids outside the vocabulary, NaN log-probs, no choices, a
body that is not JSON) leaves the rotation with a named reason and its requests are answered by an honest one;
when every server lies the call fails naming each server and its lie. Nothing a liar sent comes back."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from asyncrl.config import load_config
from asyncrl.engine import GenerationRequest, SamplingParams
from asyncrl.models import build_tiny_model
from asyncrl.remote import RemoteUnavailableError
from asyncrl.rollout import ExternalRollout, RolloutContext

VOCAB = 103   # the tiny model's vocabulary (build_tiny_model)


def honest(body: dict) -> bytes:
    count = min(body["max_tokens"], 3)
    return json.dumps({"choices": [{"token_ids": [5] * count, "token_logprobs": [-0.5] * count,
                                    "finish_reason": "length"}]}).encode()


LIES = {
    "too_many_tokens": (lambda body: json.dumps({"choices": [{"token_ids": [5] * 56, "token_logprobs": [-0.5] * 56,
                                                              "finish_reason": "length"}]}).encode(),
                        "56 tokens for max_tokens=6"),
    "nan_log_probs": (lambda body: honest(body).replace(b"-0.5", b"NaN"), "not finite or above 0, e.g. nan"),
    "ids_outside_the_vocabulary": (lambda body: honest(body).replace(b"[5, 5, 5]", f"[5, {VOCAB + 7}, 5]".encode()),
                                   f"token_ids holds 1 value\\(s\\) outside \\[0, {VOCAB}\\)"),
    "empty_choices": (lambda body: b'{"choices": []}', "the answer has no choices"),
    "malformed_json": (lambda body: b'{"choices": [', "with a body that is not JSON"),
}


class Scripted(BaseHTTPRequestHandler):
    """/health and /v1/models as any server; /v1/completions as the server's script says."""
    answer = staticmethod(honest)
    completions = 0

    def do_GET(self) -> None:
        self.reply(json.dumps({"data": [{"id": "policy"}]} if self.path == "/v1/models" else {"status": "ok"}).encode())

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).completions += 1
        self.reply(self.answer(body))

    def reply(self, payload: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def scripted_server(answer):
    handler = type("Handler", (Scripted,), {"answer": staticmethod(answer), "completions": 0})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("lies") / "policy", family="qwen2", seed=0)


def external_rollout(policy, tmp_path, urls):
    config = load_config(None, [f"model.path={policy}", "rollout.backend=external", "rollout.external.timeout_s=10",
                                f"rollout.external.urls=[{','.join(urls)}]", "rollout.external.max_retries=2",
                                f"trainer.output_dir={tmp_path / 'run'}", "trainer.device=cpu"])
    return ExternalRollout(RolloutContext(config, None, [], torch.float32, lambda: ("127.0.0.1", 0)))


def group(count: int) -> list[GenerationRequest]:
    return [GenerationRequest(f"p/{index}", [4, 9, 12], SamplingParams(max_new_tokens=6, seed=index))
            for index in range(count)]


@pytest.mark.parametrize("lie", list(LIES))
def test_a_lying_server_leaves_the_rotation_named_and_an_honest_one_answers(policy, tmp_path, lie):
    answer, reason = LIES[lie]
    with scripted_server(answer) as (liar, liar_log), scripted_server(honest) as (truthful, _):
        rollout = external_rollout(policy, tmp_path, [liar, truthful])
        results = asyncio.run(rollout.generate(group(4)))
        assert liar_log.completions >= 1   # the group went to the liar first (both idle: the first listed)
        assert [result.response_ids.tolist() for result in results] == [[5, 5, 5]] * 4
        assert all(result.response_log_probs.tolist() == [-0.5] * 3 for result in results)
        health = rollout.health()
        assert health.unhealthy == (liar,) and health.num_failures == 1
        assert rollout.why_out[0].startswith(f"{liar}: ") and re.search(reason, rollout.why_out[0])


def test_when_every_server_lies_the_call_fails_naming_each_server_and_its_lie(policy, tmp_path):
    too_long, nan = LIES["too_many_tokens"][0], LIES["nan_log_probs"][0]
    with scripted_server(too_long) as (first, _), scripted_server(nan) as (second, _):
        rollout = external_rollout(policy, tmp_path, [first, second])
        with pytest.raises(RemoteUnavailableError) as failure:
            rollout.start_generate(group(2)).results()
    message = str(failure.value)
    assert "every rollout server is out of rotation" in message
    assert f"{first}: {first}: completion of 'p/" in message and "56 tokens for max_tokens=6" in message
    assert f"{second}: {second}: completion of 'p/" in message and "e.g. nan" in message
