"""Test-session setup: Triton's interpreter where no GPU is present, and one local Ray cluster for every test
that needs Ray actors."""

from __future__ import annotations

import os

import pytest
import torch

# The Triton kernels' tests run their kernels on CPU tensors through the interpreter, which Triton reads when a
# kernel is decorated: set here, before any test module imports a kernel. An explicit setting is kept.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray cluster (2 CPUs, bound to 127.0.0.1, no dashboard) shared by the whole test session."""
    import ray
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_DISABLE_DOCKER_CPU_WARNING", "1")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", configure_logging=False,
                 log_to_driver=False)
    yield ray
    ray.shutdown()
