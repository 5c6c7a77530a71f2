"""End-to-end fixtures: the demo's warm-started tiny policy and task (the session's `demo_setup`), the same task
on the untrained model, and config factories for runs through real Ray actors."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as parquet
import pytest

from asyncrl.config import load_config
from asyncrl.data.make import make_task, write_task
from asyncrl.models import build_tiny_model
from asyncrl.data.demo_tasks import MODEL_SHAPE, TASK_KNOBS
from asyncrl.launch.demo import demo_config_path
from asyncrl.train.sft import SFTSettings, run_sft
from tests.e2e.demo_configs import VLLM_SHAPE, warm_config

# The first rows of the demo's splits: more training prompts than any run here trains on (20 steps of 32), and a
# third of its validation prompts, so that each run tokenizes and validates only what it may use.
TRAIN_SIZE = 1024
VAL_SIZE = 64   # also an epoch of 8 steps of 8 for the tests that train on the validation prompts


@pytest.fixture(scope="session")
def warm_policy(demo_setup, tmp_path_factory) -> dict[str, Path]:
    """The demo's warm-started model (SFT on a stuttering teacher's sums, so RL has a clear signal) and the first
    TRAIN_SIZE and VAL_SIZE prompts of its task."""
    folder = tmp_path_factory.mktemp("warm_data")
    paths = {"train": folder / "train.parquet", "val": folder / "val.parquet"}
    for split, size, source in (("train", TRAIN_SIZE, demo_setup.train_file), ("val", VAL_SIZE, demo_setup.val_file)):
        parquet.write_table(parquet.read_table(source).slice(0, size), paths[split])
    return {"model": demo_setup.model, **paths}


@pytest.fixture(scope="session")
def vllm_policy(tmp_path_factory) -> dict[str, Path]:
    """The demo's task and warm start, on VLLM_SHAPE (for rollout.backend=vllm and vllm serve)."""
    root = tmp_path_factory.mktemp("vllm_policy")
    paths = write_task(make_task("arithmetic", TASK_KNOBS), root / "data", 4000, 64, seed=0)
    raw = build_tiny_model(root / "raw", family="qwen2", seed=0, **VLLM_SHAPE)
    model = run_sft(raw, [str(paths["train"])], root / "model", SFTSettings(epochs=12.0, seed=0))
    return {"model": model, "train": paths["train"], "val": paths["val"]}


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
        return warm_config(warm_policy, tmp_path / output, *overrides)
    return make
