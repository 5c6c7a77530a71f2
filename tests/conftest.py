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
    """A local Ray cluster (2 CPUs, no dashboard) shared by the whole test session, started as a run starts
    its own: listening on 127.0.0.1 only, a token on every connection, ended with the session."""
    import ray

    from asyncrl.config.schema import RayConfig
    from asyncrl.launch.ray_cluster import start_ray, stop_ray
    start_ray(RayConfig(num_cpus=2), log_to_driver=False)
    yield ray
    stop_ray()
