"""One scoring process: spawned, it loads the reward function, then scores one request at a time.

    process = ScoringProcess(context, spec, limits, import_timeout_s=120)   # starts it; it loads meanwhile
    process.connection.poll(timeout); process.finish_loading()              # IDLE, or RewardLoadError
    process.submit([(index, request), ...], timeout_s); process.receive()  # Taken, then one Scored per request;
                                                                            # None when it died

The parent side (`ScoringProcess`) is a handle with a phase, the requests sent and not yet answered, and a
deadline; the child side (`serve`) owns all user code. A process takes several requests at once and answers
each as it is scored, so many cheap samples cost few round trips while each still has its own deadline. Processes are spawned, not forked, so they inherit neither torch nor Ray state, and a hung one can
be killed (a hung Python thread cannot).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import signal
import time
from dataclasses import dataclass
from enum import Enum
from multiprocessing.connection import Connection
from collections import deque
from typing import Iterator

from asyncrl.rewards.limits import ScoringLimits, limit_cpu, limit_memory
from asyncrl.rewards.loader import RewardLoadError, last_line, load_reward_function, resolve
from asyncrl.rewards.protocol import (Failure, RewardFn, RewardRequest, RewardResult, call_reward_function,
                                      to_result)

# Spawned processes re-import the script that started the run: one without an `if __name__ == "__main__":`
# guard starts the run again in every scoring process, which then never serves.
MAIN_GUARD_HINT = ("if a script of yours starts the run, guard it with `if __name__ == \"__main__\":` "
                   "(scoring processes are spawned and re-import the main module)")


@dataclass(frozen=True)
class Loaded:
    """The child's first message when the reward function loaded."""


@dataclass(frozen=True)
class LoadFailed:
    """The child's first message when loading raised: the loader's message, naming the file."""
    message: str


@dataclass(frozen=True)
class Scored:
    """One request's result, with the index the parent gave it."""
    task_index: int
    result: RewardResult


@dataclass(frozen=True)
class Taken:
    """Sent by the child as it takes a chunk of requests, before scoring them. A process dies over some time (its threads
    exit one by one, and its end of the pipe stays open until the last has), so a request sent to a process
    that was already dying is accepted by the pipe; without this the parent could not tell that death from
    one the sample caused, and the sample would score 0 instead of being sent again."""


# ---- the child -----------------------------------------------------------------------------------------------

def serve(spec: str, limits: ScoringLimits, connection: Connection) -> None:
    """The scoring process's main: load the function, then score chunks of (index, request) until None or the
    parent is gone, sending each result as it is ready."""
    # Ctrl-C reaches the whole process group; it is the driver's to handle (it stops the run and closes its
    # scorers), so a scorer must not die of it. SIGINT was blocked across the spawn; ignore it, then unblock.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    limit_memory(limits.max_memory_mb)
    try:
        function = load_reward_function(spec)
    except RewardLoadError as error:
        connection.send(LoadFailed(str(error)))
        return
    except BaseException as error:  # the loader names what it can; this is whatever else a module can raise
        connection.send(LoadFailed(f"reward function {resolve(spec)}: loading it raised {last_line(error)}"))
        return
    connection.send(Loaded())
    # One loop for the life of the process: an async scorer may keep a loop-bound client between calls.
    loop = asyncio.new_event_loop()
    while True:
        try:
            chunk = connection.recv()
        except EOFError:  # the parent died without closing us
            return
        if chunk is None:
            return
        connection.send(Taken())
        for task_index, request in chunk:
            limit_cpu(limits.max_cpu_s)
            connection.send(Scored(task_index, score_one(function, request, loop, limits)))


def score_one(function: RewardFn, request: RewardRequest, loop: asyncio.AbstractEventLoop,
              limits: ScoringLimits) -> RewardResult:
    try:
        value = call_reward_function(function, request)
        if inspect.isawaitable(value):  # `async def compute_score`, or any callable returning an awaitable
            value = loop.run_until_complete(value)
        return to_result(value)
    except MemoryError as error:
        limit = f" (past this scoring process's memory limit, max_memory_mb={limits.max_memory_mb:g})" \
            if limits.max_memory_mb is not None else ""
        return RewardResult.failed(Failure.ERROR, f"{last_line(error)}{limit}")
    except (Exception, SystemExit) as error:  # a user function may raise anything: it scores 0 and is counted
        return RewardResult.failed(Failure.ERROR, last_line(error))


# ---- the parent's handle --------------------------------------------------------------------------------------

