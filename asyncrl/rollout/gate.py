"""Admission of requests to a backend's engines, and a clock of when any was generating.

    gate = RequestGate()
    await gate.enter(len(requests), can_start=lambda: any(healthy))   # waits while paused (or can_start says no)
    try: ... generate ...
    finally: await gate.leave(len(requests))
    gate.pause(); await gate.wait_until_idle(); ...; await gate.resume()

A request counts as running only once it passed the gate, so a request waiting for `resume` (or for a healthy
worker) neither keeps a pause from settling nor counts as busy time. The counter changes without an await
between the gate and the dispatch, so a pause that waits until idle sees every dispatched request.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Optional


class BusyClock:
    """Idle time (no request generating) since the last lap, and the wall-clock spans with work."""

    def __init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        """Starts a lap with nothing generating."""
        now = time.monotonic()
        self.idle_s = 0.0
        self.lap_started = now
        self.idle_since: Optional[float] = now
        self.busy_since_wall = time.time()
        self.spans: list[tuple[float, float]] = []

    def update(self, num_generating: int) -> None:
        now = time.monotonic()
        if num_generating == 0 and self.idle_since is None:
            self.idle_since = now
            self.spans.append((self.busy_since_wall, time.time()))
        elif num_generating > 0 and self.idle_since is not None:
            self.idle_s += now - self.idle_since
            self.idle_since = None
            self.busy_since_wall = time.time()

    def lap(self) -> tuple[float, float]:
        """(idle seconds, seconds) of the lap that ends now; the next one starts."""
        now = time.monotonic()
        idle_s = self.idle_s + (now - self.idle_since if self.idle_since is not None else 0.0)
        elapsed_s = max(now - self.lap_started, 1e-9)
        self.idle_s, self.lap_started = 0.0, now
        self.idle_since = now if self.idle_since is not None else None
        return idle_s, elapsed_s

    def take_spans(self) -> list[tuple[float, float]]:
        """The finished busy spans (wall clock) since the last call."""
        spans, self.spans = self.spans, []
        return spans


class RequestGate:
    def __init__(self) -> None:
        self.is_paused = False
        self.num_running = 0
        self.clock = BusyClock()
        self.changed = asyncio.Condition()

    async def enter(self, num_requests: int, can_start: Callable[[], bool] = lambda: True) -> None:
        """Waits until not paused and `can_start()`, then counts `num_requests` as running."""
        async with self.changed:
            await self.changed.wait_for(lambda: not self.is_paused and can_start())
        self.num_running += num_requests
        self.clock.update(self.num_running)

    async def leave(self, num_requests: int) -> None:
        self.num_running -= num_requests
        self.clock.update(self.num_running)
        await self.notify()

    def pause(self) -> None:
        self.is_paused = True

    async def resume(self) -> None:
        self.is_paused = False
        await self.notify()

    async def wait_until_idle(self) -> None:
        async with self.changed:
            await self.changed.wait_for(lambda: self.num_running == 0)

    async def notify(self) -> None:
        """Wake the waiters to look again (the gate opened, a request left, a worker came back)."""
        async with self.changed:
            self.changed.notify_all()


class GatedControls:
    """pause / resume / wait_until_idle of a backend whose requests pass one `RequestGate` (`self.gate`)."""

    gate: RequestGate

    async def pause(self) -> None:
        self.gate.pause()

    async def resume(self) -> None:
        await self.gate.resume()

    async def wait_until_idle(self) -> None:
        await self.gate.wait_until_idle()
