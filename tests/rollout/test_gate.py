"""The request gate every backend admits through: a pause holds new requests (not the running ones), waiting
until idle returns only when the last running request left, a request held at the gate neither counts as
running nor as busy time; the busy clock's idle time and spans, on a fake clock."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.rollout import gate as gate_module
from asyncrl.rollout.gate import BusyClock, RequestGate


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1000.0 + self.now


@pytest.fixture()
def clock(monkeypatch) -> FakeTime:
    fake = FakeTime()
    monkeypatch.setattr(gate_module, "time", fake)
    return fake


def test_the_busy_clock_counts_idle_time_and_busy_spans(clock):
    busy = BusyClock()
    clock.now += 2.0                 # idle 2 s
    busy.update(3)
    clock.now += 5.0                 # busy 5 s
    busy.update(0)
    clock.now += 1.0                 # idle 1 s, still idle at the lap
    assert busy.lap() == (3.0, 8.0)
    assert busy.take_spans() == [(1102.0, 1107.0)] and busy.take_spans() == []
    busy.update(1)
    clock.now += 4.0                 # the next lap: busy throughout
    assert busy.lap() == (0.0, 4.0)


def test_a_pause_holds_new_requests_and_idle_waits_for_the_running_ones(clock):
    async def scenario() -> list[str]:
        gate, events = RequestGate(), []
        await gate.enter(2)
        gate.pause()

        async def late_request() -> None:
            await gate.enter(1)
            events.append(f"late request started with {gate.num_running} running")
            await gate.leave(1)

        async def settle() -> None:
            await gate.wait_until_idle()
            events.append(f"idle with {gate.num_running} running")

        late, idle = asyncio.create_task(late_request()), asyncio.create_task(settle())
        await asyncio.sleep(0)
        events.append(f"paused with {gate.num_running} running")
        await gate.leave(2)
        await idle
        clock.now += 3.0
        assert not late.done()  # held at the gate while paused: not running, not busy
        await gate.resume()
        await late
        events.append(f"idle {gate.clock.lap()}")  # (idle s, s): the 3 s held at the gate were idle
        return events

    assert asyncio.run(scenario()) == ["paused with 2 running", "idle with 0 running",
                                       "late request started with 1 running", "idle (3.0, 3.0)"]


def test_enter_waits_until_its_condition_holds(clock):
    async def scenario() -> list[str]:
        gate, healthy, events = RequestGate(), [False], []

        async def request() -> None:
            await gate.enter(1, can_start=lambda: healthy[0])
            events.append("started")

        task = asyncio.create_task(request())
        await asyncio.sleep(0)
        events.append("waiting for a healthy worker")
        healthy[0] = True
        await gate.notify()
        await task
        return events

    assert asyncio.run(scenario()) == ["waiting for a healthy worker", "started"]
