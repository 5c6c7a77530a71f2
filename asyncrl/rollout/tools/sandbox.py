"""Run untrusted Python in a confined subprocess: the code interpreter tool's engine.

    limits = SandboxLimits(wall_s=5, cpu_s=5, memory_mb=512, max_output_bytes=8192)
    run = await run_python("print(2 ** 10)", limits)      # SandboxRun(exit_code=0, stdout='1024\\n', ...)

Each run gets its own temporary directory (deleted afterwards) and a fresh interpreter (`python -I`: no user
site, no environment variables read) in a session of its own. Limits, and who enforces them:

| limit | enforced by |
|---|---|
| wall time | the parent kills the process group (`timed_out`) |
| CPU time, memory (address space), file size, open files | rlimits set by the child before the code runs |
| processes | the audit hook refuses to start any (`max_processes` 1, the default); above 1, RLIMIT_NPROC, which the kernel does not apply to root: there the wall-time kill of the process group bounds a fork bomb |
| output size | the parent stops reading past `max_output_bytes` and kills the group (`output_truncated`) |
| network | a network namespace with no interface (`unshare --net`, when the machine allows it) and the hook |
| writes outside its directory | the audit hook |

An audit hook is not a security boundary against code that sets out to escape (ctypes is refused, yet a
determined exploit of the interpreter could pass it): use a container or a VM for adversarial code. It does
stop the accidents a model's code makes: an infinite loop, a fork bomb, a huge allocation or output, a
network call, a write outside its directory. Each ends as a result the model reads, never as a crash.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

CHILD_SCRIPT = Path(__file__).with_name("sandbox_child.py")
READ_CHUNK = 4096


@dataclass(frozen=True)
class SandboxLimits:
    wall_s: float = 10.0
    cpu_s: int = 10
    memory_mb: int = 512
    file_size_mb: int = 16
    max_processes: int = 1
    max_output_bytes: int = 16384

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value <= 0:
                raise ValueError(f"sandbox limit {name} must be positive, got {value}")


@dataclass(frozen=True)
class SandboxRun:
    exit_code: int                 # negative: killed by that signal
    stdout: str
    stderr: str
    timed_out: bool = False
    output_truncated: bool = False
    network_isolated: bool = False   # ran in a network namespace of its own

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.output_truncated


@functools.lru_cache(maxsize=1)
def network_namespace_prefix() -> tuple[str, ...]:
    """The `unshare` command that gives a child a network namespace without interfaces on this machine, or ()
    where none works (no unshare, unprivileged user namespaces disabled): the audit hook still refuses sockets."""
    if shutil.which("unshare") is None:
        return ()
    # A user namespace first: there even root lacks the capabilities that lift RLIMIT_NPROC, and the
    # process count starts from zero.
    for prefix in (("unshare", "--user", "--map-root-user", "--net"), ("unshare", "--net")):
        try:
            done = subprocess.run([*prefix, "true"], capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return prefix
    return ()


def user_processes() -> int:
    """Processes this user runs now: RLIMIT_NPROC counts them all, so a non-root child's limit sits above it."""
    uid = os.getuid()
    try:
        return sum(1 for entry in os.scandir("/proc") if entry.name.isdigit() and entry.stat().st_uid == uid)
    except OSError:
        return 4096


async def read_capped(stream: asyncio.StreamReader, cap: int, overflow: asyncio.Event) -> bytes:
    """The first `cap` bytes of `stream`; past them, sets `overflow` and discards the rest until the end of the
    stream. Reading goes on because asyncio pauses a pipe whose buffer is full: a paused pipe never sees the
    end of the stream after the kill, and `process.wait()` waits for both the exit and the closed pipes."""
    data = bytearray()
    while chunk := await stream.read(READ_CHUNK):
        if len(data) <= cap:
            data += chunk
        if len(data) > cap:
            overflow.set()
    return bytes(data[:cap])


def kill_group(process: asyncio.subprocess.Process) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> SandboxRun:
    """Runs `code` confined (see the module doc) and returns what it printed; never raises for what the code
    does. The working directory is created and deleted here."""
    workdir = Path(tempfile.mkdtemp(prefix="asyncrl-sandbox-"))
    try:
        code_path = workdir / "main.py"
        code_path.write_text(code)
        prefix = network_namespace_prefix()
        child_limits = {**asdict(limits), "user_processes": user_processes(), "own_user_namespace": "--user" in prefix}
        process = await asyncio.create_subprocess_exec(
            *prefix, sys.executable, "-I", str(CHILD_SCRIPT), json.dumps(child_limits), str(code_path),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            cwd=workdir, start_new_session=True, env={"PATH": "/usr/bin:/bin", "PYTHONIOENCODING": "utf-8"})
        overflow = asyncio.Event()
        readers = asyncio.gather(read_capped(process.stdout, limits.max_output_bytes, overflow),
                                 read_capped(process.stderr, limits.max_output_bytes, overflow))
        overflow_wait = asyncio.ensure_future(overflow.wait())
        exit_wait = asyncio.ensure_future(process.wait())
        try:
            await asyncio.wait({exit_wait, overflow_wait}, timeout=limits.wall_s, return_when=asyncio.FIRST_COMPLETED)
            timed_out = not exit_wait.done() and not overflow.is_set()
        finally:
            kill_group(process)   # also reaps any child it left behind
            overflow_wait.cancel()
        exit_code = await exit_wait
        stdout, stderr = await readers
        return SandboxRun(exit_code, stdout.decode("utf-8", "replace"), stderr.decode("utf-8", "replace"),
                          timed_out, overflow.is_set(), bool(prefix))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
