"""An asyncio front of `LLMEngine`, fit for a Ray actor.

    engine = AsyncEngine(LLMEngine(folder, config))
    result = await engine.generate(request)                      # submit and await one request
    async for result in engine.as_completed(requests): ...       # stream results as they finish
    partial = await engine.abort()                               # everything in flight, finish "abort"
    await engine.pause(); await engine.update_weights(pairs, 5); await engine.resume()
    await engine.sleep(); await engine.wake()                    # colocated mode: free the KV cache

One background task steps the engine; each step runs in a worker thread (`asyncio.to_thread`), so the
event loop keeps serving submissions, aborts and pauses while a step runs. An asyncio lock serialises every
use of the engine: a step, an abort, a weight update or a sleep happens between two steps, never inside one,
and after the decode the engine launched ahead (async scheduling) has completed: requests that finished in
it are resolved then.
If a step raises, every waiting caller gets the error and later calls fail with it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TypeVar

from torch import Tensor

from asyncrl.engine.llm_engine import LLMEngine
from asyncrl.engine.request import GenerationRequest, GenerationResult

logger = logging.getLogger(__name__)

T = TypeVar("T")


class AsyncEngine:
    """Serialises access to an `LLMEngine` and runs its step loop in the background."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._lock = asyncio.Lock()
        self._futures: dict[str, asyncio.Future[GenerationResult]] = {}
        self._pending: list[GenerationRequest] = []  # submitted, handed to the engine before the next step
        self._has_work = asyncio.Event()
        self._is_paused = False
        self._loop_task: asyncio.Task | None = None
        self._error: BaseException | None = None
        self._background_tasks: set[asyncio.Task] = set()

    @property
    def is_paused(self) -> bool:
        return self._is_paused

    @property
    def num_in_flight(self) -> int:
        return len(self._futures)

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Submits `request` and waits for its result (finish_reason "abort" if it gets aborted). Cancelling
        the wait aborts the request, so its KV blocks and request id are freed."""
        future = self._submit(request)
        try:
            return await future
        except asyncio.CancelledError:
            task = asyncio.get_running_loop().create_task(self.abort([request.request_id]))
            self._background_tasks.add(task)  # a reference keeps the task alive until it ends
            task.add_done_callback(self._background_tasks.discard)
            raise

    async def as_completed(self, requests: Iterable[GenerationRequest]) -> AsyncIterator[GenerationResult]:
        """Submits all `requests`, then yields each result as soon as it finishes."""
        futures = [self._submit(request) for request in requests]
        for next_finished in asyncio.as_completed(futures):
            yield await next_finished

    async def abort(self, request_ids: Iterable[str] | None = None) -> list[GenerationResult]:
        """Aborts the given (all when None) in-flight requests between two steps; returns their partial
        results, which their awaiting `generate` calls also receive."""
        results = await self._between_steps(lambda: self.engine.abort(request_ids))
        self._resolve(results)
        return results

    async def pause(self) -> None:
        """Stops stepping once the current step ends (returns then, with no step left on the device);
        in-flight requests keep their state."""
        self._is_paused = True
        await self._between_steps(lambda: None)

    async def resume(self) -> None:
        self._is_paused = False
        self._has_work.set()

    async def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> int:
        """Loads weights in place between two steps (pausing stepping while it copies); see
        `LLMEngine.update_weights`."""
        return await self._between_steps(lambda: self.engine.update_weights(named_tensors, version))

    async def update_weights_in_place(self, load: Callable[[dict[str, Tensor]], int], version: int) -> int:
        """`LLMEngine.update_weights_in_place` between two steps."""
        return await self._between_steps(lambda: self.engine.update_weights_in_place(load, version))

    async def sleep(self) -> None:
        """Releases the KV cache between two steps; in-flight requests wait and are recomputed after wake."""
        await self._between_steps(self.engine.sleep)

    async def wake(self) -> None:
        await self._between_steps(self.engine.wake)
        self._has_work.set()

    async def _between_steps(self, operation: Callable[[], T]) -> T:
        """Runs `operation` in a worker thread between two steps, after handing over submitted requests (so
        that an abort finds them) and completing the engine's step in flight (`LLMEngine.drain`): the
        requests that finished in it are resolved here, since a paused or sleeping engine does not step
        again to return them."""
        def drain_and_run() -> tuple[list[GenerationResult], T]:
            finished = self.engine.drain()
            return finished, operation()

        async with self._lock:
            self._hand_pending_to_engine()
            finished, value = await asyncio.to_thread(drain_and_run)
        self._resolve(finished)
        return value

    async def close(self) -> None:
        """Stops the background loop after the current step (in-flight requests are left as they are)."""
        await self.pause()  # a step running in a worker thread would outlive a cancelled task
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
            self._loop_task = None

    def _submit(self, request: GenerationRequest) -> asyncio.Future[GenerationResult]:
        if self._error is not None:
            raise RuntimeError(f"the engine loop failed earlier: {self._error!r}") from self._error
        if request.request_id in self._futures:
            raise ValueError(f"request {request.request_id!r} is already in flight")
        future = asyncio.get_running_loop().create_future()
        self._futures[request.request_id] = future
        self._pending.append(request)
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._step_loop())
        self._has_work.set()
        return future

    def _hand_pending_to_engine(self) -> None:
        pending, self._pending = self._pending, []
        for request in pending:
            try:
                self.engine.add_request(request)
            except ValueError as error:  # a bad request fails its own caller, not the loop
                future = self._futures.pop(request.request_id)
                if not future.done():
                    future.set_exception(error)

    def _can_step(self) -> bool:
        has_work = bool(self._pending) or self.engine.has_unfinished()
        return has_work and not self._is_paused and not self.engine.is_sleeping

    async def _step_loop(self) -> None:
        try:
            while True:
                if not self._can_step():
                    self._has_work.clear()
                    await self._has_work.wait()
                    continue
                async with self._lock:
                    if not self._can_step():
                        continue
                    self._hand_pending_to_engine()
                    results = await asyncio.to_thread(self.engine.step)
                self._resolve(results)
        except Exception as error:  # every caller hears of it; the loop stays down
            logger.exception("engine step failed")
            self._error = error
            for future in self._futures.values():
                if not future.done():
                    future.set_exception(RuntimeError(f"engine step failed: {error!r}"))
            self._futures.clear()

    def _resolve(self, results: list[GenerationResult]) -> None:
        for result in results:
            future = self._futures.pop(result.request_id, None)
            if future is not None and not future.done():
                future.set_result(result)
