"""A user's agent run in an event loop of its own, on a thread of its own, watched from the caller's loop.

    run = AgentThread(lambda: agent(client, record), name="g3/0")
    returned = await run.result(timeout_s)       # AgentTimeout past timeout_s, whatever the agent does

An agent is user code: one that blocks its event loop (a synchronous `time.sleep`, a blocking HTTP call, a
tight loop) would, on the run's own loop, stop everything that loop serves (the recording endpoint its requests
go to, the other agents, `asyncio.wait_for`'s own timer) and hang the run without a word. On a loop of its own
it can only stop itself: the caller's loop keeps the time, and past `timeout_s` the run is abandoned (its task
cancelled, which takes effect once its loop runs again) and reported, saying whether its loop was blocked. A
thread cannot be killed: a blocked agent's thread lives on (a daemon) until its blocking call returns; its
recording session is closed by then, so nothing it sends later trains.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable
from typing import Any

BLOCKED_PROBE_S = 1.0   # an event loop that is not blocked runs a callback well within this


class AgentTimeout(Exception):
    """The agent ran past its time limit; the message says whether it blocked its event loop."""


class AgentThread:
    def __init__(self, start: Callable[[], Awaitable[Any]], name: str):
        self.start = start
        self.outcome: concurrent.futures.Future = concurrent.futures.Future()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task | None = None
        self.ready = threading.Event()
        threading.Thread(target=self.main, name=f"asyncrl-agent-{name}", daemon=True).start()

    def main(self) -> None:
        try:
            self.outcome.set_result(asyncio.run(self.run()))
        except BaseException as error:   # the agent's own failure, reported to the caller as it raised it
            self.outcome.set_exception(error)

    async def run(self) -> Any:
        self.loop = asyncio.get_running_loop()
        self.task = asyncio.ensure_future(self.start())
        self.ready.set()
        return await self.task

    async def result(self, timeout_s: float) -> Any:
        try:
            # Shielded: the caller's timeout must not cancel the future the agent's thread settles.
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(self.outcome)), timeout_s)
        except asyncio.TimeoutError:
            blocked = not await asyncio.to_thread(self.responds)
            self.cancel()
            detail = (" and blocked its event loop (a synchronous call in async code: time.sleep, a blocking "
                      "request; use `await asyncio.sleep`, an async client or `await asyncio.to_thread(...)`)"
                      if blocked else "")
            raise AgentTimeout(f"the agent ran past rollout.agent.timeout_s = {timeout_s:g} s{detail}") from None

    def responds(self) -> bool:
        """Whether the agent's event loop runs a callback within BLOCKED_PROBE_S."""
        if not self.ready.wait(BLOCKED_PROBE_S) or self.loop is None:
            return False
        answered = threading.Event()
        try:
            self.loop.call_soon_threadsafe(answered.set)
        except RuntimeError:   # the loop closed meanwhile: it finished
            return True
        return answered.wait(BLOCKED_PROBE_S)

    def cancel(self) -> None:
        if self.loop is not None and self.task is not None:
            try:
                self.loop.call_soon_threadsafe(self.task.cancel)
            except RuntimeError:
                pass
