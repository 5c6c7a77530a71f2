"""Start or join the Ray cluster a run uses.

    start_ray(config.ray)      # a private local cluster (ray.address empty), or join ray.address

A local cluster is closed to the network and ends with its driver:
- It listens on loopback only. Ray binds its servers (GCS, raylet, object manager, the driver's and every
  worker's) to the node's address, but rewrites a loopback address given to `ray.init` into the machine's
  own; with that rewrite off while the node starts, the node's address is 127.0.0.1. torch.distributed's
  stores bind the address of their group (`train/parallel.py`), and gloo / NCCL connect through the loopback
  interface (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME).
- Every connection carries a token made for this run (Ray's token authentication, on by default for a local
  cluster; the token in RAY_AUTH_TOKEN, in the environment of the run's own processes only): another user of
  the machine, who can reach 127.0.0.1, cannot run a task. RAY_AUTH_MODE=disabled turns it off. Ray reads
  RAY_AUTH_TOKEN before any file, and the run checks after the start that its cluster holds the run's token:
  Ray never falls back to ~/.ray/auth_token, a file shared by every run of the user that Ray creates readable
  by all.
- It ends with the driver, however the driver ends: `cluster_reaper.py` kills what is left (Ray's agents
  would otherwise outlive a killed driver by a minute or more).
- SIGTERM outside a training step (while the run starts or closes) prints one line and exits with status 143
  (Ray's own handlers would exit with 15, or abort with a crash dump); during the steps the training loop's
  StopSignals takes over (stop after the step, with a checkpoint).

Multi-node is Ray's job: start a cluster with `ray start`, then set `ray.address=HOST:PORT` (or `auto`); that
cluster's own settings (RAY_AUTH_MODE, RAY_AUTH_TOKEN, the node addresses) apply: docs/cluster.md.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import ray
from ray._private import ray_constants

from asyncrl.config.schema import RayConfig
from asyncrl.launch import cluster_reaper
from asyncrl.launch.cpu_threads import worker_environment

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
SIGTERM_EXIT_STATUS = 128 + signal.SIGTERM
REAPER: dict[str, subprocess.Popen] = {}   # the running reaper, while this process has a local cluster


def start_ray(config: RayConfig, log_to_driver: bool = True) -> None:
    """Idempotent: a process that already has Ray (a test session, a notebook) keeps its cluster."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_DISABLE_DOCKER_CPU_WARNING", "1")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    exit_on_sigterm()
    if config.address:
        with sigterm_exits():
            ray.init(address=config.address, log_to_driver=log_to_driver,
                     runtime_env={"env_vars": worker_environment()})
        exit_on_sigterm()  # the driver's Ray core replaced the handler
        return
    secure_local_environment()
    # Ray announces the token authentication it turns on for a new local cluster at WARNING level; here it is
    # the run's intended setting (above), so the line would only be noise in every run's output.
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    before = descendant_processes()
    with sigterm_exits(), loopback_node():
        ray.init(num_cpus=config.num_cpus, include_dashboard=False, _node_ip_address=LOOPBACK,
                 log_to_driver=log_to_driver, configure_logging=False)
    exit_on_sigterm()
    node_address = ray.util.get_node_ip_address()
    if node_address != LOOPBACK:
        logger.warning("the local Ray cluster took the address %s, not %s: this Ray version may listen on every "
                       "interface (the cluster still requires its token)", node_address, LOOPBACK)
    start_reaper(descendant_processes() - before)
    try:
        check_run_token()
    except RuntimeError:
        stop_ray()
        raise


def stop_ray() -> None:
    if ray.is_initialized():
        ray.shutdown()
    reaper = REAPER.pop("local", None)
    if reaper is not None:
        reaper.stdin.close()  # a deliberate shutdown: the reaper ends what Ray left behind, then exits
        reaper.wait(timeout=30)


