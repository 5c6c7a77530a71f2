"""The HTTP application of `asyncrl serve`: OpenAI's routes, the RL admin routes (SGLang's and vLLM's names), health
and Prometheus metrics, an optional API key, and OpenAI-style errors for every bad request.

    app = build_app(ServedModel.load(folder, EngineConfig()), ServerSettings(api_key="secret"))
    uvicorn.run(app, host="127.0.0.1", port=8000)

A recording endpoint builds its own app the same way, over the same `ServedModel`, and appends a hook to
`served.hooks` to see every finished completion's ids, log-probs and versions.

Routes (docs/serving.md has their bodies):
    GET  /v1/models, POST /v1/completions, POST /v1/chat/completions       OpenAI
    POST /update_weights_from_disk, GET /get_weight_version                 SGLang: reload an HF folder, the version
    POST /pause_generation | /pause, POST /continue_generation | /resume    SGLang | vLLM
    GET  /is_paused, POST /abort_request                                    vLLM, SGLang
    GET  /weights_checksum                                                  asyncrl: sha256 of the served weights
    GET  /health (never needs the key), GET /metrics
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from asyncrl.rollout.agent.parser import TOOL_CALL_PARSERS, ParsedTurn
from asyncrl.serving.chat import create_chat_completion
from asyncrl.serving.completions import create_completion, sse
from asyncrl.serving.metrics import ServerMetrics
from asyncrl.serving.protocol import (AbortRequest, APIError, ChatCompletionRequest, CompletionRequest, ReloadRequest,
                                      SamplingFields, error_body)
from asyncrl.serving.served_model import ServedModel

logger = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)
OPEN_ROUTES = frozenset({"/health"})   # load balancers and the external backend probe it without the key
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class ServerSettings:
    api_key: str = ""                       # empty: no key asked
    max_request_bytes: int = 8 * 2**20      # a larger body is refused with 413 (by its header, else as read)
    tool_call_parser: str = "hermes"        # a name in asyncrl.rollout.agent.TOOL_CALL_PARSERS


async def read_body(request: Request) -> bytes:
    """The body, read up to the app's `max_request_bytes` and no further: 413 past them. Counted as read, so a
    chunked body (no Content-Length) or a Content-Length that lies is bounded too, in time and in memory."""
    limit = request.app.state.settings.max_request_bytes
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise APIError(413, f"the request body has more than {limit} bytes, this server's limit")
    return bytes(body)


async def parse_body(request: Request, model: type[M]) -> M:
    """The JSON body as `model`: 413 past the size limit, 400 when it is not JSON, 422 naming the field when a
    value is wrong."""
    raw = await read_body(request)
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise APIError(400, f"the request body is not valid JSON: {error}") from None
    try:
        return model.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        raise APIError(422, f"{param or 'body'}: {first['msg']}", param=param) from None


def stream_response(events: AsyncIterator[str]) -> StreamingResponse:
    async def guarded() -> AsyncIterator[str]:
        try:
            async for event in events:
                yield event
        except APIError as error:   # the status is sent already: the error becomes the last event
            yield sse(error.body())
            yield sse("[DONE]")
    return StreamingResponse(guarded(), media_type="text/event-stream")


def build_app(served: ServedModel, settings: ServerSettings = ServerSettings(),
              metrics: ServerMetrics | None = None) -> FastAPI:
    """The server's app over `served`: the guards and errors, then the OpenAI, admin and monitoring routes."""
    metrics = metrics if metrics is not None else ServerMetrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await served.close()

    app = FastAPI(title="asyncrl serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.served = served
    app.state.metrics = metrics
    app.state.settings = settings
    add_guards(app, settings, metrics)
    add_openai_routes(app, served, metrics, TOOL_CALL_PARSERS[settings.tool_call_parser])
    add_admin_routes(app, served, metrics)
    add_monitoring_routes(app, served, metrics)
    return app


def add_guards(app: FastAPI, settings: ServerSettings, metrics: ServerMetrics) -> None:
    """What every request passes: the API key and the body limit, the request metrics, and OpenAI-style errors
    for whatever a route raises (an unknown route included)."""
    @app.middleware("http")
    async def guard_and_count(request: Request, call_next: Callable[[Request], Any]) -> Response:
        started = time.monotonic()
        response = guard(request) or await call_next(request)
        metrics.observe_request(request.url.path, response.status_code, time.monotonic() - started)
        return response

    def guard(request: Request) -> Response | None:
        """401 without the API key (except on /health), 413 for a body over the limit."""
        if settings.api_key and request.url.path not in OPEN_ROUTES:
            header = request.headers.get("authorization", "")
            token = header[len("Bearer "):] if header.startswith("Bearer ") else ""
            if not hmac.compare_digest(token.encode(), settings.api_key.encode()):
                return JSONResponse(error_body(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                                               code="invalid_api_key"), status_code=401)
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > settings.max_request_bytes:
            return JSONResponse(error_body(413, f"the request body has {length} bytes, more than this server's "
                                                f"limit of {settings.max_request_bytes}"), status_code=413)
        return None

    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        is_unknown_route = error.status_code in (404, 405)
        message = f"no route {request.method} {request.url.path}" if is_unknown_route else str(error.detail)
        return JSONResponse(error_body(error.status_code, message), status_code=error.status_code)


def add_openai_routes(app: FastAPI, served: ServedModel, metrics: ServerMetrics,
                      parse_tool_calls: Callable[[str], ParsedTurn]) -> None:
    """OpenAI's routes: the model list, completions and chat completions (streamed or not)."""
    def check_model(request: SamplingFields) -> None:
        if request.model != served.name:
            raise APIError(404, f"model {request.model!r} is not served here; GET /v1/models lists {served.name!r}",
                           param="model", code="model_not_found")

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": served.name, "object": "model", "created": 0, "owned_by": "asyncrl",
                                            "root": served.folder, "max_model_len": served.max_model_len}]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = await parse_body(request, CompletionRequest)
        check_model(body)
        answer = await create_completion(served, metrics, body, request.headers)
        return stream_response(answer) if body.stream else answer

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        body = await parse_body(request, ChatCompletionRequest)
        check_model(body)
        answer = await create_chat_completion(served, metrics, body, request.headers, parse_tool_calls)
        return stream_response(answer) if body.stream else answer


