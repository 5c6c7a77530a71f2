"""A recording endpoint: `asyncrl serve`'s app on 127.0.0.1 in the process that owns the engine, recording every
completion of an agent run under that run's session.

    endpoint = RecordingEndpoint(served)                 # served: the process's ServedModel
    await endpoint.start()                               # uvicorn on 127.0.0.1, a free port
    session = endpoint.open_session(defaults)            # a fresh id; the agent's client sends it as its API key
    client = endpoint.client(session)                    # openai.AsyncOpenAI(base_url=.../v1, api_key=session)
    ...                                                  # the agent calls client.chat.completions.create(...)
    turns = endpoint.close_session(session)              # [GenerationResult]: ids, log-probs, versions as sampled
    await endpoint.stop()

The session id travels as the bearer token, so one server serves every agent of the process and recordings
never mix; a request under no open session gets 401 (it would train nothing). Only the OpenAI routes and
/health are served (weights, pause and abort belong to the trainer). A completion hook on the
`ServedModel` records each finished choice before its response is written, so when the agent's `await`
returns the turn is recorded. What is recorded is what the client got: the engine's ids, log-probs and
versions, cut where a stop string cut the text (never re-tokenized). A session's `defaults` (SamplingParams)
fill in what its requests leave out, on a `RolloutServedModel` (see rollout_served.py).
"""

from __future__ import annotations

import asyncio
import secrets
import ssl
from typing import Any, Optional

import httpx
import numpy as np
import openai
import uvicorn
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from asyncrl.engine import GenerationResult, SamplingParams
from asyncrl.serving.app import ServerSettings, build_app
from asyncrl.serving.choices import cut_at_stop
from asyncrl.serving.protocol import error_body
from asyncrl.serving.rollout_served import SESSION, Session
from asyncrl.serving.served_model import CompletionEvent, ServedModel

RECORDED_PREFIX = "/v1/"
SERVED_ROUTES = frozenset({"/v1/models", "/v1/completions", "/v1/chat/completions", "/health"})
BEARER = "Bearer "


class RecordingError(RuntimeError):
    """The recording endpoint could not start or was used wrongly (names the endpoint)."""


def session_of(authorization: str) -> str:
    return authorization[len(BEARER):] if authorization.startswith(BEARER) else ""


class RecordingEndpoint:
    def __init__(self, served: ServedModel, settings: ServerSettings = ServerSettings(), host: str = "127.0.0.1",
                 start_timeout_s: float = 30.0, request_timeout_s: float = 300.0):
        if settings.api_key:
            raise RecordingError("a recording endpoint takes the session id as its API key; settings.api_key must be "
                                 "empty")
        self.served = served
        self.host = host
        self.start_timeout_s = start_timeout_s
        self.request_timeout_s = request_timeout_s
        self.sessions: dict[str, Session] = {}
        self.app = build_app(served, settings)
        self.app.middleware("http")(self.check_session)
        served.hooks.append(self.record)
        self.server: uvicorn.Server | None = None
        # Built once: an httpx client builds a TLS context per client otherwise, loading the certificates (~60 ms of
        # CPU each) for every agent run, though the endpoint is plain HTTP on loopback.
        self.tls = ssl.create_default_context()
        self.task: asyncio.Task | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        if not self.port:
            raise RecordingError("the recording endpoint is not started: await endpoint.start() first")
        return f"http://{self.host}:{self.port}/v1"

    # ---- the server -------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Serves on a free port of `host` in this event loop; raises naming the endpoint when it does not come
        up within start_timeout_s."""
        # Idle connections are kept as long as a request may take: an agent's client reusing one the server is
        # closing at that moment would fail its request (the client does not retry, see `client`).
        config = uvicorn.Config(self.app, host=self.host, port=0, log_level="warning", lifespan="off",
                                access_log=False, timeout_keep_alive=int(self.request_timeout_s))
        self.server = uvicorn.Server(config)
        self.task = asyncio.create_task(self.server.serve())
        deadline = asyncio.get_running_loop().time() + self.start_timeout_s
        while not self.server.started:
            if self.task.done():
                raise RecordingError(f"the recording endpoint on {self.host} stopped while starting: "
                                     f"{self.task.exception()!r}")
            if asyncio.get_running_loop().time() > deadline:
                raise RecordingError(f"the recording endpoint on {self.host} did not start within "
                                     f"{self.start_timeout_s} s")
            await asyncio.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stops serving; the engine stays open (its owner closes it)."""
        if self.server is None or self.task is None:
            return
        self.server.should_exit = True
        await asyncio.wait_for(self.task, self.start_timeout_s)
        self.served.hooks.remove(self.record)
        self.server, self.task, self.port = None, None, 0

    # ---- sessions ---------------------------------------------------------------------------------------
    def open_session(self, defaults: Optional[SamplingParams] = None) -> str:
        """A fresh session id; `defaults` sample what its requests leave out (a RolloutServedModel's)."""
        session = secrets.token_hex(16)
        self.sessions[session] = Session(defaults=defaults)
        return session

    def close_session(self, session: str) -> list[GenerationResult]:
        """The session's completions in the order they finished; later requests under it get 401."""
        if session not in self.sessions:
            raise RecordingError(f"recording session {session!r} is not open on {self.base_url}")
        return self.sessions.pop(session).turns

    def client(self, session: str) -> openai.AsyncOpenAI:
        """An `openai` client whose requests record under `session` (no retries: a retried request would be
        recorded twice); `await client.close()` when done."""
        base_url = self.base_url
        http = httpx.AsyncClient(verify=self.tls, timeout=self.request_timeout_s)
        return openai.AsyncOpenAI(base_url=base_url, api_key=session, max_retries=0, timeout=self.request_timeout_s,
                                  http_client=http)

    async def check_session(self, request: Request, call_next: Any) -> Response:
        path = request.url.path
        if path not in SERVED_ROUTES:
            message = (f"no route {request.method} {path} on a recording endpoint: it serves "
                       f"{', '.join(sorted(SERVED_ROUTES))} (weights, pause and abort belong to the trainer)")
            return JSONResponse(error_body(404, message), status_code=404)
        if path.startswith(RECORDED_PREFIX) and request.method == "POST":
            session = self.sessions.get(session_of(request.headers.get("authorization", "")))
            if session is None:
                message = ("no open recording session: the agent's client must send the session id it was given "
                           "as its API key (use the client passed to rollout(client, sample))")
                return JSONResponse(error_body(401, message, code="invalid_api_key"), status_code=401)
            SESSION.set(session)   # the request's own context: its sampling defaults, while it is served
        return await call_next(request)

    def record(self, event: CompletionEvent) -> None:
        session = self.sessions.get(session_of(event.headers.get("authorization", "")))
        if session is None:   # the session closed while its request ran: nothing trains on it
            return
        result = event.result
        choice = cut_at_stop(self.served.tokenizer, event.choice_index, result, event.request.stop_strings())
        is_cut = len(choice.token_ids) < result.num_response_tokens
        session.turns.append(GenerationResult(result.request_id, result.prompt_ids, np.asarray(choice.token_ids, np.int32),
                                      np.asarray(choice.log_probs, np.float32), np.asarray(choice.versions, np.int32),
                                      "stop" if is_cut else result.finish_reason))
