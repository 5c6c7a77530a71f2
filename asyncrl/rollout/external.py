"""External rollout servers: generation on OpenAI-compatible HTTP servers (`asyncrl serve`, `vllm serve`, or an
SGLang server behind a proxy that returns token ids and log-probs), weights pushed as an HF folder that each
server reloads (through the routes of its kind, rollout.external.api: `server_api.py`).

    asyncrl train cfg.yaml rollout.backend=external \\
        'rollout.external.urls=[http://127.0.0.1:8001,http://127.0.0.1:8002]'

    rollout = ExternalRollout(context)            # every server must answer /health and /v1/models
    results = await rollout.generate(group)       # the least-loaded healthy server; failover inside
    pending = rollout.start_generate(requests)    # spread over the healthy servers, in a thread of its own
    rollout.sync_weights(version)                 # write the policy, POST reload to every server that answers

A server that fails a request (connection refused or lost, a timeout, a 5xx, or an answer that breaks the request:
more tokens than max_tokens, ids outside the vocabulary, log-probs that are not finite, not the JSON asked for;
`external_answer.py`) leaves the rotation, and the request is sent again to a healthy one, at most `max_retries`
times; when no server is left the call fails naming every server and why it left. A server not heard from for
`health_interval_s` is probed before it gets requests. At each weight sync every server is asked to reload, those
out of rotation too: one that answers is back (its weights are current again); one that does not stays out and is
reported. Versions are tracked here: a server stamps each token with the `weight_version` it was given at its last
reload (asyncrl serve says so per token; for a server that does not, tokens get the version pushed last, exact
whenever requests do not cross a sync, as in sync and one_step_off mode).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path

import httpx
import torch

from asyncrl.config import ConfigError
from asyncrl.engine import GenerationRequest, GenerationResult
from asyncrl.remote import RemoteUnavailableError
from asyncrl.rollout.backend import (PendingGeneration, RolloutBackend, RolloutError, RolloutHealth, WorkerOutput,
                                     spread)
from asyncrl.models import check_model_folder
from asyncrl.rollout.external_answer import completion_body, finished_already, result_from_answer
from asyncrl.rollout.external_client import ServerClient, ServerFailure, api_key_of
from asyncrl.rollout.external_weights import folder_checksum, write_policy
from asyncrl.rollout.gate import BusyClock, GatedControls, RequestGate
from asyncrl.rollout.registry import ROLLOUT_BACKENDS, RolloutContext
from asyncrl.rollout.server_api import SERVER_APIS
from asyncrl.rollout.threaded_batch import ThreadedBatch

logger = logging.getLogger(__name__)

HEALTH_PROBE_S = 5.0   # a health probe's own limit: a live server answers /health at once


@ROLLOUT_BACKENDS.register("external", placement="external",
                           summary="OpenAI-compatible HTTP servers (asyncrl serve; vLLM, SGLang): token ids in, ids "
                                   "and log-probs out; weights written as an HF folder each server reloads; a dead "
                                   "server leaves the rotation and its requests go to another")
class ExternalRollout(GatedControls, RolloutBackend):
    def __init__(self, context: RolloutContext):
        config = context.config
        settings = config.rollout.external
        if not settings.urls:
            raise ConfigError("rollout.external.urls is empty: give the base URLs of the servers "
                              "(e.g. [http://127.0.0.1:8001]) for rollout.backend=external")
        for url in settings.urls:
            if not url.startswith(("http://", "https://")):
                raise ConfigError(f"rollout.external.urls: {url!r} is not an http:// or https:// URL")
        self.settings = settings
        self.trainers = context.trainers
        self.sync_timeout_s = config.weight_sync.timeout_s
        self.weights_dir = Path(settings.weights_dir or Path(config.trainer.output_dir) / "external_weights")
        api_key = api_key_of(settings.api_key_env)
        self.servers = [ServerClient(url, api_key, settings.timeout_s) for url in settings.urls]
        self.api = SERVER_APIS[settings.api](settings.reload_endpoint)
        self.names = [server.url for server in self.servers]
        self.is_healthy = [True] * len(self.servers)
        self.why_out = [""] * len(self.servers)
        self.last_seen = [0.0] * len(self.servers)
        self.load = [0] * len(self.servers)
        self.gate = RequestGate()
        self.num_failures = self.num_requeued = self.num_rejoined = 0
        self.aborted: list[GenerationResult] = []
        self.clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # event loop -> its httpx clients
        self.lock = threading.Lock()
        self.version = 0
        self.connect_all()
        # A token id at or past it would index past the trainer's embedding: such an answer is a lie.
        self.vocab_size = check_model_folder(config.model.path, "causal_lm").vocab_size
        if settings.verify_weights:
            self.verify(config.model.path, list(range(len(self.servers))))

    def connect_all(self) -> None:
        """Every server must answer at the start, with the routes its kind of server (rollout.external.api) has:
        a URL that does not is a configuration error."""
        failed = []
        for server in self.servers:
            try:
                server.connect()
                self.api.check(server)
            except (ServerFailure, RolloutError, RuntimeError) as error:
                failed.append(str(error))
        if failed:
            raise RemoteUnavailableError("rollout.external.urls: " + "; ".join(failed))
        self.last_seen = [time.monotonic()] * len(self.servers)

    # ---- rotation -------------------------------------------------------------------------------------
    def take_out(self, index: int, reason: str) -> None:
        with self.lock:
            if self.is_healthy[index]:
                self.is_healthy[index] = False
                self.why_out[index] = reason
                self.num_failures += 1
                logger.warning("rollout server %s left the rotation: %s", self.names[index], reason)

    def probe_stale(self) -> None:
        """Health checks: a server not heard from for health_interval_s answers /health or leaves the rotation."""
        now = time.monotonic()
        for index, server in enumerate(self.servers):
            if self.is_healthy[index] and now - self.last_seen[index] > self.settings.health_interval_s:
                if server.is_alive(HEALTH_PROBE_S):
                    self.last_seen[index] = time.monotonic()
                else:
                    self.take_out(index, "did not answer GET /health")

    def pick(self) -> int:
        """The least-loaded healthy server; none left is an error naming every server and why it left."""
        healthy = [index for index, is_healthy in enumerate(self.is_healthy) if is_healthy]
        if not healthy:
            reasons = "; ".join(f"{name}: {why}" for name, why in zip(self.names, self.why_out))
            raise RemoteUnavailableError(f"rollout/external: every rollout server is out of rotation ({reasons})")
        return min(healthy, key=self.load.__getitem__)

    def client_for_loop(self, index: int) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        clients = self.clients.setdefault(loop, {})
        if index not in clients:
            clients[index] = self.servers[index].async_client()
        return clients[index]

    async def complete(self, request: GenerationRequest, first: int,
                       client_of: Callable[[int], httpx.AsyncClient]) -> tuple[int, GenerationResult]:
        """One request on server `first`, then on others while servers fail (at most max_retries times)."""
        index, attempts = first, 0
        body = completion_body(request, self.servers[index].model)
        if body is None:
            return index, finished_already(request)
        while True:
            self.load[index] += 1
            server = self.servers[index]
            try:
                answer = await server.complete(client_of(index), {**body, "model": server.model})
                result = result_from_answer(request, answer, body["max_tokens"], self.vocab_size, self.version,
                                            server.url)
            except ServerFailure as error:   # a dead server, or one that lied (ServerLied)
                failure = error
            else:
                self.last_seen[index] = time.monotonic()
                return index, result
            finally:
                self.load[index] -= 1
            self.take_out(index, str(failure))
            attempts += 1
            if attempts > self.settings.max_retries:
                raise RemoteUnavailableError(f"rollout/external: request {request.request_id!r} failed on {attempts} "
                                             f"servers (rollout.external.max_retries={self.settings.max_retries}); "
                                             f"last: {failure}")
            self.num_requeued += 1
            index = self.pick()

    # ---- generation -----------------------------------------------------------------------------------
    async def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """The group on one server (the least loaded, so it shares the prompt's KV), each request re-sent to
        another server if its server fails."""
        await self.gate.enter(len(requests))
        try:
            await asyncio.to_thread(self.probe_stale)
            first = self.pick()
            answers = await asyncio.gather(*(self.complete(request, first, self.client_for_loop)
                                             for request in requests))
            results = [result for _, result in answers]
            self.aborted += [result for result in results if result.finish_reason == "abort"]
            return results
        finally:
            await self.gate.leave(len(requests))

    def start_generate(self, requests: list[GenerationRequest]) -> PendingGeneration:
        """Spread over the healthy servers and generated in a thread of its own (so the driver trains meanwhile);
        `results()` waits for it, each server's share bounded by the per-request timeout and the retries."""
        self.probe_stale()
        healthy = [index for index, is_healthy in enumerate(self.is_healthy) if is_healthy]
        if not healthy:
            self.pick()   # raises, naming every server
        parts = spread(requests, len(healthy))
        async def run() -> list[WorkerOutput]:
            clients = {index: self.servers[index].async_client() for index in range(len(self.servers))}
            started = time.monotonic()
            try:
                answers = await asyncio.gather(*(self.complete(request, index, clients.__getitem__)
                                                 for index, part in zip(healthy, parts) for request in part))
            finally:
                await asyncio.gather(*(client.aclose() for client in clients.values()))
            seconds = time.monotonic() - started
            by_server: dict[int, list[GenerationResult]] = {}
            for index, result in answers:
                by_server.setdefault(index, []).append(result)
            return [WorkerOutput(self.names[index], results, seconds) for index, results in sorted(by_server.items())]

        batch = ThreadedBatch("external-rollout-batch", run)
        timeout_s = self.settings.timeout_s * (self.settings.max_retries + 1) + HEALTH_PROBE_S

        def collect() -> list[WorkerOutput]:
            outputs, _ = batch.join(timeout_s, f"rollout/external ({', '.join(self.names)}): generate of "
                                               f"{len(requests)} requests",
                                    "rollout.external.timeout_s x (max_retries + 1)")
            return outputs

        return PendingGeneration(list(requests), collect)

    async def abort(self) -> list[GenerationResult]:
        """Asks every healthy server to abort all its requests (`server_api.py`); those in flight come back with
        finish_reason "abort" to their `generate` callers. Returns the aborted results seen until those calls
        ended (call after `pause`, as the fully-async rollouter does)."""
        self.aborted = []
        indices = [index for index, healthy in enumerate(self.is_healthy) if healthy]
        answers = await asyncio.gather(*(asyncio.to_thread(self.api.abort_all, self.servers[index], HEALTH_PROBE_S)
                                         for index in indices), return_exceptions=True)
        for index, answer in zip(indices, answers):
            if isinstance(answer, ServerFailure):
                self.take_out(index, str(answer))
        await self.gate.wait_until_idle()
        aborted, self.aborted = self.aborted, []
        return aborted

    # ---- weights ----------------------------------------------------------------------------------------
    def sync_weights(self, version: int) -> None:
        """Writes the trainer's policy as weights_dir/v<version> and asks every server to reload it as
        `version`; a server that reloads is in rotation, one that does not answer is out (and reported). No
        server reloaded is an error naming each one's reason."""
        folder = write_policy(self.trainers, self.weights_dir, version)
        reloaded = []
        for index, server in enumerate(self.servers):
            try:
                self.api.reload(server, str(folder), version, self.sync_timeout_s)
            except ServerFailure as error:
                self.take_out(index, f"reload failed: {error}")
                continue
            reloaded.append(index)
            with self.lock:
                if not self.is_healthy[index]:
                    self.num_rejoined += 1
                    logger.warning("rollout server %s is back in rotation (reloaded version %d)", self.names[index],
                                   version)
                self.is_healthy[index], self.why_out[index] = True, ""
            self.last_seen[index] = time.monotonic()
        if self.settings.verify_weights:
            self.verify(str(folder), reloaded)
        if not any(self.is_healthy):
            self.pick()   # raises, naming every server and why
        self.version = version

    def verify(self, folder: str, indices: list[int]) -> None:
        """Each server's weights checksum equals the folder's (cast to the dtype the server holds). One that
        stops answering meanwhile is out of rotation, as in the reload; one that answers with other weights
        is an error (a server that reloads wrongly would train the policy on samples from other weights)."""
        expected: dict[str, str] = {}
        for index in indices:
            try:
                answer = self.api.checksum(self.servers[index], self.sync_timeout_s)
            except ServerFailure as error:
                self.take_out(index, f"weights checksum failed: {error}")
                continue
            if answer.dtype not in expected:
                expected[answer.dtype] = folder_checksum(folder, getattr(torch, answer.dtype))
            if answer.sha256 != expected[answer.dtype]:
                raise RolloutError(f"{self.names[index]} serves weights that differ from {folder} (sha256 "
                                   f"{answer.sha256[:12]}... vs {expected[answer.dtype][:12]}...) after its reload")

    async def sleep(self) -> None:
        """The servers keep their memory: they run beside training, not on its devices."""

    async def wake(self) -> None:
        """See `sleep`."""

    # ---- health -------------------------------------------------------------------------------------------
    def health(self) -> RolloutHealth:
        unhealthy = tuple(name for name, healthy in zip(self.names, self.is_healthy) if not healthy)
        return RolloutHealth(len(self.servers), unhealthy, self.num_rejoined, self.num_failures, self.num_requeued)

    def activity(self) -> BusyClock:
        return self.gate.clock

    def close(self) -> None:
        """The servers are not ours to stop; the clients of live event loops close with them."""
