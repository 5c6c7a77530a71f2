"""A batch of asynchronous work (an HTTP fan-out, a batch of agent runs or multi-turn trajectories) run in a thread
with an event loop of its own, so the driver's synchronous stages go on while it runs.

    batch = ThreadedBatch("asyncrl-agent-loop", lambda: run_all(...))     # started at once
    value, seconds = batch.join(timeout_s, "agent loop: 8 trajectories", "ray.rpc_timeout_s")
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Awaitable, Callable

from asyncrl.remote import RemoteTimeoutError


class ThreadedBatch:
    """A coroutine run to its end in a thread with an event loop of its own, started at once (the driver's
    stages go on meanwhile); `join` waits at most `timeout_s`, re-raises what the coroutine raised, and names the
    work when it runs past."""

    def __init__(self, name: str, make: Callable[[], Awaitable[Any]]):
        self.started_s, self.started = time.time(), time.monotonic()
        self.outcome: dict[str, Any] = {}
        self.thread = threading.Thread(target=self.work, args=(make,), name=name, daemon=True)
        self.thread.start()

    def work(self, make: Callable[[], Awaitable[Any]]) -> None:
        try:
            self.outcome["value"] = asyncio.run(make())
        except BaseException as error:   # re-raised in the joining thread
            self.outcome["error"] = error
        self.outcome["seconds"] = time.monotonic() - self.started

    def join(self, timeout_s: float, what: str, why: str) -> tuple[Any, float]:
        """(the coroutine's value, its seconds); RemoteTimeoutError "`what` did not finish within ... (`why`)"."""
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            raise RemoteTimeoutError(f"{what} did not finish within {timeout_s:g} s ({why})")
        if "error" in self.outcome:
            raise self.outcome["error"]
        return self.outcome["value"], self.outcome["seconds"]
