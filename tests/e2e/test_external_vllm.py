"""rollout.backend=external against real `vllm serve` processes (vLLM's OpenAI server, CPU build, development mode
with asyncrl's worker extension: rollout.external.api=vllm), with the checks of test_external_backend.py's runs
against `asyncrl serve`: the demo task trained against two servers, one killed with SIGKILL mid-run.

What must hold: the run finishes every step; each step's tokens carry the version of the sync before it; the
killed server is reported (out of rotation, one failure counted) and the survivor served the rest; every reload
was checked (`verify_weights`: the checksum of what each server's workers loaded), the survivor reports the last
version and the trainer's final policy, and its log-probs of fixed tokens equal the final policy's within 1e-4
(the weights reached the engine, not only its loader); the policy learned (validation +30 points, as on rollout.backend=vllm). Needs vLLM (`scripts/vllm_cpu_venv.sh`);
three engine starts (~1 min each on 2 cores).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from asyncrl.launch import train
from asyncrl.rollout.external_client import ServerClient
from asyncrl.rollout.external_weights import folder_checksum
from asyncrl.rollout.readiness import SERVER_CHECKS, check_server
from asyncrl.rollout.readiness.reference import ReferenceModel
from asyncrl.rollout.server_api import VllmServerApi
from asyncrl.rollout.vllm.engine_args import vllm_installed
from asyncrl.telemetry import read_metrics
from tests.e2e.demo_configs import warm_config
from tests.e2e.test_external_backend import last_step, train_killing_one_server, wait_for_step
from tests.serving.server_process import start_vllm_server

pytestmark = [pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.skipif(not vllm_installed(), reason="vLLM is not installed here "
                                 "(bash scripts/vllm_cpu_venv.sh; docs/vllm.md)")]
NUM_STEPS = 32   # the steps over which test_vllm_backend.py's one_step_off run on this policy gains GAIN
KILL_AFTER_STEP = 4
GAIN = 0.3
EXTERNAL = ("rollout.backend=external", "rollout.external.api=vllm", "rollout.external.verify_weights=true",
            "rollout.external.timeout_s=60", "rollout.external.max_retries=2", "trainer.dump_rollouts=true",
            "trainer.test_freq=-1")


@pytest.fixture(scope="module")
def vllm_servers(vllm_policy, tmp_path_factory):
    """Two vLLM servers on the warm-started policy (started together: their engines load side by side)."""
    log_dir = tmp_path_factory.mktemp("vllm_logs")
    servers = [start_vllm_server(vllm_policy["model"], log_dir=log_dir) for _ in range(2)]
    try:
        for server in servers:
            server.wait_ready()
        yield servers
    finally:
        for server in servers:
            server.stop()


def dumped_versions(output: Path, step: int) -> list[list[int]]:
    return [json.loads(line)["versions"] for line in (output / "rollouts" / f"step_{step}.jsonl").read_text()
            .splitlines()]


def assert_serves_the_final_policy(url: str, output: Path, num_syncs: int) -> None:
    """The server's last reload is the run's last sync, its workers loaded the final policy, and its engine
    computes with it: log-probs of sampled tokens equal the final policy's within 1e-4 (fp32)."""
    server = ServerClient(url, "", 60)
    server.connect()
    assert server.get("/weight_info")["weight_version"] == str(num_syncs)
    checksum = VllmServerApi("").checksum(server, 60)
    assert checksum.sha256 == folder_checksum(output / "policy", torch.float32)
    reference = ReferenceModel(output / "policy")
    prompt = reference.encode("12+34=")
    answer = httpx.post(url + "/v1/completions", timeout=60, json={
        "model": server.model, "prompt": prompt, "max_tokens": 16, "temperature": 0.7, "seed": 5, "logprobs": 0,
        "return_token_ids": True, "ignore_eos": True}).json()["choices"][0]
    expected = reference.log_probs(prompt, answer["token_ids"], temperature=0.7)
    assert np.abs(np.asarray(answer["logprobs"]["token_logprobs"]) - expected).max() <= 1e-4


