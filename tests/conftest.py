"""Test-session setup: Triton's interpreter where no GPU is present, one local Ray cluster for every test that
needs Ray actors, and the demo's setup (task data and warm-started model) made once for every test that starts
from it."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

# OpenMP threads that wait for each other sleep instead of spinning. The session's processes (this one, the demo's
# setup, `asyncrl train` subprocesses, Ray workers and scoring processes, which all inherit the setting) share a
# few cores: a thread spinning at a barrier holds a core its partner needs, and on a loaded 2-core machine a
# 2-thread engine decoded 30-100x slower and the demo's SFT ran 6x slower than with sleeping waits. OpenMP reads
# the setting once, when torch loads it: so before torch is imported. An explicit setting is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402  (after the OpenMP setting above)

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


@dataclass(frozen=True)
class DemoSetup:
    """What `asyncrl demo --setup-only --out OUT` made and printed: its cache folder `OUT/setup` (what the demo
    and later demos reuse), the paths it printed, and its whole output."""

    cache: Path
    model: Path
    train_file: Path
    val_file: Path
    output: str


def setup_only(out: Path, task: str, family: str = "qwen2") -> DemoSetup:
    """`asyncrl demo --setup-only --task TASK --model-family FAMILY --out OUT` run as a user runs it (a subprocess
    of the CLI)."""
    command = [sys.executable, "-m", "asyncrl.cli", "demo", "--setup-only", "--task", task, "--model-family", family,
               "--out", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"asyncrl demo --setup-only --task {task} failed:\n{output[-3000:]}"
    printed = {key: Path(value.strip()) for key, _, value in (line.partition(":") for line in result.stdout.splitlines())}
    return DemoSetup(out / "setup", printed["warm-started model"], printed["training prompts"],
                     printed["validation prompts"], output)


@pytest.fixture(scope="session")
def demo_setup(tmp_path_factory) -> DemoSetup:
    """The demo's setup, made once per session by `asyncrl demo --setup-only` run as a user runs it: the
    arithmetic task and the tiny model after its SFT warm start. The e2e runs start from it, so its SFT (a minute
    or more) runs once per session."""
    setup = setup_only(tmp_path_factory.mktemp("demo"), "arithmetic")
    assert "3/4 SFT warm start" in setup.output, setup.output[-3000:]   # made by this command, not found in a cache
    return setup


@pytest.fixture(scope="session")
def tools_setup(demo_setup) -> DemoSetup:
    """The tools demo's setup (its task, and a model warm-started on the sloppy teacher's tool traces: 384 SFT
    steps), made beside the arithmetic one in the same cache."""
    return setup_only(demo_setup.cache.parent, "tools")


@pytest.fixture(scope="session")
def demo_setups(demo_setup, tools_setup) -> Path:
    """The cache of every demo task's setup (`OUT/setup/`), as `asyncrl demo` leaves it after a user's
    `--setup-only` of each task: the docs test's clone starts with it in place."""
    setup_only(demo_setup.cache.parent, "longtail")   # two SFT epochs from the arithmetic warm start
    return demo_setup.cache
