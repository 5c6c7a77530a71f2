"""`asyncrl serve` as the tests run it: a real uvicorn process on 127.0.0.1 and a free port, started with the
`asyncrl` command line, ready once GET /health answers, and always stopped (SIGTERM, then SIGKILL).

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

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"asyncrl serve exited with {self.process.returncode}:\n{self.log()[-3000:]}")
            try:
                if httpx.get(self.base_url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"asyncrl serve on port {self.port} not ready within {timeout_s:.0f}s:\n"
                           f"{self.log()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL: the server dies mid-whatever, as a crashed machine would."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


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


@contextlib.contextmanager
def running_server(model_dir: str | Path, *flags: str, log_dir: Path) -> Iterator[ServerProcess]:
    server = start_server(model_dir, *flags, log_dir=log_dir)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
