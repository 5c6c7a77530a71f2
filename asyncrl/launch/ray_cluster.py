"""Start or join the Ray cluster a run uses.

    start_ray(config.ray)      # local cluster bound to 127.0.0.1 without dashboard, or join ray.address

Multi-node is Ray's job: start a cluster with `ray start`, then set `ray.address=HOST:PORT` (or `auto`).
"""

from __future__ import annotations

import os

import ray

from asyncrl.config.schema import RayConfig


def start_ray(config: RayConfig) -> None:
    """Idempotent: a process that already has Ray (a test session, a notebook) keeps its cluster."""
    if ray.is_initialized():
        return
    # A local single-user cluster needs no token; a real cluster's own setting wins when it is set.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_DISABLE_DOCKER_CPU_WARNING", "1")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if config.address:
        ray.init(address=config.address, log_to_driver=True)
        return
    ray.init(num_cpus=config.num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=True, configure_logging=False)


def stop_ray() -> None:
    if ray.is_initialized():
        ray.shutdown()
