"""One OpenAI-compatible rollout server as the external backend talks to it over HTTP: completions, health,
and any other route (the reload, checksum and abort routes of each kind of server: `server_api.py`).

    server = ServerClient("http://127.0.0.1:8001", api_key="", timeout_s=300)
    server.connect()                                   # GET /health, and the served name from GET /v1/models
    answer = await server.complete(client, body)       # the JSON answer (external_answer.py builds and checks)
    server.post("/abort_request", {"abort_all": True}, timeout_s=5)

`ServerFailure` is the server's fault (no connection, a timeout, a 5xx, an answer that is not JSON or not what
was asked for: `ServerLied`): the backend takes the server out of rotation and sends the request to another. A
4xx is the request's fault and raises `ServerRequestError`.
"""

from __future__ import annotations

import os
from typing import Any

import httpx


KEEPALIVE_S = 2.0   # below uvicorn's default keep-alive (5 s), the servers' usual


class ServerFailure(RuntimeError):
    """The server did not answer properly (connection refused or lost, timeout, 5xx)."""


class ServerRequestError(RuntimeError):
    """The server refused the request (4xx): retrying elsewhere would not help."""


class ServerLied(ServerFailure):
    """The server answered, but with something no honest server sends (not JSON, not the shape asked for, or
    against the request: `external_answer.py`); it leaves the rotation like a dead one."""


def api_key_of(api_key_env: str) -> str:
    """rollout.external.api_key_env's value: the key from the environment (empty: none)."""
    return os.environ.get(api_key_env, "") if api_key_env else ""


class ServerClient:
    def __init__(self, url: str, api_key: str, timeout_s: float):
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout_s = timeout_s
        self.model = ""     # the served name, read from /v1/models by `connect`

    def async_client(self) -> httpx.AsyncClient:
        """A client for one event loop (httpx's async clients cannot move between loops)."""
        # An idle connection is dropped here before the server drops it (uvicorn, under asyncrl serve and vLLM,
        # after 5 s): a request sent on a connection the server is closing fails as if the server had died.
        return httpx.AsyncClient(headers=self.headers, timeout=self.timeout_s,
                                 limits=httpx.Limits(max_connections=None, max_keepalive_connections=64,
                                                     keepalive_expiry=KEEPALIVE_S))

    def check(self, response: httpx.Response, call: str) -> dict[str, Any]:
        if response.status_code >= 500:
            raise ServerFailure(f"{self.url}: {call} answered {response.status_code}: {response.text[:300]}")
        if response.status_code == 401:
            raise ServerRequestError(f"{self.url}: {call} refused the API key (401); set the key in the environment "
                                     f"variable rollout.external.api_key_env names")
        if response.status_code >= 400:
            raise ServerRequestError(f"{self.url}: {call} refused the request ({response.status_code}): "
                                     f"{response.text[:300]}")
        try:
            return response.json()
        except ValueError:
            raise ServerLied(f"{self.url}: {call} answered {response.status_code} with a body that is not JSON: "
                             f"{response.text[:100]!r}") from None

    def get_response(self, path: str, timeout_s: float | None = None) -> httpx.Response:
        try:
            return httpx.get(self.url + path, headers=self.headers, timeout=timeout_s or self.timeout_s)
        except httpx.HTTPError as error:
            raise ServerFailure(f"{self.url}: GET {path} failed: {type(error).__name__}: {error}") from None

    def get(self, path: str, timeout_s: float | None = None) -> dict[str, Any]:
        return self.check(self.get_response(path, timeout_s), f"GET {path}")

    def health(self, timeout_s: float | None = None) -> None:
        """GET /health answers 200 (its body is the server's own: JSON for asyncrl serve, empty for vLLM)."""
        response = self.get_response("/health", timeout_s)
        if response.status_code != 200:
            self.check(response, "GET /health")   # raises for an error status
            raise ServerFailure(f"{self.url}: GET /health answered {response.status_code}")

    def post(self, path: str, body: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        try:
            response = httpx.post(self.url + path, json=body, headers=self.headers,
                                  timeout=timeout_s or self.timeout_s)
        except httpx.HTTPError as error:
            raise ServerFailure(f"{self.url}: POST {path} failed: {type(error).__name__}: {error}") from None
        return self.check(response, f"POST {path}")

    def connect(self) -> None:
        """Checks that the server answers and learns the name it serves."""
        self.health()
        models = self.get("/v1/models")
        data = models.get("data") if isinstance(models, dict) else None
        if not isinstance(data, list) or not data or not isinstance(data[0], dict) or \
                not isinstance(data[0].get("id"), str):
            raise ServerRequestError(f"{self.url}: GET /v1/models lists no model ({str(models)[:100]})")
        self.model = data[0]["id"]

    def is_alive(self, timeout_s: float) -> bool:
        try:
            self.health(timeout_s)
            return True
        except (ServerFailure, ServerRequestError):
            return False

    async def complete(self, client: httpx.AsyncClient, body: dict[str, Any]) -> Any:
        """The server's JSON answer to completion request `body` (`external_answer.py` checks it)."""
        try:
            response = await client.post(self.url + "/v1/completions", json=body)
        except httpx.HTTPError as error:
            raise ServerFailure(f"{self.url}: completion of {body['request_id']!r} failed: "
                                f"{type(error).__name__}: {error}") from None
        return self.check(response, f"completion of {body['request_id']!r}")
