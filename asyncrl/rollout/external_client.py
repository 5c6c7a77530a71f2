"""One OpenAI-compatible rollout server as the external backend talks to it: a request as token ids in, the
sampled ids with their log-probs (and, from `asyncrl serve`, their policy versions) out; health, reload, abort.

    server = ServerClient("http://127.0.0.1:8001", api_key="", timeout_s=300)
    result = await server.complete(client, request, version=3)   # GenerationResult, or ServerFailure
    server.reload(folder, version=4, timeout_s=120)              # POST <reload_endpoint> {model_path, weight_version}

The body is vLLM's completion request with token ids (`prompt` a list of ids, `return_token_ids`, `top_k`,
`ignore_eos`, `stop_token_ids`, `request_id`); the answer's choice carries `token_ids` and `token_logprobs`
(asyncrl serve; vLLM gives the ids and, with `logprobs`, the log-probs). A server that does not say which
version sampled each token gets the version the backend pushed last. A resumed request (partial rollout) is sent
as prompt + the response so far with the remaining budget, and its result is the whole response.

`ServerFailure` is the server's fault (no connection, a timeout, a 5xx): the backend takes the server out of
rotation and sends the request to another. A 4xx is the request's fault and raises `ServerRequestError`.
"""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np

from asyncrl.engine import GenerationRequest, GenerationResult


class ServerFailure(RuntimeError):
    """The server did not answer properly (connection refused or lost, timeout, 5xx)."""


class ServerRequestError(RuntimeError):
    """The server refused the request (4xx): retrying elsewhere would not help."""


def completion_body(request: GenerationRequest, model: str) -> dict[str, Any] | None:
    """The completion request for `request`'s remaining budget, or None when nothing is left to generate."""
    params = request.params
    remaining = params.max_new_tokens - request.response_ids.size
    if remaining <= 0:
        return None
    prompt = np.concatenate([request.prompt_ids, request.response_ids]).tolist()
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": int(remaining),
                            "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k,
                            "ignore_eos": params.ignore_eos, "stop_token_ids": list(params.stop_token_ids),
                            "return_token_ids": True, "logprobs": 0, "request_id": request.request_id}
    if params.seed is not None:
        body["seed"] = params.seed
    return body


def result_from_choice(request: GenerationRequest, choice: dict[str, Any], version: int, url: str) -> GenerationResult:
    """The whole response: the request's earlier part, then the choice's tokens."""
    token_ids = choice.get("token_ids")
    log_probs = choice.get("token_logprobs")
    if log_probs is None and choice.get("logprobs"):
        log_probs = choice["logprobs"].get("token_logprobs")
    if token_ids is None or log_probs is None or len(token_ids) != len(log_probs):
        raise ServerRequestError(f"{url}: the completion of {request.request_id!r} lacks token_ids and their "
                                 f"log-probs (the external backend needs a server that returns them: asyncrl serve, "
                                 f"or vLLM with return_token_ids)")
    versions = choice.get("token_versions") or [version] * len(token_ids)
    reason = choice.get("finish_reason") or "length"
    finish_reason = reason if reason in ("stop", "length", "abort") else "stop"
    return GenerationResult(
        request.request_id, request.prompt_ids,
        np.concatenate([request.response_ids, np.asarray(token_ids, dtype=np.int32)]),
        np.concatenate([request.response_log_probs, np.asarray(log_probs, dtype=np.float32)]),
        np.concatenate([request.response_versions, np.asarray(versions, dtype=np.int32)]), finish_reason)


def finished_already(request: GenerationRequest) -> GenerationResult:
    """A resumed request whose budget was spent before it was aborted."""
    return GenerationResult(request.request_id, request.prompt_ids, request.response_ids, request.response_log_probs,
                            request.response_versions, "length")


class ServerClient:
    def __init__(self, url: str, api_key: str, timeout_s: float):
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout_s = timeout_s
        self.model = ""     # the served name, read from /v1/models by `connect`

    def async_client(self) -> httpx.AsyncClient:
        """A client for one event loop (httpx's async clients cannot move between loops)."""
        return httpx.AsyncClient(headers=self.headers, timeout=self.timeout_s,
                                 limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))

    def check(self, response: httpx.Response, call: str) -> dict[str, Any]:
        if response.status_code >= 500:
            raise ServerFailure(f"{self.url}: {call} answered {response.status_code}: {response.text[:300]}")
        if response.status_code == 401:
            raise ServerRequestError(f"{self.url}: {call} refused the API key (401); set the key in the environment "
                                     f"variable rollout.external.api_key_env names")
        if response.status_code >= 400:
            raise ServerRequestError(f"{self.url}: {call} refused the request ({response.status_code}): "
                                     f"{response.text[:300]}")
        return response.json()

    def get(self, path: str, timeout_s: float | None = None) -> dict[str, Any]:
        try:
            response = httpx.get(self.url + path, headers=self.headers, timeout=timeout_s or self.timeout_s)
        except httpx.HTTPError as error:
            raise ServerFailure(f"{self.url}: GET {path} failed: {type(error).__name__}: {error}") from None
        return self.check(response, f"GET {path}")

    def post(self, path: str, body: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        try:
            response = httpx.post(self.url + path, json=body, headers=self.headers,
                                  timeout=timeout_s or self.timeout_s)
        except httpx.HTTPError as error:
            raise ServerFailure(f"{self.url}: POST {path} failed: {type(error).__name__}: {error}") from None
        return self.check(response, f"POST {path}")

    def connect(self) -> None:
        """Checks that the server answers and learns the name it serves."""
        self.get("/health")
        models = self.get("/v1/models")["data"]
        if not models:
            raise ServerRequestError(f"{self.url}: GET /v1/models lists no model")
        self.model = models[0]["id"]

    def is_alive(self, timeout_s: float) -> bool:
        try:
            self.get("/health", timeout_s)
            return True
        except (ServerFailure, ServerRequestError):
            return False

    async def complete(self, client: httpx.AsyncClient, request: GenerationRequest, version: int) -> GenerationResult:
        body = completion_body(request, self.model)
        if body is None:
            return finished_already(request)
        try:
            response = await client.post(self.url + "/v1/completions", json=body)
        except httpx.HTTPError as error:
            raise ServerFailure(f"{self.url}: completion of {request.request_id!r} failed: "
                                f"{type(error).__name__}: {error}") from None
        answer = self.check(response, f"completion of {request.request_id!r}")
        return result_from_choice(request, answer["choices"][0], version, self.url)

    def reload(self, endpoint: str, folder: str, version: int, timeout_s: float) -> int:
        """Loads the HF folder as `version`; returns the version the server reports."""
        answer = self.post(endpoint, {"model_path": folder, "weight_version": version}, timeout_s)
        return int(answer.get("weight_version", version))

    def abort_all(self, timeout_s: float) -> None:
        self.post("/abort_request", {"abort_all": True}, timeout_s)