def add_monitoring_routes(app: FastAPI, served: ServedModel, metrics: ServerMetrics) -> None:
    """/health (open without the key, for load balancers) and /metrics (Prometheus)."""
    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": served.name, "weight_version": served.version}

    @app.get("/metrics")
    async def prometheus() -> PlainTextResponse:
        running, waiting = served.queue_lengths()
        text = metrics.exposition(running, waiting, served.version, served.engine.is_paused)
        return PlainTextResponse(text, media_type=PROMETHEUS_CONTENT_TYPE)


def add_admin_routes(app: FastAPI, served: ServedModel, metrics: ServerMetrics) -> None:
    """The RL admin routes under SGLang's and vLLM's names: reload weights from an HF folder, report the weight
    version and checksum, pause, resume, abort."""
    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request) -> dict[str, Any]:
        body = await parse_body(request, ReloadRequest)
        version = await served.reload(body.model_path, body.weight_version)
        metrics.num_reloads += 1
        return {"success": True, "message": f"loaded {body.model_path}", "weight_version": version}

    @app.get("/get_weight_version")
    async def get_weight_version() -> dict[str, Any]:
        return {"weight_version": served.version}

    @app.get("/weights_checksum")
    async def weights_checksum() -> dict[str, Any]:
        return await served.checksum()

    async def pause() -> dict[str, Any]:
        await served.pause()
        return {"success": True, "is_paused": True}

    async def resume() -> dict[str, Any]:
        await served.resume()
        return {"success": True, "is_paused": False}

    for path in ("/pause_generation", "/pause"):
        app.add_api_route(path, pause, methods=["POST"])
    for path in ("/continue_generation", "/resume"):
        app.add_api_route(path, resume, methods=["POST"])

    @app.get("/is_paused")
    async def is_paused() -> dict[str, Any]:
        return {"is_paused": served.engine.is_paused}

    @app.post("/abort_request")
    async def abort_request(request: Request) -> dict[str, Any]:
        body = await parse_body(request, AbortRequest)
        num_aborted = await served.abort(None if body.abort_all else body.rid)
        metrics.num_aborted += num_aborted
        return {"success": True, "num_aborted": num_aborted}
