"""A rollout backend owned by another Ray actor, and the driver's handle on it.

In fully-async mode the rollouter actor streams requests into the backend, so the backend lives there: one
owner of the replicas, their health and their weights. The driver's stages (validation, weight sync, fault
metrics) reach the same object through the host instead of around it.

    class Rollouter(RolloutHost): ...                       # the host builds and owns `self.rollout`
    wait_for(host.host_rollout.remote(ReplicaSet, context), ...)
    rollout = HostedRollout(host, "fully_async/rollouter", config)   # a RolloutBackend for the driver's core

Blocking work of the backend (a weight sync, collecting a dispatched batch) runs in a worker thread of the
host, so its event loop keeps streaming.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Optional

from asyncrl.config import AsyncRLConfig
from asyncrl.engine import GenerationRequest, GenerationResult
from asyncrl.remote import wait_for
from asyncrl.rollout.backend import PendingGeneration, RolloutBackend, RolloutHealth, SyncStats, WorkerOutput
from asyncrl.rollout.gate import BusyClock
from asyncrl.rollout.registry import RolloutContext
from asyncrl.rollout.weight_group import sync_deadline_s


class RolloutHost:
    """Mixed into an asyncio actor class that owns a backend (`self.rollout`): the methods `HostedRollout`
    calls, each the backend's method of the same name."""

    rollout: RolloutBackend

    async def host_rollout(self, build: Callable[[RolloutContext], RolloutBackend], context: RolloutContext) -> None:
        """Builds the backend here (`build` is the registry entry the composition root resolved)."""
        self.rollout = await asyncio.to_thread(build, context)

    async def rollout_generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        return await self.rollout.generate(requests)

    async def rollout_generate_batch(self, requests: list[GenerationRequest]) -> list[WorkerOutput]:
        def dispatch_and_collect() -> list[WorkerOutput]:
            pending = self.rollout.start_generate(requests)
            pending.results()
            return pending.outputs
        return await asyncio.to_thread(dispatch_and_collect)

    async def rollout_abort(self) -> list[GenerationResult]:
        return await self.rollout.abort()

    async def rollout_pause(self) -> None:
        await self.rollout.pause()

    async def rollout_resume(self) -> None:
        await self.rollout.resume()

    async def rollout_wait_until_idle(self) -> None:
        await self.rollout.wait_until_idle()

    async def rollout_sync_weights(self, version: int) -> None:
        await asyncio.to_thread(self.rollout.sync_weights, version)

    async def rollout_sync_stats(self) -> Optional[SyncStats]:
        return self.rollout.sync_stats()

    async def rollout_sleep(self) -> None:
        await self.rollout.sleep()

    async def rollout_wake(self) -> None:
        await self.rollout.wake()

    async def rollout_health(self) -> RolloutHealth:
        return self.rollout.health()

    async def rollout_activity(self) -> BusyClock:
        return self.rollout.activity()


class HostedRollout(RolloutBackend):
    """The driver's handle on a backend that another actor owns; every wait names that actor."""

    def __init__(self, host: Any, name: str, config: AsyncRLConfig):
        self.host = host
        self.name = name
        self.timeout_s = config.ray.rpc_timeout_s
        self.sync_timeout_s = sync_deadline_s(config)   # the host's own named errors come first
        self.version = 0

    def wait(self, ref: Any, call: str, timeout_s: float | None = None) -> Any:
        return wait_for(ref, self.name, call, timeout_s or self.timeout_s)

    async def wait_async(self, ref: Any, call: str) -> Any:
        return await asyncio.to_thread(self.wait, ref, call)

    async def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        return await self.wait_async(self.host.rollout_generate.remote(requests), "generate")

    def start_generate(self, requests: list[GenerationRequest]) -> PendingGeneration:
        ref = self.host.rollout_generate_batch.remote(requests)
        return PendingGeneration(list(requests), lambda: self.wait(ref, "generate"))

    async def abort(self) -> list[GenerationResult]:
        return await self.wait_async(self.host.rollout_abort.remote(), "abort")

    async def pause(self) -> None:
        await self.wait_async(self.host.rollout_pause.remote(), "pause")

    async def resume(self) -> None:
        await self.wait_async(self.host.rollout_resume.remote(), "resume")

    async def wait_until_idle(self) -> None:
        await self.wait_async(self.host.rollout_wait_until_idle.remote(), "wait_until_idle")

    def sync_weights(self, version: int) -> None:
        self.wait(self.host.rollout_sync_weights.remote(version), "sync_weights", self.sync_timeout_s)
        self.version = version

    def sync_stats(self) -> Optional[SyncStats]:
        return self.wait(self.host.rollout_sync_stats.remote(), "sync_stats")

    async def sleep(self) -> None:
        await self.wait_async(self.host.rollout_sleep.remote(), "sleep")

    async def wake(self) -> None:
        await self.wait_async(self.host.rollout_wake.remote(), "wake")

    def health(self) -> RolloutHealth:
        return self.wait(self.host.rollout_health.remote(), "health")

    def activity(self) -> BusyClock:
        """A copy of the host's clock, as of now."""
        return self.wait(self.host.rollout_activity.remote(), "activity")

    def close(self) -> None:
        """The handle holds nothing: the composition root stops the host and every replica it launched."""
