"""The python tool's sandbox against code that sets out to escape, run exactly as the agent loop runs a call
(`run_python` with the tool's limits): each case tries to change something outside its working directory, read
a secret, reach another process or the network, or leave a process behind, and the test looks from outside.

Most payloads first get around the audit hook (`subprocess` started with its audit call silenced: the process
starts through `_posixsubprocess`, which raises no audit event), so what holds them is the OS layer (bubblewrap).
`test_each_payload_escapes_without_the_os_layer` runs the same payloads with that layer removed
(`unsafe_without_os_isolation`) and sees each one get out: the payloads are live, and the isolated tests fail
if the isolation goes.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from asyncrl.rollout.tools import SandboxLimits, run_python, sandbox
from asyncrl.rollout.tools.isolation import isolation_problem

LIMITS = SandboxLimits(wall_s=4, cpu_s=3, memory_mb=512, max_output_bytes=8192)
SECRET = "asyncrl-test-secret-7d1f"
ORIGINAL = "original line\n"
# A marker no other process's command line holds: the processes a payload leaves behind are found by it.
LINGER_S = "3599.713"

BYPASS = '''
import subprocess, sys, types

class Quiet(types.ModuleType):
    def __getattr__(self, name):
        return getattr(sys, name)

quiet = Quiet("sys")
quiet.audit = lambda *args: None
subprocess.sys = quiet                 # subprocess's own audit call now reaches no hook

def sh(command):
    done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True)
    print("sh:", done.returncode, done.stdout, done.stderr)

def fresh_python(code):                # a new interpreter: no audit hook at all, ctypes importable
    sh(f"{sys.executable} -c '{code}'")
'''


@dataclass
class Surroundings:
    """What the tool code must not reach: a folder outside its working directory (not under /tmp, which the
    sandbox replaces by a tmpfs of its own) with a file and a 0600 secret, a process of the same user holding a
    secret in its environment, and a TCP listener on 127.0.0.1."""
    outside: Path
    helper: subprocess.Popen
    listener: socket.socket

    def files(self) -> dict[str, bytes]:
        return {path.name: path.read_bytes() if path.is_file() and not stat.S_ISFIFO(path.lstat().st_mode)
                else b"<not a regular file>" for path in sorted(self.outside.iterdir())}

    def accepted_connection(self) -> bool:
        self.listener.setblocking(False)
        try:
            self.listener.accept()[0].close()
            return True
        except BlockingIOError:
            return False


@pytest.fixture
def surroundings():
    outside = Path(tempfile.mkdtemp(prefix="asyncrl-sandbox-outside-", dir=writable_folder_outside_tmp()))
    (outside / "existing.txt").write_text(ORIGINAL)
    secret = outside / "secret.txt"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    helper = subprocess.Popen(["sleep", "600"], env={"PATH": "/usr/bin:/bin", "RUN_TOKEN": SECRET})
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        yield Surroundings(outside, helper, listener)
    finally:
        listener.close()
        helper.kill()
        helper.wait()
        kill_lingering()
        for path in outside.iterdir():
            path.unlink()
        outside.rmdir()


def writable_folder_outside_tmp() -> str:
    for folder in ("/var/tmp", str(Path.home()), os.getcwd()):
        if os.access(folder, os.W_OK):
            return folder
    pytest.fail("no writable folder outside /tmp to plant the files the sandbox must not reach")


def lingering_pids() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and LINGER_S.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def kill_lingering() -> None:
    for pid in lingering_pids():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# name -> the code, formatted with the surroundings: {out} the folder outside, {helper} the other process's PID,
# {port} the local listener's, {linger} the lingering processes' marker.
PAYLOADS = {
    "shell_writes_and_appends": 'sh("echo escaped > {out}/new.txt; echo appended >> {out}/existing.txt")',
    "sqlite_creates_a_database": 'import sqlite3\nsqlite3.connect("{out}/db.sqlite").execute("create table t(x)")',
    "mkfifo": 'import os\nos.mkfifo("{out}/fifo")',
    "ctypes_in_a_fresh_interpreter": ('fresh_python("import ctypes; '
                                      'ctypes.CDLL(None).creat(b\\"{out}/c.txt\\", 0o644)")'),
    "symlink_out_of_the_workdir": 'import os\nos.symlink("{out}/existing.txt", "link")\nsh("echo via-link > link")',
    "hard_link_out_of_the_workdir": 'sh("ln {out}/existing.txt hard && echo via-hardlink >> hard")',
    "read_a_0600_secret": 'print(open("{out}/secret.txt").read())',
    "read_another_process_environment": 'sh("cat /proc/{helper}/environ")',
    "read_another_process_memory": 'sh("cat /proc/{helper}/maps; head -c 64 /proc/{helper}/mem")',
    "signal_another_process": 'import os\nos.kill({helper}, 9)',
    "ptrace_another_process": ('fresh_python("import ctypes; '
                               'print(\\"ptrace\\", ctypes.CDLL(None).ptrace(16, {helper}, 0, 0))")'),
    "background_processes_outlive_the_call": 'sh("sleep {linger} & setsid sleep {linger} & exit 0")',
    "background_processes_outlive_a_timeout": 'sh("setsid sleep {linger} &")\nwhile True:\n    pass',
    "network_to_a_local_server": ('fresh_python("import socket; socket.create_connection((\\"127.0.0.1\\", {port}), '
                                  'timeout=2); print(\\"connected\\")")'),
}


def payload(name: str, where: Surroundings) -> str:
    return PAYLOADS[name].format(out=where.outside, helper=where.helper.pid, port=where.listener.getsockname()[1],
                                 linger=LINGER_S)


def escapes(where: Surroundings, stdout: str) -> list[str]:
    """What of the surroundings the payload changed or reached, seen from outside (its output only where the
    thing read is what it printed)."""
    found = []
    if where.files() != {"existing.txt": ORIGINAL.encode(), "secret.txt": SECRET.encode()}:
        found.append(f"files outside changed: {where.files()}")
    if where.helper.poll() is not None:
        found.append("the other process was killed")
    if SECRET in stdout:
        found.append("a secret was read")
    if "ptrace 0" in stdout:
        found.append("the other process was ptrace-attached")
    if "[stack]" in stdout:
        found.append("another process's memory map was read")
    if lingering_pids():
        found.append(f"processes outlived the call: {lingering_pids()}")
    if where.accepted_connection() or "connected" in stdout.replace("not connected", ""):
        found.append("the network reached a local server")
    return found


def run(code: str, isolated: bool):
    return asyncio.run(run_python(BYPASS + code, LIMITS, isolated))


def test_the_os_isolation_is_present():
    """The suite runs the escape cases against the real sandbox: its absence is a failure, never a skip
    (requirements-cpu.txt installs bwrap through asyncrl[agents])."""
    assert isolation_problem() is None


def test_an_interpreter_installed_under_tmp_runs_in_the_sandbox(tmp_path_factory):
    """A virtual environment under /tmp (as CI and many users make one) is bound after the sandbox's private
    /tmp, not hidden under it: the sandbox probe from that interpreter starts and prints."""
    venv = Path(tempfile.mkdtemp(prefix="asyncrl-venv-", dir="/tmp"))
    try:
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
                       check=True, timeout=120)
        paths = [str(Path(__file__).resolve().parents[2]), *sys.path[1:]]
        probe = ("import sys; sys.path[:0] = %r; from asyncrl.rollout.tools.isolation import isolation_problem; "
                 "print(sys.prefix); print(isolation_problem())" % paths)
        done = subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True,
                              timeout=120, check=True)
        assert done.stdout.split("\n")[:2] == [str(venv), "None"], done.stdout + done.stderr
    finally:
        subprocess.run(["rm", "-rf", str(venv)], check=False)


@pytest.mark.parametrize("name", list(PAYLOADS))
def test_a_payload_changes_nothing_outside_and_leaves_nothing_behind(name, surroundings):
    result = run(payload(name, surroundings), isolated=True)
    assert result.os_isolated
    assert escapes(surroundings, result.stdout + result.stderr) == []


@pytest.mark.parametrize("name", list(PAYLOADS))
def test_each_payload_escapes_without_the_os_layer(name, surroundings, monkeypatch):
    """The planted removal: with the audit hook and limits alone (`unsafe_without_os_isolation` on a machine
    where `unshare` cannot make namespaces either), the same payload gets out, so the test above fails if the
    isolation goes."""
    monkeypatch.setattr(sandbox, "network_namespace_prefix", lambda: ())
    result = run(payload(name, surroundings), isolated=False)
    assert not result.os_isolated and not result.network_isolated
    assert escapes(surroundings, result.stdout + result.stderr) != []
