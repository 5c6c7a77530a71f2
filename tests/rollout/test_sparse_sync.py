"""Sparse weight sync through real Ray actors (a trainer rank and a rollout replica over gloo), the model in
bf16 on CPU: after every training step and sync the engine's weights are bitwise the trainer's cast to bf16,
the first sync is dense (the group knows nothing yet) and later ones move only what changed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from asyncrl.config import load_config
from asyncrl.data.dataset import PromptDataset
from asyncrl.data.make import make_task, write_task
from asyncrl.models import build_tiny_model, load_tokenizer
from tests.rollout.test_weight_sync import assert_states_equal, start_replica_set, stop_setup, train_one_step


@pytest.fixture(scope="module")
def bf16_setup(tmp_path_factory, ray_session):
    root = tmp_path_factory.mktemp("sparse")
    model = build_tiny_model(root / "model", family="qwen2", seed=1, tie_word_embeddings=False)
    paths = write_task(make_task("arithmetic"), root / "data", 16, 4, seed=0)
    config = load_config(None, [
        f"model.path={model}", f"data.train_files=[{paths['train']}]", "trainer.device=cpu", "model.dtype=bfloat16",
        "trainer.mode=one_step_off", "trainer.n_gpus_per_node=1", "rollout.n_gpus_per_node=1", "rollout.n=2",
        "data.train_batch_size=4", "actor.ppo_mini_batch_size=4", "actor.optim.lr=1e-4",
        "data.max_response_length=6", "rollout.cpu_kv_cache_mb=8", "weight_sync.bucket_mb=1",
        "weight_sync.encoding=sparse", "weight_sync.timeout_s=20", "ray.rpc_timeout_s=120"])
    trainers, rollout, pools = start_replica_set(config)
    prompts = PromptDataset.from_files(config.data.train_files, load_tokenizer(model), config.data).prompts[:4]
    yield config, trainers, rollout, prompts
    stop_setup(trainers, rollout, pools)


def rounded_to_bf16(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: torch.tensor(array).to(torch.bfloat16).float().numpy() for name, array in state.items()}


def test_after_every_step_the_bf16_engine_equals_the_trainer_bitwise_and_later_syncs_move_less(bf16_setup):
    config, trainers, rollout, prompts = bf16_setup
    assert rollout.weights.plan.sparse and rollout.weights.plan.dtype == torch.bfloat16
    stats = []
    for version in (1, 2, 3):
        before = trainers.policy_state()
        train_one_step(config, trainers, rollout, prompts, f"sparse{version}")
        after = trainers.policy_state()
        assert any(not np.array_equal(before[name], after[name]) for name in before)  # training moved weights
        rollout.sync_weights(version)
        engine = rollout.engine_states()[0]
        assert engine["model.norm.weight"].dtype == np.float32   # bf16 values, widened by engine_state
        assert_states_equal(config, rounded_to_bf16(trainers.policy_state()), [engine], version)
        stats.append(rollout.sync_stats())
    assert stats[0].changed_fraction == 1.0 and stats[0].bytes >= stats[0].dense_bytes   # a new group: dense
    for later in stats[1:]:
        assert 0.0 < later.changed_fraction < 1.0 and later.bytes < later.dense_bytes, later
