"""rollout.backend=external against two real `asyncrl serve` processes, without a training run: generation through
HTTP equals the engine's, a weight sync reloads every server (checked by checksum) and stamps the new version, a
server killed mid-use leaves the rotation while its requests are answered by the other, and with every server
dead the call fails naming each one; a server whose reload never reaches its engine fails the sync's checksum."""

from __future__ import annotations

import asyncio
import shutil

import numpy as np
import pytest
import torch

from asyncrl.config import load_config
from asyncrl.engine import EngineConfig, GenerationRequest, LLMEngine, SamplingParams
from asyncrl.models import build_tiny_model
from asyncrl.remote import RemoteUnavailableError
from asyncrl.rollout import ExternalRollout, RolloutContext, RolloutError
from asyncrl.rollout.external_client import ServerClient, ServerFailure
from asyncrl.rollout.external_weights import folder_checksum
from asyncrl.rollout.server_api import AsyncrlServerApi
from tests.serving.conftest import API_KEY
from tests.serving.lying_server import lying_server
from tests.serving.server_process import running_server, start_server


class FolderTrainers:
    """Trainer ranks as the backend reaches them at a sync: `export_policy` writes the next policy's folder."""

    def __init__(self, policies):
        self.policies = list(policies)
        self.exported = []

    def export_policy(self, folder: str) -> None:
        shutil.copytree(self.policies[len(self.exported)], folder)
        self.exported.append(folder)


def requests(count: int, salt: str, max_tokens: int = 6) -> list[GenerationRequest]:
    return [GenerationRequest(f"{salt}/{index}", [4 + index, 9, 12], SamplingParams(max_new_tokens=max_tokens,
                                                                                     seed=100 + index))
            for index in range(count)]


def test_generation_reload_failover_and_every_server_dead(tool_model, tmp_path, monkeypatch):
    second_policy = build_tiny_model(tmp_path / "second", family="qwen2", seed=1, max_position_embeddings=256)
    servers = [start_server(tool_model, "--api-key", API_KEY, log_dir=tmp_path) for _ in range(2)]
    try:
        for server in servers:
            server.wait_ready()
        monkeypatch.setenv("ASYNCRL_API_KEY", API_KEY)
        config = load_config(None, [
            f"model.path={tool_model}", "rollout.backend=external", "rollout.external.verify_weights=true",
            f"rollout.external.urls=[{servers[0].base_url},{servers[1].base_url}]", "rollout.external.timeout_s=60",
            f"trainer.output_dir={tmp_path / 'run'}", "trainer.device=cpu"])
        trainers = FolderTrainers([second_policy, tool_model])
        rollout = ExternalRollout(RolloutContext(config, trainers, [], torch.float32, lambda: ("127.0.0.1", 0)))

        # Token ids in, ids and log-probs out, equal to the engine's for the same prompt and seed.
        batch = requests(8, "first")
        pending = rollout.start_generate(batch)
        results = pending.results()
        engine = LLMEngine(tool_model, EngineConfig(device="cpu", cpu_kv_cache_mb=16))
        for result, expected in zip(results, engine.generate(batch)):
            assert result.response_ids.tolist() == expected.response_ids.tolist()
            np.testing.assert_allclose(result.response_log_probs, expected.response_log_probs, rtol=0, atol=1e-5)
            assert set(result.response_versions.tolist()) == {0}
        assert {output.name for output in pending.outputs} == {server.base_url for server in servers}

        # A sync writes the policy, both servers reload it (their checksums are checked) and stamp version 1.
        rollout.sync_weights(1)
        assert all(folder_checksum(trainers.exported[0], torch.float32) == rollout.servers[index].get(
            "/weights_checksum")["sha256"] for index in range(2))
        group = asyncio.run(rollout.generate(requests(4, "second")))
        assert {version for result in group for version in result.response_versions.tolist()} == {1}

        # Partial rollout: a resumed request continues its response within the original budget.
        first = results[0]
        cut = GenerationRequest(first.request_id, first.prompt_ids, batch[0].params, first.response_ids[:2],
                                first.response_log_probs[:2], first.response_versions[:2])
        [resumed] = asyncio.run(rollout.generate([cut]))
        assert resumed.response_ids[:2].tolist() == first.response_ids[:2].tolist()
        assert resumed.num_response_tokens <= batch[0].params.max_new_tokens
        assert resumed.response_versions.tolist()[:2] == [0, 0] and set(resumed.response_versions[2:].tolist()) <= {1}

        # One server killed: its requests go to the other, it leaves the rotation and is reported.
        servers[1].kill()
        answered = rollout.start_generate(requests(8, "third")).results()
        assert len(answered) == 8 and all(result.num_response_tokens > 0 for result in answered)
        health = rollout.health()
        assert health.unhealthy == (servers[1].base_url,) and health.num_failures == 1
        assert health.num_requeued_requests >= 1
        rollout.sync_weights(2)   # the survivor reloads; the dead one stays out
        assert rollout.health().unhealthy == (servers[1].base_url,)

        # Every server dead: the call fails at once, naming each one and why it left.
        servers[0].kill()
        with pytest.raises(RemoteUnavailableError, match="every rollout server is out of rotation") as error:
            rollout.start_generate(requests(2, "fourth")).results()
        assert servers[0].base_url in str(error.value) and servers[1].base_url in str(error.value)
    finally:
        for server in servers:
            server.stop()