def test_vllm_serve_passes_every_check_of_check_server(vllm_servers, vllm_policy, tmp_path):
    """Run first: it leaves the server on the policy's weights (version 0), where the runs below start."""
    report = check_server(vllm_servers[0].base_url, vllm_policy["model"], api="vllm", work_dir=tmp_path)
    assert [result.name for result in report.results] == list(SERVER_CHECKS)
    assert report.passed, report.table()
    evidence = {result.name: result.evidence for result in report.results}
    assert float(evidence["logprobs_temperature"].split("= ")[1].split()[0]) <= 1e-4
    # vLLM recomputes a running request's keys and values after the reload: no token of mixed weights.
    assert "then 0 on the new weights over the old keys" in evidence["request_during_reload"], evidence


def test_one_step_off_trains_against_two_vllm_servers_and_survives_one_killed(vllm_servers, vllm_policy, ray_session,
                                                                            tmp_path):
    survivor, victim = vllm_servers
    config = warm_config(vllm_policy, tmp_path / "run", *EXTERNAL, "trainer.mode=one_step_off",
                         f"rollout.external.urls=[{survivor.base_url},{victim.base_url}]",
                         f"trainer.total_steps={NUM_STEPS}")
    output = Path(config.trainer.output_dir)
    killer = threading.Thread(target=lambda: (wait_for_step(output, KILL_AFTER_STEP), victim.kill()), daemon=True)
    killer.start()
    summary = train(config)
    killer.join(timeout=5)

    assert victim.process.returncode is not None and last_step(output) == NUM_STEPS
    assert summary["steps"] == NUM_STEPS
    rows = [row for row in read_metrics(output / "metrics.jsonl") if "critic/score/mean" in row]
    assert [row["step"] for row in rows] == list(range(1, NUM_STEPS + 1))
    assert [row["param_version"] for row in rows] == list(range(1, NUM_STEPS + 1))
    for step in range(1, NUM_STEPS + 1):
        versions = dumped_versions(output, step)
        assert len(versions) == config.data.train_batch_size * config.rollout.n
        assert {version for sample in versions for version in sample} == {step - 1}, step
    assert rows[0]["faults/replica_failures"] == 0.0
    assert rows[-1]["faults/replica_failures"] == 1.0
    assert_serves_the_final_policy(survivor.base_url, output, summary["param_version"])
    before = summary["initial_validation"]["val/score/mean"]
    after = summary["final_validation"]["val/score/mean"]
    assert after >= before + GAIN, (before, after)


def test_fully_async_with_partial_rollout_trains_against_vllm_servers_and_survives_one_killed(
        vllm_servers, vllm_policy, ray_session, tmp_path):
    """Each sync aborts the requests in flight (POST /abort_requests: vLLM returns what they generated, finish
    "abort") and resumes them on the new weights, so the steps' tokens carry several versions."""
    survivor = vllm_servers[0]
    victim = start_vllm_server(vllm_policy["model"], log_dir=tmp_path)
    try:
        server = ServerClient(survivor.base_url, "", 60)
        server.connect()
        VllmServerApi("").reload(server, str(vllm_policy["model"]), 0, 60)   # back from the run before
        victim.wait_ready()
        config = warm_config(vllm_policy, tmp_path / "run", *EXTERNAL, "trainer.mode=fully_async",
                             "rollout.n_gpus_per_node=1", f"rollout.external.urls=[{survivor.base_url},"
                             f"{victim.base_url}]", "async_training.trigger_parameter_sync_step=1",
                             "async_training.staleness_threshold=0.5", "async_training.partial_rollout=true",
                             "trainer.total_steps=5", "data.train_batch_size=16", "actor.ppo_mini_batch_size=16")
        summary, output = train_killing_one_server(config, victim)
        assert_serves_the_final_policy(survivor.base_url, output, summary["param_version"])
    finally:
        victim.stop()
