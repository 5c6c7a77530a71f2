"""rollout.backend=external end to end: the demo task trained against two `asyncrl serve` processes on loopback
(real uvicorn servers, real HTTP), the weights reloaded from an HF folder after every update, one server killed
with SIGKILL mid-run.

What must hold: the run finishes every step; each step's tokens carry the version of the sync before it; the
killed server is reported (out of rotation, counted as a failure) and the survivor served the rest; every
reload was checked bit for bit on the servers (`rollout.external.verify_weights`: a differing checksum fails
the run), and after the run the survivor's weights equal the trainer's final policy; the policy learned.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import torch

from asyncrl.launch import train
from asyncrl.rollout.external_weights import folder_checksum
from asyncrl.telemetry import read_metrics
from tests.serving.server_process import start_server

NUM_STEPS = 12
KILL_AFTER_STEP = 4


def last_step(output_dir: Path) -> int:
    try:
        return max((row["step"] for row in read_metrics(output_dir / "metrics.jsonl")), default=-1)
    except (FileNotFoundError, ValueError):
        return -1


def test_two_servers_train_the_demo_task_and_the_run_survives_one_killed(make_config, warm_policy, ray_session,
                                                                          tmp_path):
    servers = [start_server(warm_policy["model"], log_dir=tmp_path) for _ in range(2)]
    try:
        for server in servers:
            server.wait_ready()
        survivor, victim = servers
        config = make_config(
            "trainer.mode=one_step_off", "rollout.backend=external",
            f"rollout.external.urls=[{survivor.base_url},{victim.base_url}]", "rollout.external.verify_weights=true",
            "rollout.external.timeout_s=60", "rollout.external.max_retries=2", f"trainer.total_steps={NUM_STEPS}",
            "trainer.dump_rollouts=true", "trainer.test_freq=-1", "data.train_batch_size=16",
            "actor.ppo_mini_batch_size=16", "actor.optim.lr=5e-4")
        output = Path(config.trainer.output_dir)

        def kill_mid_run() -> None:
            deadline = time.monotonic() + 600
            while last_step(output) < KILL_AFTER_STEP and time.monotonic() < deadline:
                time.sleep(0.2)
            victim.kill()

        killer = threading.Thread(target=kill_mid_run, daemon=True)
        killer.start()
        summary = train(config)
        killer.join(timeout=5)

        assert victim.process.returncode is not None   # it was killed while the run went on
        assert summary["steps"] == NUM_STEPS
        rows = [row for row in read_metrics(output / "metrics.jsonl") if "critic/score/mean" in row]
        assert [row["step"] for row in rows] == list(range(1, NUM_STEPS + 1))
        assert [row["param_version"] for row in rows] == list(range(1, NUM_STEPS + 1))
        # one_step_off: step s was generated after sync s - 1, by those weights, whichever server answered.
        for step in range(1, NUM_STEPS + 1):
            lines = (output / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()
            assert len(lines) == 16 * config.rollout.n
            assert {version for line in lines for version in json.loads(line)["versions"]} == {step - 1}, step
        # The dead server is reported: out of rotation from the step after the kill, one failure counted.
        assert rows[0]["faults/replica_failures"] == 0.0
        assert rows[-1]["faults/replica_failures"] == 1.0

        # The survivor reloaded after every update (the final sync included) and serves the trainer's policy.
        num_syncs = summary["param_version"]
        answer = httpx.get(survivor.base_url + "/get_weight_version", timeout=10).json()
        assert answer["weight_version"] == num_syncs
        reloads = [line for line in httpx.get(survivor.base_url + "/metrics", timeout=10).text.splitlines()
                   if line.startswith("asyncrl_weight_reloads_total")]
        assert reloads == [f"asyncrl_weight_reloads_total {num_syncs}"]
        checksum = httpx.get(survivor.base_url + "/weights_checksum", timeout=30).json()
        assert checksum["sha256"] == folder_checksum(output / "policy", torch.float32)
        assert checksum["sha256"] != folder_checksum(warm_policy["model"], torch.float32)   # training moved them

        scores = [row["critic/score/mean"] for row in rows]
        assert np.mean(scores[-3:]) > np.mean(scores[:3]) + 0.1, scores
    finally:
        for server in servers:
            server.stop()


def test_fully_async_with_partial_rollout_trains_against_two_servers_and_survives_one_killed(make_config, ray_session,
                                                                                             warm_policy, tmp_path):
    """The rollouter streams groups to the servers and syncs after every step (each sync aborts the requests in
    flight, POST /abort_request, and resumes them on the new weights); the servers stamp each token with the
    version they reloaded, so the steps' tokens carry several versions."""
    servers = [start_server(warm_policy["model"], log_dir=tmp_path) for _ in range(2)]
    try:
        for server in servers:
            server.wait_ready()
        survivor, victim = servers
        config = make_config(
            "trainer.mode=fully_async", "rollout.n_gpus_per_node=1", "rollout.backend=external",
            f"rollout.external.urls=[{survivor.base_url},{victim.base_url}]", "rollout.external.verify_weights=true",
            "rollout.external.timeout_s=60", "async_training.trigger_parameter_sync_step=1",
            "async_training.staleness_threshold=0.5", "async_training.partial_rollout=true", "trainer.total_steps=5",
            "trainer.dump_rollouts=true", "trainer.test_freq=-1", "data.train_batch_size=16",
            "actor.ppo_mini_batch_size=16", output="fully_async")
        summary, output = train_killing_one_server(config, victim)
        checksum = httpx.get(survivor.base_url + "/weights_checksum", timeout=30).json()
        assert checksum["weight_version"] == summary["param_version"]
        assert checksum["sha256"] == folder_checksum(output / "policy", torch.float32)
    finally:
        for server in servers:
            server.stop()


def train_killing_one_server(config, victim) -> tuple[dict, Path]:
    """Trains `config`'s 5-step fully_async run while `victim` is killed after step 2, and checks what every such
    run must show: all 5 steps trained, one replica failure counted, the steps' tokens stamped with at least 3
    policy versions (syncs abort and resume requests in flight). -> the run's summary and its output folder."""
    output = Path(config.trainer.output_dir)
    killer = threading.Thread(target=lambda: (wait_for_step(output, 2), victim.kill()), daemon=True)
    killer.start()
    summary = train(config)
    killer.join(timeout=5)
    assert victim.process.returncode is not None and summary["steps"] == 5
    rows = [row for row in read_metrics(output / "metrics.jsonl") if "critic/score/mean" in row]
    assert [row["step"] for row in rows] == [1, 2, 3, 4, 5]
    assert rows[-1]["faults/replica_failures"] == 1.0
    versions = [json.loads(line)["versions"] for step in range(1, 6)
                for line in (output / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()]
    assert len({version for sample in versions for version in sample}) >= 3
    return summary, output


def wait_for_step(output: Path, step: int, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while last_step(output) < step and time.monotonic() < deadline:
        time.sleep(0.2)
