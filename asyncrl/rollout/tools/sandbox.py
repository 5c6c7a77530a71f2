"""Run untrusted Python in a confined subprocess: the code interpreter tool's engine.

    limits = SandboxLimits(wall_s=5, cpu_s=5, memory_mb=512, max_output_bytes=8192)
    run = await run_python("print(2 ** 10)", limits)      # SandboxRun(exit_code=0, stdout='1024\\n', ...)

Each run gets its own temporary directory (deleted afterwards) and a fresh interpreter (`python -I`: no user
site, no environment variables read) in a bubblewrap sandbox (`isolation.py`): a root of its own where only the
interpreter's files exist, read-only, and its directory is the one writable place; its own PID, network, IPC
and user namespaces. Two layers, and who enforces what:

| what | OS layer (bwrap) | second layer |
|---|---|---|
| writes outside its directory (open, sqlite, mkfifo, a shell, native code) | read-only or absent | hook: Python's |
| reading the machine's files (the run's outputs, checkpoints, tokens, home) | absent from its root | - |
| network | a network namespace with a down loopback | hook: sockets |
| other processes (signals, ptrace, /proc/PID/environ or mem) | a PID namespace: it sees only its own | - |
| processes outliving the call | the PID namespace dies with the call (`--die-with-parent`) | - |
| starting processes | RLIMIT_NPROC (not for root: the wall time bounds a fork bomb) | hook (`max_processes` 1) |
| CPU time, memory (address space), file size, open files | rlimits set by the child before the code runs | - |
| wall time | the parent kills the sandbox (`timed_out`) | - |
| output size | the parent stops reading past `max_output_bytes` and kills the sandbox (`output_truncated`) | - |

`isolated=False` (the python tool's `unsafe_without_os_isolation: true`) drops the OS layer: the audit hook, the
limits and a network namespace (`unshare --net`, where it works) remain, and code that sets out to escape gets
out (a process started through `_posixsubprocess` raises no audit event). Not a security boundary.
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

from asyncrl.rollout.tools.isolation import bwrap_argv, bwrap_path

CHILD_SCRIPT = Path(__file__).with_name("sandbox_child.py")
READ_CHUNK = 4096
SIGNAL_EXIT_BASE = 128
EXIT_WAIT_S = 10.0    # after the kill, for the sandbox's processes to be gone


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
    os_isolated: bool = False        # ran in the bubblewrap sandbox

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


def kill_pid(pid: int | None) -> None:
    if pid is not None:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


async def read_info(fd: int) -> int | None:
    """The PID (on this machine) of the sandbox's first process, which bwrap writes as JSON to --info-fd, read
    without a thread (many calls may start at once)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                                os.fdopen(fd, "rb", buffering=0))
    try:
        return int(json.loads(await reader.read())["child-pid"])
    except (ValueError, KeyError, TypeError):
        return None
    finally:
        transport.close()


@dataclass(frozen=True)
class Command:
    argv: list[str]
    pass_fds: tuple[int, ...]
    info_fd: int | None          # read end of bwrap's --info-fd
    counted_processes: int       # processes RLIMIT_NPROC already counts when the code starts
    network_isolated: bool


def sandbox_command(workdir: Path, isolated: bool) -> Command:
    child = [sys.executable, "-I", str(CHILD_SCRIPT)]
    if isolated:
        bwrap = bwrap_path()
        if bwrap is None:
            raise RuntimeError("bubblewrap (bwrap) is not installed; the python tool checks this when it is built")
        read_end, write_end = os.pipe()
        argv = [*bwrap_argv(bwrap, str(workdir), [str(CHILD_SCRIPT)], info_fd=write_end), *child]
        # In its own user namespace the count starts at bwrap's init process and the child.
        return Command(argv, (write_end,), read_end, 1, True)
    prefix = network_namespace_prefix()
    counted = 0 if "--user" in prefix else user_processes()
    return Command([*prefix, *child], (), None, counted, bool(prefix))


async def run_python(code: str, limits: SandboxLimits = SandboxLimits(), isolated: bool = True) -> SandboxRun:
    """Runs `code` confined (see the module doc) and returns what it printed; never raises for what the code
    does. The working directory is created and deleted here; when this returns, no process of the run is
    left."""
    workdir = Path(os.path.realpath(tempfile.mkdtemp(prefix="asyncrl-sandbox-")))
    try:
        code_path = workdir / "main.py"
        code_path.write_text(code)
        command = sandbox_command(workdir, isolated)
        child_limits = {**asdict(limits), "counted_processes": command.counted_processes}
        try:
            process = await asyncio.create_subprocess_exec(
                *command.argv, json.dumps(child_limits), str(code_path), pass_fds=command.pass_fds,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                cwd=workdir, start_new_session=True, env={"PATH": "/usr/bin:/bin", "PYTHONIOENCODING": "utf-8"})
        except BaseException:
            if command.info_fd is not None:
                os.close(command.info_fd)
            raise
        finally:
            for fd in command.pass_fds:
                os.close(fd)
        sandbox_pid = asyncio.ensure_future(read_info(command.info_fd)) if command.info_fd is not None else None
        overflow = asyncio.Event()
        readers = asyncio.gather(read_capped(process.stdout, limits.max_output_bytes, overflow),
                                 read_capped(process.stderr, limits.max_output_bytes, overflow))
        overflow_wait = asyncio.ensure_future(overflow.wait())
        exit_wait = asyncio.ensure_future(process.wait())
        try:
            await asyncio.wait({exit_wait, overflow_wait}, timeout=limits.wall_s, return_when=asyncio.FIRST_COMPLETED)
            timed_out = not exit_wait.done() and not overflow.is_set()
        finally:
            overflow_wait.cancel()
            await stop(process, exit_wait, sandbox_pid)
            if sandbox_pid is not None:
                sandbox_pid.cancel()   # done by now unless bwrap died before writing it
        exit_code = await exit_wait
        if isolated and exit_code > SIGNAL_EXIT_BASE:   # bwrap reports its child's death by signal N as 128 + N
            exit_code = SIGNAL_EXIT_BASE - exit_code
        stdout, stderr = await readers
        return SandboxRun(exit_code, stdout.decode("utf-8", "replace"), stderr.decode("utf-8", "replace"),
                          timed_out, overflow.is_set(), command.network_isolated, isolated)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


async def stop(process: asyncio.subprocess.Process, exit_wait: asyncio.Future, sandbox_pid: asyncio.Future | None):
    """Kills whatever of the run is still alive. In the sandbox, killing its first process makes the kernel kill
    every process of its PID namespace, and bwrap exits once they are gone, so waiting for bwrap waits for all
    of them. Then the process group, which is all there is without the sandbox (where a process can leave it),
    or bwrap itself where it had not said its first process's PID yet (`--die-with-parent` ends the rest)."""
    if sandbox_pid is not None and sandbox_pid.done() and not exit_wait.done():
        # Once bwrap has exited, its first process is reaped and the PID may be another process's.
        kill_pid(sandbox_pid.result())
        try:
            await asyncio.wait_for(asyncio.shield(exit_wait), EXIT_WAIT_S)
        except asyncio.TimeoutError:
            pass
    kill_group(process)
