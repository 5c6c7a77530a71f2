"""A server that lies, for `asyncrl check-server`'s tests: a real ASGI app (uvicorn on 127.0.0.1) in front of a real
`asyncrl serve`, passing every request on and changing what comes back, as a misbehaving server or gateway would.

    with lying_server(upstream.base_url, model_dir, lie="stale_weights") as url: ...

Lies:
- "retokenized": the completion's token ids rebuilt from its text (decoded without special tokens, encoded again),
  the prompt's too: what a server or gateway that works on text returns.
- "stale_weights": a reload is answered as done but never reaches the engine, so the weights, and the checksum
  the server reports, stay the old ones.
- "raw_logprobs": each token's log-prob at temperature 1 whatever temperature was asked for (the log-probs of
  the model's logits, not of the distribution sampled from: vLLM's default logprobs mode), computed from the
  model folder the upstream started with.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from asyncrl.models import load_tokenizer
from asyncrl.rollout.readiness.reference import ReferenceModel
from tests.serving.server_process import free_port

LIES = ("retokenized", "stale_weights", "raw_logprobs")


def build_app(upstream: str, model_dir: str | Path, lie: str) -> FastAPI:
    if lie not in LIES:
        raise ValueError(f"lie must be one of {LIES}, got {lie!r}")
    tokenizer = load_tokenizer(model_dir)
    reference = ReferenceModel(model_dir)
    app = FastAPI()

    def retokenized(ids: list[int]) -> list[int]:
        return list(tokenizer.encode(tokenizer.decode(ids, skip_special_tokens=True), add_special_tokens=False))

    @app.post("/update_weights_from_disk")
    async def reload(request: Request) -> Any:
        body = await request.json()
        if lie == "stale_weights":
            return {"success": True, "message": f"loaded {body['model_path']}", "weight_version": body["weight_version"]}
        return await forward(request, body)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        answer = await forward(request, await request.json())
        if lie == "stale_weights" or answer.status_code != 200:
            return answer
        content = httpx.Response(200, content=answer.body).json()
        for choice in content["choices"]:
            if lie == "retokenized":
                choice["token_ids"] = retokenized(choice["token_ids"])
                choice["prompt_token_ids"] = retokenized(choice["prompt_token_ids"])
            else:
                choice["token_logprobs"] = reference.log_probs(choice["prompt_token_ids"], choice["token_ids"],
                                                               1.0).tolist()
        return JSONResponse(content)

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def anything(request: Request, path: str) -> Any:
        return await forward(request, await request.json() if request.method == "POST" else None)

    async def forward(request: Request, body: Any) -> Response:
        async with httpx.AsyncClient(timeout=120) as client:
            answer = await client.request(request.method, upstream + request.url.path, json=body,
                                          params=dict(request.query_params))
        return Response(answer.content, answer.status_code, media_type=answer.headers.get("content-type"))

    return app


@contextlib.contextmanager
def lying_server(upstream: str, model_dir: str | Path, lie: str) -> Iterator[str]:
    """The lying server's base URL while the block runs (uvicorn in a thread of this process)."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(upstream, model_dir, lie), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, name=f"lying-server-{lie}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"the lying server ({lie}) did not start on port {port}")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
