"""The sandboxed child: run as a script (`python -I sandbox_child.py LIMITS_JSON CODE_FILE`), never imported.

It confines itself before running the code: resource limits (CPU seconds, address space, file size, open
files, processes), then an audit hook that refuses, with a PermissionError the code sees, what the
limits cannot express: opening files for writing, or deleting/renaming/creating them, outside its working
directory; creating network sockets; starting processes (unless allowed); loading ctypes (which could
bypass the hook). The parent starts it in a bubblewrap sandbox (`isolation.py`), the OS layer that holds
what the hook cannot see (a process started through `_posixsubprocess`, sqlite, mkfifo, native code), and
kills it on its wall-time and output limits. Standard library only.
"""

import json
import os
import resource
import sys

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
PATH_EVENTS = {"os.remove": 0, "os.rename": 0, "os.rmdir": 0, "os.mkdir": 0, "os.chmod": 0, "os.chown": 0,
               "os.symlink": 1, "os.link": 1, "os.truncate": 0, "os.utime": 0, "shutil.rmtree": 0,
               "shutil.move": 1, "shutil.copyfile": 1}
RENAME_EVENTS = {"os.rename": 1, "shutil.move": 0}   # a second path argument that must stay inside too
PROCESS_EVENTS = {"os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system", "subprocess.Popen",
                  "os.startfile", "pty.spawn"}
NETWORK_FAMILIES = {2, 10}   # AF_INET, AF_INET6


def set_limits(limits):
    megabytes = 1024 * 1024
    for which, value in ((resource.RLIMIT_CPU, limits["cpu_s"]), (resource.RLIMIT_AS, limits["memory_mb"] * megabytes),
                         (resource.RLIMIT_FSIZE, limits["file_size_mb"] * megabytes),
                         (resource.RLIMIT_NOFILE, 64), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(which, (value, value))


def limit_processes(limits):
    """RLIMIT_NPROC counts every process of the user in its user namespace: the parent says how many it counts
    already (bwrap's init in the sandbox; every process of the user outside one), and the limit sits above."""
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["max_processes"] + limits["counted_processes"],) * 2)


def make_hook(workdir, allow_processes):
    inside = workdir.rstrip(os.sep) + os.sep

    def is_inside(path):
        if isinstance(path, int):
            return True          # an already open descriptor
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        full = os.path.realpath(os.path.join(workdir, os.fspath(path)))
        return full == workdir or full.startswith(inside) or full == os.devnull

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            writes = (mode is not None and any(letter in mode for letter in "wax+")) or \
                     (mode is None and isinstance(flags, int) and flags & WRITE_FLAGS)
            if writes and path is not None and not is_inside(path):
                raise PermissionError(f"sandbox: writing outside the working directory is not allowed: {path}")
        elif event in PATH_EVENTS:
            for position in {PATH_EVENTS[event], RENAME_EVENTS.get(event, PATH_EVENTS[event])}:
                if position < len(args) and args[position] is not None and not is_inside(args[position]):
                    raise PermissionError(f"sandbox: {event} outside the working directory is not allowed: "
                                          f"{args[position]}")
        elif event == "socket.__new__" and args[1] in NETWORK_FAMILIES:
            raise PermissionError("sandbox: network access is not allowed")
        elif event in ("socket.connect", "socket.bind", "socket.getaddrinfo"):
            raise PermissionError("sandbox: network access is not allowed")
        elif event in PROCESS_EVENTS and not allow_processes:
            raise PermissionError(f"sandbox: starting processes is not allowed ({event})")
        elif event == "import" and args[0] in ("ctypes", "_ctypes"):
            raise PermissionError("sandbox: ctypes is not allowed")

    return hook


def main():
    limits = json.loads(sys.argv[1])
    code_path = sys.argv[2]
    workdir = os.path.realpath(os.path.dirname(code_path))
    with open(code_path) as handle:
        code = handle.read()
    os.chdir(workdir)
    set_limits(limits)
    limit_processes(limits)
    sys.addaudithook(make_hook(workdir, limits["max_processes"] > 1))
    del sys.argv[1:]
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    exec(compile(code, "<tool code>", "exec"), namespace)


if __name__ == "__main__":
    main()
