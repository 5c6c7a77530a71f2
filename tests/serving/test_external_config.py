"""The external backend's start-up checks, which fail before any generation with the key or the server named, and
`asyncrl serve` on a folder that cannot be served."""

from __future__ import annotations

import logging

import pytest
import torch

from asyncrl.cli import main
from asyncrl.config import ConfigError, load_config
from asyncrl.launch import runtime, train
from asyncrl.models import build_tiny_model
from asyncrl.remote import RemoteUnavailableError
from asyncrl.rollout import ExternalRollout, RolloutContext
from tests.serving.server_process import free_port


def build(tmp_path, *overrides):
    config = load_config(None, ["rollout.backend=external", f"trainer.output_dir={tmp_path}", *overrides])
    return ExternalRollout(RolloutContext(config, None, [], torch.float32, lambda: ("127.0.0.1", 0)))


def test_external_backend_without_urls_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"rollout.external.urls is empty: give the base URLs"):
        build(tmp_path)


def test_a_url_without_its_scheme_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"rollout.external.urls: '127.0.0.1:8001' is not an http:// or https://"):
        build(tmp_path, "rollout.external.urls=[127.0.0.1:8001]")


def test_a_server_that_does_not_answer_at_start_is_named(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"   # nothing listens there
    with pytest.raises(RemoteUnavailableError, match=rf"rollout.external.urls: {url}: GET /health failed"):
        build(tmp_path, f"rollout.external.urls=[{url}]", "rollout.external.timeout_s=5")


def test_serve_on_a_missing_folder_prints_one_line(tmp_path, capsys):
    assert main(["serve", str(tmp_path / "nowhere"), "--device", "cpu"]) == 2
    assert capsys.readouterr().err.strip() == (f"error: asyncrl serve {tmp_path / 'nowhere'}: model folder "
                                               f"{tmp_path / 'nowhere'} does not exist")


def test_listening_beyond_loopback_without_a_key_warns(tmp_path, caplog, monkeypatch):
    monkeypatch.delenv("ASYNCRL_API_KEY", raising=False)
    with caplog.at_level(logging.WARNING, logger="asyncrl.serving.cli"):
        main(["serve", str(tmp_path / "nowhere"), "--host", "0.0.0.0", "--device", "cpu"])
        main(["serve", str(tmp_path / "nowhere"), "--host", "0.0.0.0", "--api-key", "k", "--device", "cpu"])
        main(["serve", str(tmp_path / "nowhere"), "--host", "::1", "--device", "cpu"])
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("listening on 0.0.0.0 without an API key")


def test_a_dead_port_stops_the_run_before_ray_naming_the_url(tmp_path, monkeypatch):
    monkeypatch.setattr(runtime, "start_ray", lambda config: pytest.fail("Ray started before the checks"))
    model = build_tiny_model(tmp_path / "policy", family="qwen2", seed=0)
    url = f"http://127.0.0.1:{free_port()}"   # nothing listens there
    config = load_config(None, [f"model.path={model}", "rollout.backend=external", f"rollout.external.urls=[{url}]",
                                f"trainer.output_dir={tmp_path / 'run'}", "trainer.device=cpu"])
    with pytest.raises(ConfigError, match=rf"rollout.external.urls: {url}: GET /health failed: ConnectError"):
        train(config)