class Phase(Enum):
    LOADING = "loading"   # started, the reward function not yet loaded; `deadline` is the import deadline
    IDLE = "idle"
    BUSY = "busy"         # requests `pending` (`taken` once it said so); `deadline` is the first pending's


@contextlib.contextmanager
def sigint_blocked() -> Iterator[None]:
    """SIGINT blocked in this thread, so a process spawned meanwhile starts with it blocked (the mask survives
    fork and exec) and a Ctrl-C while it imports cannot kill it; a SIGINT meanwhile waits, it is not lost."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class ScoringProcess:
    def __init__(self, context, spec: str, limits: ScoringLimits, import_timeout_s: float):
        self.spec = resolve(spec)
        self.limits = limits
        self.import_timeout_s = import_timeout_s
        self.connection, child_end = context.Pipe()
        with sigint_blocked():
            self.process = context.Process(target=serve, args=(spec, limits, child_end), daemon=True)
            self.process.start()
        child_end.close()
        self.phase = Phase.LOADING
        self.deadline = time.monotonic() + import_timeout_s
        self.pending: deque[int] = deque()   # task indexes sent, in the order their results come
        self.taken = False
        self.timeout_s = 0.0

    @property
    def pid(self) -> int:
        return self.process.pid

    def finish_loading(self) -> None:
        """Once the connection is readable or the import deadline has passed: IDLE, or RewardLoadError naming
        the function (the process is then killed)."""
        if not self.connection.poll():
            self.kill()
            raise RewardLoadError(f"reward function {self.spec} did not load within {self.import_timeout_s:g}s "
                                  f"in a scoring process: its module's top level (imports included) must finish "
                                  f"within the import timeout; {MAIN_GUARD_HINT}")
        message = self.receive()
        if isinstance(message, Loaded):
            self.phase = Phase.IDLE
            return
        if isinstance(message, LoadFailed):
            self.kill()
            raise RewardLoadError(message.message)
        exit_description = self.exit_description()  # before `kill`, which would name its own signal
        self.kill()
        raise RewardLoadError(f"reward function {self.spec}: its scoring process {exit_description} while "
                              f"loading it (a reward module must not exit at import); {MAIN_GUARD_HINT}")

    def submit(self, chunk: list[tuple[int, RewardRequest]], timeout_s: float) -> bool:
        """Send (task index, request) pairs, each to be scored within `timeout_s` of the one before; False when
        the process has died (while idle), so the requests never reached it."""
        if not self.process.is_alive():
            return False
        try:
            self.connection.send(chunk)
        except OSError:  # BrokenPipeError, ConnectionResetError: it died after the check
            return False
        self.phase = Phase.BUSY
        self.pending = deque(task_index for task_index, _ in chunk)
        self.taken = False
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        return True

    def receive(self) -> Loaded | LoadFailed | Taken | Scored | None:
        """The next message, or None when the process has died."""
        try:
            message = self.connection.recv()
        except (EOFError, OSError):
            return None
        if isinstance(message, Taken):
            self.taken = True
        elif isinstance(message, Scored):
            self.pending.popleft()
            self.deadline = time.monotonic() + self.timeout_s
            if not self.pending:
                self.phase = Phase.IDLE
        return message

    def died_result(self) -> RewardResult:
        """The result of the sample whose process died while scoring it (the first pending)."""
        description = self.exit_description()
        if self.process.exitcode == -signal.SIGXCPU:
            description += f": it used more than its CPU limit (max_cpu_s={self.limits.max_cpu_s:g}) on this sample"
        return RewardResult.failed(Failure.ERROR, f"scoring process died: it {description}")

    def exit_description(self) -> str:
        self.process.join(timeout=5)
        code = self.process.exitcode
        if code is None:
            return "stopped answering"
        if code < 0:
            return f"was killed by {signal.Signals(-code).name}"
        return f"exited with code {code}"

    def request_exit(self) -> None:
        """Ask it to exit after its current sample; `kill` then stops one that is scoring or hung."""
        try:
            self.connection.send(None)
        except OSError:  # already dead
            pass

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)
        self.connection.close()


def stop_all(processes: list[ScoringProcess], grace_s: float = 2.0) -> None:
    """Ask every process to exit, give them `grace_s` together, then kill the rest."""
    for process in processes:
        process.request_exit()
    deadline = time.monotonic() + grace_s
    for process in processes:
        process.process.join(timeout=max(0.0, deadline - time.monotonic()))
        process.kill()
