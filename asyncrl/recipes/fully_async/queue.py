"""The bounded queue between the rollouter and the trainer: scored groups, oldest first.

It lives inside the rollouter actor (the trainer takes from it through the rollouter): a separate actor
would cost a process, its imports, and one more serialisation of every sample on the way.
`put` blocks while the queue is full (back-pressure: nothing is ever dropped), `get(count)` waits for up
to `count` groups and returns fewer only once the stream has ended, `None` once it is empty and ended,
and `[]` when its timeout passed first.
End of stream is explicit (`close`), never a sentinel item mixed with the data.

    queue = SampleQueue(capacity=M)
    await queue.put_many(groups)             # rollouter
    groups = await queue.get(R, timeout_s)   # for the trainer; None at the end of the data
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Optional


class SampleQueue:
    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"queue capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.items: deque = deque()
        self.is_closed = False
        self.changed = asyncio.Condition()
        self.num_put = 0
        self.num_got = 0
        self.put_wait_s = 0.0

    async def put(self, item: Any) -> int:
        """Append (waiting while full); returns the size after the put."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        async with self.changed:
            await self.changed.wait_for(lambda: len(self.items) < self.capacity)
            self.items.append(item)
            self.num_put += 1
            self.put_wait_s += loop.time() - started
            self.changed.notify_all()
            return len(self.items)

    async def put_many(self, items: list[Any]) -> int:
        """`put` each item in order (each waits for room); returns the size after the last."""
        size = len(self.items)
        for item in items:
            size = await self.put(item)
        return size

    async def get(self, count: int, timeout_s: Optional[float] = None) -> Optional[list[Any]]:
        """`count` items, oldest first; fewer only once closed; None when closed and empty; [] when
        `timeout_s` passed first (nothing is taken then)."""
        async with self.changed:
            ready = lambda: len(self.items) >= count or self.is_closed  # noqa: E731
            try:
                await asyncio.wait_for(self.changed.wait_for(ready), timeout_s)
            except asyncio.TimeoutError:
                return []
            if not self.items:
                return None
            taken = [self.items.popleft() for _ in range(min(count, len(self.items)))]
            self.num_got += len(taken)
            self.changed.notify_all()
            return taken

    async def close(self) -> None:
        async with self.changed:
            self.is_closed = True
            self.changed.notify_all()

    async def size(self) -> int:
        return len(self.items)

    async def snapshot(self) -> list[Any]:
        """The queued items, oldest first (for a checkpoint; the queue keeps them)."""
        return list(self.items)

    async def restore(self, items: list[Any]) -> None:
        async with self.changed:
            self.items.extendleft(reversed(items))
            self.changed.notify_all()

    async def stats(self) -> dict[str, float]:
        return {"fully_async/queue/size": float(len(self.items)), "fully_async/queue/num_put": float(self.num_put),
                "fully_async/queue/num_got": float(self.num_got), "fully_async/queue/put_wait_s": self.put_wait_s}