def test_a_server_that_dies_between_its_reload_and_the_checksum_leaves_the_rotation(tmp_path, monkeypatch):
    """One component with its HTTP calls replaced: the second server answers the reload, then is gone when its
    weights checksum is asked for (the race a server killed mid-sync hits). The sync goes on with the first."""
    policy = build_tiny_model(tmp_path / "policy", family="qwen2", seed=0, max_position_embeddings=256)
    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    dead = set()

    def get(self, path, timeout_s=None):
        if self.url in dead:
            raise ServerFailure(f"{self.url}: GET {path} failed: ConnectError: [Errno 111] Connection refused")
        folder = reloaded.get(self.url, policy)
        return {"dtype": "float32", "sha256": folder_checksum(folder, torch.float32)}

    def reload(self, server, folder, version, timeout_s):
        if server.url in dead:
            raise ServerFailure(f"{server.url}: POST {self.reload_endpoint} failed: ConnectError: [Errno 111] "
                                f"Connection refused")
        reloaded[server.url] = folder
        if server.url == urls[1] and version == 1:
            dead.add(server.url)   # it reloaded, then died before the checksum

    reloaded: dict = {}
    monkeypatch.setattr(ServerClient, "connect", lambda self: None)
    monkeypatch.setattr(ServerClient, "get", get)
    monkeypatch.setattr(AsyncrlServerApi, "reload", reload)
    config = load_config(None, [f"model.path={policy}", "rollout.backend=external", "rollout.external.verify_weights=true",
                                f"rollout.external.urls=[{urls[0]},{urls[1]}]", f"trainer.output_dir={tmp_path / 'run'}",
                                "trainer.device=cpu"])
    rollout = ExternalRollout(RolloutContext(config, FolderTrainers([policy, policy]), [], torch.float32,
                                             lambda: ("127.0.0.1", 0)))
    rollout.sync_weights(1)
    assert rollout.version == 1
    health = rollout.health()
    assert health.unhealthy == (urls[1],) and health.num_failures == 1
    assert "weights checksum failed" in rollout.why_out[1]
    dead.add(urls[0])
    with pytest.raises(RemoteUnavailableError, match="every rollout server is out of rotation"):
        rollout.sync_weights(2)


def test_a_server_whose_reload_never_lands_fails_the_sync_by_its_checksum(tmp_path):
    """A real `asyncrl serve` behind a gateway that answers every reload as done without passing it on: the
    server keeps its old weights, and its true checksum (the old policy's) must fail the sync, naming it."""
    old = build_tiny_model(tmp_path / "old", family="qwen2", seed=0, max_position_embeddings=256)
    new = build_tiny_model(tmp_path / "new", family="qwen2", seed=1, max_position_embeddings=256)
    assert folder_checksum(old, torch.float32) != folder_checksum(new, torch.float32)
    with running_server(old, log_dir=tmp_path) as upstream, lying_server(upstream.base_url, old, "stale_weights") as url:
        config = load_config(None, [f"model.path={old}", "rollout.backend=external", "rollout.external.verify_weights=true",
                                    f"rollout.external.urls=[{url}]", "rollout.external.timeout_s=60",
                                    f"trainer.output_dir={tmp_path / 'run'}", "trainer.device=cpu"])
        rollout = ExternalRollout(RolloutContext(config, FolderTrainers([new]), [], torch.float32,
                                                 lambda: ("127.0.0.1", 0)))
        with pytest.raises(RolloutError, match="serves weights that differ") as error:
            rollout.sync_weights(1)
        assert url in str(error.value)
        expected = folder_checksum(old, torch.float32)[:12]
        assert f"sha256 {expected}..." in str(error.value)   # what it holds: the old policy
        assert rollout.version == 0
