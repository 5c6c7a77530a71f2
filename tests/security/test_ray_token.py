"""A local run's Ray token is a secret of the run: only in its processes' environment, never in a file another
user could read. Ray writes a token it makes itself to ~/.ray/auth_token (shared by every run of the user, and
created readable by all); a run makes its own, so no such file appears and the cluster carries the run's token."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

START_A_CLUSTER = """
import json, os
import ray
import psutil
from asyncrl.config.schema import RayConfig
from asyncrl.launch.ray_cluster import start_ray, stop_ray
start_ray(RayConfig(num_cpus=1), log_to_driver=False)
tokens = {}
for process in psutil.Process().children(recursive=True):
    try:
        environment = process.environ()
    except psutil.Error:
        continue
    # A process that rewrote its title (Ray's agents) shows no environment in /proc: it tells nothing.
    if environment:
        tokens[f"{process.name()}:{process.pid}"] = environment.get("RAY_AUTH_TOKEN")
print(json.dumps({"token": os.environ.get("RAY_AUTH_TOKEN", ""), "tokens": tokens,
                  "session": ray._private.worker._global_node.get_session_dir_path()}))
stop_ray()
"""


def files_holding(folder: Path, text: str) -> list[str]:
    found = []
    for path in folder.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink() and text.encode() in path.read_bytes():
                found.append(str(path))
        except OSError:
            pass
    return found


def test_a_local_run_writes_no_token_file_and_its_processes_carry_its_own_token(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    environment = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    done = subprocess.run([sys.executable, "-c", START_A_CLUSTER], env={**environment, "HOME": str(home)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert [str(path) for path in home.rglob("*")] == []     # no ~/.ray/auth_token, nor anything else
    token = report["token"]
    assert len(token) == 64
    assert files_holding(home.parent, token) == []
    assert files_holding(Path(report["session"]), token) == []
    carriers = {name.split(":")[0] for name, carried in report["tokens"].items() if carried == token}
    assert {"gcs_server", "raylet"} <= carriers
    assert {name: carried for name, carried in report["tokens"].items() if carried != token} == {}