# ---- closed to the network ----------------------------------------------------------------------------------
def secure_local_environment() -> None:
    """Settings every process of a local run inherits; a user's own setting of each is kept.

    RAY_AUTH_MODE is left to Ray: unset, a new local cluster turns token authentication on (this Ray reads the
    mode when it is imported, and turns it on itself only where the variable is unset). The token is made for
    this run, in its processes' environment, rather than Ray's default file shared by every run of the user."""
    if uses_token_authentication() and not os.environ.get("RAY_AUTH_TOKEN"):
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    interface = loopback_interface()
    if interface is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", interface)


def uses_token_authentication() -> bool:
    """Whether a new local cluster of this Ray authenticates by token: RAY_AUTH_MODE unset, or `token` in any
    case (Ray reads the value case-insensitively: a check of the exact spelling would leave RAY_AUTH_MODE=TOKEN
    without the run's token, and Ray would write its own to ~/.ray/auth_token)."""
    mode = os.environ.get("RAY_AUTH_MODE")
    return mode is None or mode.lower() == "token"


def check_run_token() -> None:
    """The started cluster authenticates with the run's token (RAY_AUTH_TOKEN), never a token Ray found or made
    elsewhere: raises RuntimeError otherwise, before any actor of the run starts. A Ray without token
    authentication (an older release, which `ray>=2.40` allows) has no token to check."""
    try:
        from ray._raylet import AuthenticationMode, AuthenticationTokenLoader, get_authentication_mode
    except ImportError:
        return
    if get_authentication_mode() != AuthenticationMode.TOKEN:
        return
    expected = os.environ.get("RAY_AUTH_TOKEN", "")
    if not expected or AuthenticationTokenLoader.instance().get_raw_token() != expected:
        source = "RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token" if not expected else "a token other than RAY_AUTH_TOKEN"
        raise RuntimeError(f"the local Ray cluster authenticates with {source}, not the run's own token in "
                           f"RAY_AUTH_TOKEN: set RAY_AUTH_TOKEN, or RAY_AUTH_MODE=disabled to run without a token")


def loopback_interface() -> Optional[str]:
    names = [name for _, name in socket.if_nameindex()]
    return next((name for name in ("lo", "lo0") if name in names), None)


@contextlib.contextmanager
def loopback_node() -> Iterator[None]:
    """While a node starts, Ray's address lookup answers loopback: the rewrite of 127.0.0.1 into the
    machine's address (`services.resolve_ip_for_localhost`) is off where Ray runs one-machine clusters only."""
    enabled = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = enabled


# ---- SIGTERM outside the training steps ---------------------------------------------------------------------
def terminated(number: int, frame: Any) -> None:
    print(f"stopped by {signal.Signals(number).name} outside a training step (while the run was starting or "
          f"closing); nothing to save, exit status {SIGTERM_EXIT_STATUS}", file=sys.stderr, flush=True)
    raise SystemExit(SIGTERM_EXIT_STATUS)


def exit_on_sigterm() -> None:
    """Install `terminated` (also over the crash-dump handler Ray's core installs for SIGTERM)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, terminated)


@contextlib.contextmanager
def sigterm_exits() -> Iterator[None]:
    """`ray.init` installs a SIGTERM handler of its own that exits with status 15: the same line and status."""
    try:
        yield
    except SystemExit as stop:
        if stop.code == signal.SIGTERM:
            terminated(signal.SIGTERM, None)
        raise


# ---- ends with the driver -----------------------------------------------------------------------------------
def descendant_processes() -> set[tuple[int, int]]:
    """(pid, start time) of this process's descendants; empty where there is no /proc."""
    if not Path("/proc/self/stat").is_file():
        return set()
    me = os.getpid()
    return cluster_reaper.descendants({(me, cluster_reaper.start_time(me) or 0)}) - \
        {(me, cluster_reaper.start_time(me) or 0)}


def start_reaper(roots: set[tuple[int, int]]) -> None:
    """The reaper follows the processes `ray.init` started (and all they start) and outlives this process."""
    start = cluster_reaper.start_time(os.getpid())
    if not roots or start is None:
        return
    REAPER["local"] = subprocess.Popen(
        [sys.executable, "-I", cluster_reaper.__file__, str(os.getpid()), str(start),
         *(f"{pid}:{started}" for pid, started in sorted(roots))],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True)
