"""Scale-out through Ray: a two-node cluster started on this machine (`ray start --head` plus a second
`ray start --address`), each node offering its own custom resource; a fully-async run joins it with
`ray.address`, its trainer on one node and its rollout on the other, and trains across them."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from asyncrl.config import dump_config


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ray_env() -> dict[str, str]:
    return {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_DISABLE_DOCKER_CPU_WARNING": "1", "PYTHONUNBUFFERED": "1"}


def start_node(*arguments: str) -> subprocess.Popen:
    """`ray start --block` in its own process group: stopping it stops this node only (`ray stop` would
    also stop the test session's own cluster)."""
    ray = str(Path(sys.executable).parent / "ray")
    return subprocess.Popen([ray, "start", "--block", "--node-ip-address=127.0.0.1", "--num-cpus=1", *arguments],
                            env=ray_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def cluster_nodes(address: str) -> list[dict]:
    """The live nodes of the cluster at `address` with their resources, read by a separate driver."""
    script = ("import json, ray; ray.init(address=%r, log_to_driver=False); "
              "print(json.dumps([[n['NodeID'], n['Resources']] for n in ray.nodes() if n['Alive']]))" % address)
    output = subprocess.run([sys.executable, "-c", script], env=ray_env(), capture_output=True, text=True,
                            timeout=120)
    assert output.returncode == 0, output.stderr[-2000:]
    return json.loads(output.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def two_node_cluster():
    temp_dir = tempfile.mkdtemp(prefix="ar", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    address = f"127.0.0.1:{free_port()}"
    nodes = [start_node("--head", f"--port={address.split(':')[1]}", f"--temp-dir={temp_dir}",
                        "--include-dashboard=false", '--resources={"trainer_node": 1}')]
    try:
        deadline = time.monotonic() + 120
        while True:  # the second node needs the head's GCS up
            try:
                cluster_nodes(address)
                break
            except AssertionError:
                assert nodes[0].poll() is None, nodes[0].stderr.read()[-2000:]
                assert time.monotonic() < deadline, "the head node did not come up"
                time.sleep(1)
        nodes.append(start_node(f"--address={address}", '--resources={"rollout_node": 1}'))
        while len(cluster_nodes(address)) < 2:
            assert nodes[1].poll() is None, nodes[1].stderr.read()[-2000:]
            assert time.monotonic() < deadline, "the second node did not join"
            time.sleep(1)
        yield address
    finally:
        for node in reversed(nodes):
            # SIGTERM to `ray start` alone: it drains the node through the GCS, then stops the node's processes.
            # Sent to the whole group, the GCS dies first and the head's drain waits 30 s for it.
            node.send_signal(signal.SIGTERM)
            try:
                node.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
            try:  # whatever of the node's processes is left
                os.killpg(node.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_fully_async_run_places_trainer_and_rollout_on_different_nodes_and_trains(make_config, two_node_cluster,
                                                                                 tmp_path):
    config = make_config(f"ray.address={two_node_cluster}", "ray.trainer_node_resource=trainer_node",
                         "ray.rollout_node_resource=rollout_node", "trainer.mode=fully_async",
                         "rollout.n_gpus_per_node=1", "trainer.total_steps=4", "data.train_batch_size=8",
                         "actor.ppo_mini_batch_size=8", "async_training.trigger_parameter_sync_step=1",
                         "trainer.val_before_train=false", "data.val_files=[]", "trainer.dump_rollouts=true")
    config_path = tmp_path / "run.yaml"
    config_path.write_text(dump_config(config))
    run = subprocess.run([sys.executable, "-m", "asyncrl.cli", "train", str(config_path)], env=ray_env(),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((Path(config.trainer.output_dir) / "summary.json").read_text())
    assert summary["steps"] == 4
    assert summary["param_version"] == 4  # a weight sync crossed the nodes after every step
    node_resources = dict((node_id, resources) for node_id, resources in cluster_nodes(two_node_cluster))
    trainer_node = summary["placement"]["trainer/rank0"]["node_id"]
    rollout_node = summary["placement"]["rollout/replica0"]["node_id"]
    assert trainer_node != rollout_node
    assert "trainer_node" in node_resources[trainer_node] and "rollout_node" in node_resources[rollout_node]
    rollouts = [json.loads(line) for line in (Path(config.trainer.output_dir) / "rollouts" / "step_4.jsonl")
                .read_text().splitlines()]
    # Tokens of the last step were generated on the rollout node after syncs from the trainer node.
    assert max(max(row["versions"]) for row in rollouts) >= 2


def test_a_node_resource_no_node_offers_is_a_clear_error(make_config, two_node_cluster, tmp_path):
    config = make_config(f"ray.address={two_node_cluster}", "ray.rollout_node_resource=gpu_node_typo",
                         "trainer.mode=one_step_off", "rollout.n_gpus_per_node=1")
    config_path = tmp_path / "run.yaml"
    config_path.write_text(dump_config(config))
    run = subprocess.run([sys.executable, "-m", "asyncrl.cli", "train", str(config_path)], env=ray_env(),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 1
    assert "ray.rollout_node_resource='gpu_node_typo': no node of the Ray cluster offers this resource" in run.stderr
    assert "Traceback" not in run.stderr
