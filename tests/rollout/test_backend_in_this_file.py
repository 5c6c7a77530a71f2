"""A rollout backend written against the protocol in this file, in a few dozen lines: an `LLMEngine` in the
driver's own process whose weights are loaded from the trainer's gathered policy (`policy_state()`) at every
sync. Registered under its own name and selected by `rollout.backend`, it trains two sync steps through
real trainer ranks with no other edit: both steps run, the version advances and stamps the next step's
tokens, and after each sync the engine's weights are exactly the trainer's (which moved)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from asyncrl.config import load_config
from asyncrl.data.make import make_task, write_task
from asyncrl.engine import EngineConfig, GenerationRequest, GenerationResult, LLMEngine
from asyncrl.launch import train
from asyncrl.models import build_tiny_model
from asyncrl.rollout import (ROLLOUT_BACKENDS, RequestGate, RolloutBackend, RolloutContext, RolloutError,
                             RolloutHealth)
from asyncrl.telemetry import read_metrics

# What each sync left behind: (version, the engine's parameters, the trainer's read afterwards), as numpy.
SYNCS: list[tuple[int, dict[str, np.ndarray], dict[str, np.ndarray]]] = []


@ROLLOUT_BACKENDS.register("driver_engine", placement="external", summary="an LLMEngine in the driver's process")
class DriverEngineRollout(RolloutBackend):
    def __init__(self, context: RolloutContext):
        self.trainers = context.trainers
        self.engine = LLMEngine(context.config.model.path, EngineConfig.from_rollout(context.config.rollout, "cpu"))
        self.gate = RequestGate()
        self.version = 0

    async def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        await self.gate.enter(len(requests))
        try:
            return await asyncio.to_thread(self.engine.generate, requests)
        finally:
            await self.gate.leave(len(requests))

    async def abort(self) -> list[GenerationResult]:
        raise RolloutError("driver_engine runs each generate call to its end")

    async def pause(self) -> None:
        self.gate.pause()

    async def resume(self) -> None:
        await self.gate.resume()

    async def wait_until_idle(self) -> None:
        await self.gate.wait_until_idle()

    def sync_weights(self, version: int) -> None:
        state = self.trainers.policy_state()
        self.engine.update_weights(((name, torch.tensor(array)) for name, array in state.items()), version)
        self.version = version
        SYNCS.append((version, {name: parameter.detach().numpy().copy() for name, parameter in
                                self.engine.model.named_parameters()}, self.trainers.policy_state()))

    async def sleep(self) -> None:
        await asyncio.to_thread(self.engine.sleep)

    async def wake(self) -> None:
        await asyncio.to_thread(self.engine.wake)

    def health(self) -> RolloutHealth:
        return RolloutHealth(num_workers=1)

    def activity(self):
        return self.gate.clock

    def close(self) -> None:
        """The engine goes with the driver's process."""


@pytest.fixture()
def config(tmp_path):
    model = build_tiny_model(tmp_path / "model", max_position_embeddings=64)
    paths = write_task(make_task("arithmetic", {"max_digits": "1"}), tmp_path / "data", 32, 4, seed=0)
    return load_config(None, [
        f"model.path={model}", f"data.train_files=[{paths['train']}]", "data.train_batch_size=4",
        "data.max_prompt_length=16", "data.max_response_length=4", "rollout.n=4", "rollout.cpu_kv_cache_mb=8",
        "actor.ppo_mini_batch_size=4", "actor.optim.lr=1e-2", "trainer.mode=sync", "rollout.backend=driver_engine",
        "trainer.total_steps=2", "trainer.val_before_train=false", "trainer.dump_rollouts=true", "trainer.device=cpu",
        f"trainer.output_dir={tmp_path / 'run'}", "trainer.logger=[jsonl]", "ray.num_cpus=2"])


def test_a_backend_written_in_this_file_trains_two_sync_steps(config, ray_session):
    SYNCS.clear()
    summary = train(config)
    output = Path(config.trainer.output_dir)
    assert summary["steps"] == 2 and summary["param_version"] == 2
    assert set(summary["placement"]) == {"trainer/rank0"}  # an external backend reserves no device
    trained = [row for row in read_metrics(output / "metrics.jsonl") if "actor/pg_loss" in row]
    assert [(row["step"], row["param_version"]) for row in trained] == [(1, 1), (2, 2)]
    # Step s generated with the weights of sync s - 1: its tokens carry that version.
    for step in (1, 2):
        lines = [json.loads(line) for line in (output / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()]
        assert len(lines) == 4 * 4 and {version for line in lines for version in line["versions"]} == {step - 1}
    assert [version for version, _, _ in SYNCS] == [1, 2]
    for version, engine, trainer in SYNCS:
        assert set(engine) == set(trainer)
        assert all(np.array_equal(engine[name], trainer[name]) for name in trainer), version
    (_, first, _), (_, second, _) = SYNCS
    assert any(not np.array_equal(first[name], second[name]) for name in first)  # training moved the weights
