"""A small run for the tests that watch a whole `asyncrl train` process from outside: a tiny untrained model
and the arithmetic task (what is learnt does not matter here, only which processes exist and what they do)."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.config import dump_config, load_config
from asyncrl.data.make import make_task, write_task
from asyncrl.launch.demo import demo_config_path
from asyncrl.models import build_tiny_model


@pytest.fixture(scope="session")
def tiny_setup(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny_setup")
    paths = write_task(make_task("arithmetic", {"min_digits": "1", "max_digits": "2"}), root / "data", 256, 16,
                       seed=0)
    model = build_tiny_model(root / "model", family="qwen2", seed=0, hidden_size=32, num_layers=1, num_heads=2,
                             num_kv_heads=1, max_position_embeddings=64)
    return {"model": model, "train": paths["train"], "val": paths["val"]}


@pytest.fixture()
def write_run_config(tiny_setup, tmp_path):
    def write(*overrides: str) -> Path:
        config = load_config(demo_config_path(), [
            f"model.path={tiny_setup['model']}", f"data.train_files=[{tiny_setup['train']}]",
            f"data.val_files=[{tiny_setup['val']}]", f"trainer.output_dir={tmp_path / 'run'}", "trainer.device=cpu",
            "trainer.logger=[jsonl]", "ray.rpc_timeout_s=300", "ray.num_cpus=2", "data.train_batch_size=4",
            "actor.ppo_mini_batch_size=4", "rollout.n=2", "trainer.val_before_train=false", "trainer.test_freq=-1",
            *overrides])
        path = tmp_path / "run.yaml"
        path.write_text(dump_config(config))
        return path
    return write
