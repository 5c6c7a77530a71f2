"""End-to-end fixtures: a warm-started tiny policy on the demo's task, built once per session, and a
config factory for runs through real Ray actors."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.config import load_config
from asyncrl.data.make import make_task, write_task
from asyncrl.models import build_tiny_model
from asyncrl.launch.demo import MODEL_SHAPE, TASK_KNOBS, demo_config_path
from asyncrl.train.sft import SFTSettings, run_sft


@pytest.fixture(scope="session")
def warm_policy(tmp_path_factory) -> dict[str, Path]:
    """The demo's setup at test size: SFT on a stuttering teacher's sums, so RL has a clear signal."""
    root = tmp_path_factory.mktemp("warm")
    paths = write_task(make_task("arithmetic", TASK_KNOBS), root / "data", 4000, 64, seed=0)
    model = build_tiny_model(root / "model", family="qwen2", seed=0, **MODEL_SHAPE)
    sft = run_sft(model, [str(paths["train"])], root / "sft", SFTSettings(epochs=12, seed=0))
    return {"model": sft, "train": paths["train"], "val": paths["val"], "raw_model": model}


@pytest.fixture(scope="session")
def raw_policy(tmp_path_factory) -> dict[str, Path]:
    """The demo's task and tiny model without the warm start (seconds, not the minutes SFT takes on a busy
    machine): for tests of a run's mechanics (signals, resume, versions, faults) that assert no learning."""
    root = tmp_path_factory.mktemp("raw")
    paths = write_task(make_task("arithmetic", TASK_KNOBS), root / "data", 400, 32, seed=0)
    model = build_tiny_model(root / "model", family="qwen2", seed=0, **MODEL_SHAPE)
    return {"model": model, "train": paths["train"], "val": paths["val"]}


@pytest.fixture()
def make_raw_config(raw_policy, tmp_path):
    """`make_config` for the untrained model of `raw_policy`."""
    def make(*overrides: str, output: str = "run"):
        return load_config(demo_config_path(), [
            f"model.path={raw_policy['model']}", f"data.train_files=[{raw_policy['train']}]",
            f"data.val_files=[{raw_policy['val']}]", f"trainer.output_dir={tmp_path / output}",
            "trainer.device=cpu", "trainer.logger=[jsonl]", "ray.rpc_timeout_s=300", *overrides])
    return make


@pytest.fixture()
def make_config(warm_policy, tmp_path):
    def make(*overrides: str, output: str = "run"):
        return load_config(demo_config_path(), [
            f"model.path={warm_policy['model']}", f"data.train_files=[{warm_policy['train']}]",
            f"data.val_files=[{warm_policy['val']}]", f"trainer.output_dir={tmp_path / output}",
            "trainer.device=cpu", "trainer.logger=[jsonl]", "ray.rpc_timeout_s=300", *overrides])
    return make
