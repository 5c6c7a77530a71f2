"""`asyncrl check-server` against real servers on loopback: a real `asyncrl serve` passes every check (and is left
on the weights it started with); a real ASGI server in front of it that lies fails the checks that name its lie.
(`vllm serve` passing them: tests/e2e/test_external_vllm.py.)"""

from __future__ import annotations

import json

import httpx
import pytest
import torch

from asyncrl.cli import main
from asyncrl.data.demo_tasks import MODEL_SHAPE
from asyncrl.models import build_tiny_model
from asyncrl.rollout.external_client import ServerClient, ServerRequestError
from asyncrl.rollout.external_weights import folder_checksum
from asyncrl.rollout.readiness import SERVER_CHECKS, check_server
from asyncrl.rollout.server_api import VllmServerApi
from tests.serving.lying_server import lying_server
from tests.serving.server_process import running_server

RELOAD_CHECKS = {"reload_changes_weights", "checksum_after_reload", "request_during_reload"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`asyncrl serve` on an untrained tiny model (it samples special tokens, which a text round trip drops)."""
    root = tmp_path_factory.mktemp("check_server")
    model = build_tiny_model(root / "model", family="qwen2", seed=0, **MODEL_SHAPE)
    with running_server(model, log_dir=root) as server:
        yield server, model, root


def test_asyncrl_serve_passes_every_check_and_keeps_its_weights(served, capsys):
    server, model, root = served
    code = main(["check-server", server.base_url, "--model", str(model), "--work-dir", str(root),
                 "--json", str(root / "report.json")])
    table = capsys.readouterr().out
    report = json.loads((root / "report.json").read_text())
    assert code == 0, table
    assert [check["name"] for check in report["checks"]] == list(SERVER_CHECKS)
    assert all(check["passed"] for check in report["checks"]), table
    evidence = {check["name"]: check["evidence"] for check in report["checks"]}
    worst = float(evidence["logprobs_temperature"].split("= ")[1].split()[0])
    assert worst <= 1e-5   # the same transformer on both sides, fp32
    assert "finish 'abort'" in evidence["abort"] and "samples from the new weights" in evidence[
        "request_during_reload"]
    # Left as found: the weights of --model, stamped version 0.
    checksum = httpx.get(server.base_url + "/weights_checksum", timeout=30).json()
    assert checksum["sha256"] == folder_checksum(model, torch.float32) and checksum["weight_version"] == 0


def test_a_server_that_rebuilds_token_ids_from_text_fails_token_ids(served):
    server, model, root = served
    with lying_server(server.base_url, model, "retokenized") as url:
        report = check_server(url, model, work_dir=root)
    results = {result.name: result for result in report.results}
    assert not report.passed and not results["token_ids"].passed
    assert "differ from the prompt sent" in results["token_ids"].evidence or \
        "rebuilt from text" in results["token_ids"].evidence
    # The checks that compare log-probs with ids cannot, and say why; its weights are honest: the checksum passes.
    assert "log-probs (see token_ids)" in results["logprobs_temperature"].evidence
    assert results["checksum_after_reload"].passed


def test_a_server_whose_reload_never_lands_fails_the_reload_checks_with_a_stale_checksum(served):
    server, model, root = served
    with lying_server(server.base_url, model, "stale_weights") as url:
        report = check_server(url, model, work_dir=root)
    results = {result.name: result for result in report.results}
    assert set(report.failed_names()) == RELOAD_CHECKS, report.table()
    assert "still samples from the old weights" in results["reload_changes_weights"].evidence
    assert "before the reload (stale)" in results["checksum_after_reload"].evidence
    assert "not exercised" in results["request_during_reload"].evidence


def test_a_server_that_reports_temperature_one_log_probs_fails_logprobs_temperature_and_says_so(served):
    server, model, root = served
    with lying_server(server.base_url, model, "raw_logprobs") as url:
        report = check_server(url, model, work_dir=root)
    results = {result.name: result for result in report.results}
    assert not results["logprobs_temperature"].passed and results["token_ids"].passed
    assert "log-probs at temperature 1" in results["logprobs_temperature"].evidence


def test_the_vllm_routes_on_a_server_without_them_name_the_development_mode(served):
    server, _, _ = served
    client = ServerClient(server.base_url, "", 30)
    client.connect()
    with pytest.raises(ServerRequestError, match="VLLM_SERVER_DEV_MODE=1"):
        VllmServerApi("").check(client)
