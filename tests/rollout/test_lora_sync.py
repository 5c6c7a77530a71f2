"""A LoRA weight sync lands whole on the receiving side, in seconds and without Ray: the trainer's policy with
trained adapters (B no longer zero, as after a first update) is sent as a sync sends it (the adapters only),
and each receiver an engine has (a rollout replica over a real gloo group, the colocated engine in process) must
then hold every parameter bitwise equal to the trainer's, `lora_A` and `lora_B` of every projection included."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
import torch

from asyncrl.bench.trainer_ranks import free_port
from asyncrl.config import load_config
from asyncrl.models import build_tiny_model
from asyncrl.models.adapted import load_policy
from asyncrl.models.lora import is_adapter_name, lora_spec
from asyncrl.rollout.colocated import ColocatedEngine
from asyncrl.rollout.replica import RolloutReplica
from asyncrl.rollout.weight_group import transfer_plan
from asyncrl.rollout.weight_transport import WeightSender, create_group

VERSION = 1


@pytest.fixture(scope="module")
def lora_setup(tmp_path_factory):
    """The run's config and the trainer's policy after training moved every adapter tensor."""
    root = tmp_path_factory.mktemp("lora_sync")
    model = build_tiny_model(root / "model", family="qwen2", seed=0, max_position_embeddings=64)
    config = load_config(None, [f"model.path={model}", "model.lora_rank=4", "model.lora_alpha=8",
                                "trainer.mode=one_step_off", "trainer.device=cpu", "rollout.cpu_kv_cache_mb=8",
                                f"trainer.output_dir={root / 'run'}"])
    policy = load_policy(model, lora_spec(config), torch.float32, torch.device("cpu"))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if is_adapter_name(name):
                parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    return config, policy


def sync_tensors(policy) -> list[tuple[str, torch.Tensor]]:
    """What a LoRA sync moves: the adapters, in parameter order (the plan's)."""
    return [(name, tensor.detach()) for name, tensor in policy.named_parameters() if is_adapter_name(name)]


def replica_after_sync(config, policy) -> dict[str, np.ndarray]:
    """A rollout replica (group rank 1, on a thread) receives one sync from a sender (rank 0, this thread)."""
    plan = transfer_plan(config, torch.float32)
    port = free_port()
    outcome: dict = {}

    async def receive() -> None:
        replica = RolloutReplica(config, 0, num_threads=1)
        await replica.join_weight_group("127.0.0.1", port, 1, 2, plan, 30)
        outcome["received"] = await replica.receive_weights(VERSION)
        outcome["state"] = await replica.engine_state()
        await replica.engine.close()

    def run_receiver() -> None:
        try:
            asyncio.run(receive())
        except BaseException as error:  # noqa: BLE001 - reported below
            outcome["error"] = error

    thread = threading.Thread(target=run_receiver)
    thread.start()
    sender = WeightSender(create_group("127.0.0.1", port, 0, 2, torch.device("cpu"), 30), plan, torch.device("cpu"))
    sender.send(iter(sync_tensors(policy)), persistent=False)
    thread.join(60)
    assert not thread.is_alive(), "the replica did not finish receiving within 60 s"
    if "error" in outcome:
        raise outcome["error"]
    assert outcome["received"] == len(plan.names)
    return outcome["state"]


def colocated_after_sync(config, policy) -> dict[str, np.ndarray]:
    engine = ColocatedEngine(config, "cpu")
    engine.load_weights(iter(sync_tensors(policy)), VERSION)
    return engine.state()


@pytest.mark.parametrize("receive", [replica_after_sync, colocated_after_sync], ids=["replica", "colocated"])
def test_every_adapter_tensor_reaches_the_engine_bitwise(lora_setup, receive):
    config, policy = lora_setup
    state = receive(config, policy)
    assert int(state.pop("__version__")) == VERSION
    trainer = {name: tensor.detach().numpy() for name, tensor in policy.named_parameters()}
    assert set(state) == set(trainer), sorted(set(state) ^ set(trainer))
    adapters = sorted(name for name in trainer if is_adapter_name(name))
    assert any(name.endswith(".lora_B.weight") for name in adapters)
    assert all(np.abs(trainer[name]).max() > 0 for name in adapters)    # trained: B is no longer zero
    differing = [name for name in trainer if not np.array_equal(state[name], trainer[name])]
    assert differing == [], f"{len(differing)} engine tensors differ from the trainer's after the sync: {differing[:4]}"
