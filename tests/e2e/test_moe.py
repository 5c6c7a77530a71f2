"""A mixture-of-experts policy (qwen3_moe: 4 experts, 2 per token) through real Ray actors: the demo's task, warm
started by `asyncrl demo --setup-only --model-family qwen3_moe`, learns in sync and in fully_async with partial
rollout and routing replay, and every step logs the routing metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as parquet
import pytest

from asyncrl.config import load_config
from asyncrl.launch import train
from asyncrl.launch.demo import demo_config_path
from asyncrl.telemetry import read_metrics
from tests.conftest import setup_only

MARGIN = 0.3  # validation accuracy (greedy, 64 prompts) must rise by this within 16 steps; the demo: 9% -> 99.5%
MODES = {
    "sync": (),
    "fully_async": ("trainer.mode=fully_async", "rollout.n_gpus_per_node=1", "async_training.staleness_threshold=0.5",
                    "async_training.partial_rollout=true", "async_training.trigger_parameter_sync_step=1"),
}
MOE_METRICS = ("actor/moe/aux_loss", "actor/moe/routing_mismatch_rate", "actor/moe/router_entropy",
               "actor/moe/balance_coefficient", "actor/moe/expert_load_max", "actor/moe/rollout_log_prob_abs_diff")


@pytest.fixture(scope="module")
def moe_setup(tmp_path_factory) -> dict[str, Path]:
    """The demo's setup for a qwen3_moe policy (its SFT: about a minute), with the first 64 validation prompts."""
    root = tmp_path_factory.mktemp("moe_demo")
    setup = setup_only(root, "arithmetic", "qwen3_moe")
    assert json.loads((setup.model / "config.json").read_text())["model_type"] == "qwen3_moe"
    parquet.write_table(parquet.read_table(setup.val_file).slice(0, 64), root / "val.parquet")
    return {"model": setup.model, "train": setup.train_file, "val": root / "val.parquet"}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_moe_policy_learns_with_routing_replay(mode, moe_setup, ray_session, tmp_path):
    config = load_config(demo_config_path(), [
        f"model.path={moe_setup['model']}", f"data.train_files=[{moe_setup['train']}]",
        f"data.val_files=[{moe_setup['val']}]", f"trainer.output_dir={tmp_path / 'run'}", "trainer.device=cpu",
        "trainer.logger=[jsonl]", "ray.rpc_timeout_s=300", "trainer.total_steps=16",
        "trainer.test_freq=0", "data.train_batch_size=16", "actor.ppo_mini_batch_size=16",
        "algorithm.routing_replay=true", *MODES[mode]])
    summary = train(config)
    initial = summary["initial_validation"]["val/score/mean"]
    final = summary["final_validation"]["val/score/mean"]
    assert final >= initial + MARGIN, (mode, initial, final)
    rows = [row for row in read_metrics(Path(config.trainer.output_dir) / "metrics.jsonl") if "actor/pg_loss" in row]
    assert len(rows) == 16
    for row in rows:
        assert all(name in row for name in MOE_METRICS), sorted(set(MOE_METRICS) - set(row))
        assert 0.0 <= row["actor/moe/routing_mismatch_rate"] <= 1.0 and row["actor/moe/recorded_fraction"] > 0.5
