"""A local run's Ray token is a secret of the run: only in its processes' environment, never in a file another
user could read. Ray writes a token it makes itself to ~/.ray/auth_token (shared by every run of the user, and
created readable by all); a run makes its own (whatever the case of RAY_AUTH_MODE=token), so no such file appears
and the cluster carries the run's token; a cluster that took a token from anywhere else is refused at its start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl.launch.ray_cluster import uses_token_authentication

START_A_CLUSTER = """
import json, os, sys
import ray
import psutil
from ray._raylet import AuthenticationTokenLoader
from asyncrl.config.schema import RayConfig
from asyncrl.launch import ray_cluster
from asyncrl.launch.ray_cluster import start_ray, stop_ray
if sys.argv[1:] == ["--without-the-run-token"]:   # as if the run made no token of its own
    ray_cluster.uses_token_authentication = lambda: False
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
                  "loaded": AuthenticationTokenLoader.instance().get_raw_token(),
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


def start_a_cluster(home: Path, *args: str, **variables: str) -> subprocess.CompletedProcess:
    """A local run's cluster started in a process of its own, with HOME=`home`, no RAY_* setting but `variables`."""
    home.mkdir()
    environment = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    return subprocess.run([sys.executable, "-c", START_A_CLUSTER, *args],
                          env={**environment, **variables, "HOME": str(home)}, capture_output=True, text=True,
                          timeout=300)


def test_token_authentication_follows_ray_reading_of_the_mode(monkeypatch):
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    assert uses_token_authentication()                       # unset: Ray turns it on for a new local cluster
    for mode, expected in (("token", True), ("TOKEN", True), ("Token", True), ("disabled", False), ("", False)):
        monkeypatch.setenv("RAY_AUTH_MODE", mode)
        assert uses_token_authentication() == expected, mode


@pytest.mark.parametrize("mode", [None, "TOKEN"], ids=["mode-unset", "mode-TOKEN"])
def test_a_local_run_writes_no_token_file_and_its_processes_carry_its_own_token(tmp_path, mode):
    home = tmp_path / "home"
    done = start_a_cluster(home, **({} if mode is None else {"RAY_AUTH_MODE": mode}))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert [str(path) for path in home.rglob("*")] == []     # no ~/.ray/auth_token, nor anything else
    token = report["token"]
    assert len(token) == 64 and report["loaded"] == token   # the token Ray authenticates with is the run's
    assert files_holding(home.parent, token) == []
    assert files_holding(Path(report["session"]), token) == []
    carriers = {name.split(":")[0] for name, carried in report["tokens"].items() if carried == token}
    assert {"gcs_server", "raylet"} <= carriers
    assert {name: carried for name, carried in report["tokens"].items() if carried != token} == {}


def test_a_cluster_on_a_token_from_elsewhere_is_refused_at_its_start(tmp_path):
    """Without the run's token Ray makes its own in ~/.ray/auth_token, readable by every user: the start fails,
    naming where the token came from, before any actor of the run exists."""
    home = tmp_path / "home"
    done = start_a_cluster(home, "--without-the-run-token")
    assert done.returncode != 0
    assert "not the run's own token in RAY_AUTH_TOKEN" in done.stderr, done.stderr[-3000:]
    assert "~/.ray/auth_token" in done.stderr
