"""A batch of asynchronous work in a thread of its own: its value and time, its error re-raised in the joining
thread, and a wait past the timeout that names the work instead of hanging."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.remote import RemoteTimeoutError
from asyncrl.rollout.threaded_batch import ThreadedBatch


async def sleep_then(value, seconds: float):
    await asyncio.sleep(seconds)
    return value


async def fails():
    raise ValueError("the batch's own error")


def test_the_value_and_its_seconds_come_back():
    value, seconds = ThreadedBatch("t", lambda: sleep_then([1, 2], 0.05)).join(30, "work", "why")
    assert value == [1, 2] and seconds >= 0.05


def test_the_coroutines_error_is_raised_in_the_joining_thread():
    with pytest.raises(ValueError, match="the batch's own error"):
        ThreadedBatch("t", fails).join(30, "work", "why")


def test_a_batch_past_its_timeout_raises_naming_the_work_and_the_setting():
    batch = ThreadedBatch("t", lambda: sleep_then(None, 5))
    with pytest.raises(RemoteTimeoutError, match=r"agent loop: 3 trajectories did not finish within 0.1 s "
                                                 r"\(ray.rpc_timeout_s\)"):
        batch.join(0.1, "agent loop: 3 trajectories", "ray.rpc_timeout_s")
