"""LoRA through real Ray actors: the demo's task learns with adapters in all three modes (validation runs on the
rollout engines, so a rise proves the adapters reached them), each step reports the adapter sizes, and a
fully_async LoRA run killed with SIGKILL resumes training every prompt exactly once."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow.parquet as parquet
import pytest

from asyncrl.config import dump_config
from asyncrl.launch import train
from asyncrl.models import load_model
from asyncrl.models.lora import add_adapters, count_parameters, lora_spec
from asyncrl.telemetry import read_metrics

from .test_kill_resume import run_until

# The demo's LoRA settings (docs/lora.md): rank 8 on every projection, and 10x the full-model learning rate, as
# the adapters start from zero and a few thousand parameters must move the policy within the demo's budget.
LORA = ("model.lora_rank=8", "model.lora_alpha=16", "actor.optim.lr=2e-3")
MODES = {
    "sync": (),
    "one_step_off": ("trainer.mode=one_step_off", "rollout.n_gpus_per_node=1"),
    "fully_async": ("trainer.mode=fully_async", "rollout.n_gpus_per_node=1", "async_training.staleness_threshold=0.5",
                    "async_training.partial_rollout=true", "async_training.trigger_parameter_sync_step=1"),
}
MARGIN = 0.2  # validation accuracy (greedy, 64 prompts) must rise by this within 16 steps


def expected_adapter_params(config) -> int:
    model = load_model(config.model.path)
    add_adapters(model, lora_spec(config))
    trainable, _ = count_parameters(model)
    return trainable


@pytest.mark.parametrize("mode", sorted(MODES))
def test_lora_learns_in_every_mode_and_reports_its_sizes(mode, make_config, ray_session):
    config = make_config(*LORA, *MODES[mode], "trainer.total_steps=16", "trainer.test_freq=0",
                         "data.train_batch_size=16", "actor.ppo_mini_batch_size=16")
    train(config)
    summary = json.loads((Path(config.trainer.output_dir) / "summary.json").read_text())
    initial = summary["initial_validation"]["val/score/mean"]
    final = summary["final_validation"]["val/score/mean"]
    assert final >= initial + MARGIN, (mode, initial, final)
    rows = [row for row in read_metrics(f"{config.trainer.output_dir}/metrics.jsonl") if "lora/trainable_params" in row]
    assert len(rows) == 16
    num_adapter_params = expected_adapter_params(config)
    assert all(row["lora/trainable_params"] == num_adapter_params for row in rows)
    assert all(row["weight_sync/bytes"] == 4 * num_adapter_params for row in rows)  # fp32 adapters, nothing else


def test_fully_async_lora_killed_and_resumed_trains_every_prompt_once(make_raw_config, raw_policy, tmp_path):
    output_dir = tmp_path / "killed"
    epoch = tmp_path / "epoch.parquet"  # 6 steps of 8
    parquet.write_table(parquet.read_table(raw_policy["train"]).slice(0, 48), epoch)
    config = make_raw_config(*LORA, "trainer.mode=fully_async", "rollout.n_gpus_per_node=1",
                             "trainer.dump_rollouts=true", f"data.train_files=[{epoch}]", "data.train_batch_size=8",
                             "actor.ppo_mini_batch_size=8", "trainer.save_freq=1",
                             "async_training.trigger_parameter_sync_step=2", "async_training.staleness_threshold=0.5",
                             "async_training.partial_rollout=true", "trainer.val_before_train=false",
                             "data.val_files=[]", "ray.num_cpus=2", f"trainer.output_dir={output_dir}")
    config_path = tmp_path / "run.yaml"
    config_path.write_text(dump_config(config))
    assert run_until(config_path, output_dir, 3) == -9  # after a sync, with adapters and their moments saved
    assert run_until(config_path, output_dir, None) == 0
    summary = json.loads((output_dir / "summary.json").read_text())
    assert summary["last_step"] == 6
    rollouts = output_dir / "rollouts"
    trained = Counter(json.loads(line)["prompt_id"] for step in range(1, 7)
                      for line in (rollouts / f"step_{step}.jsonl").read_text().splitlines()
                      if json.loads(line)["sample_index"] == 0)
    assert set(trained) == {f"epoch.parquet:{row}" for row in range(48)}  # none lost
    assert set(trained.values()) == {1}, trained.most_common(3)           # none repeated
    # The run exported the adapter in PEFT's format beside the merged policy.
    adapter = output_dir / "policy" / "adapter"
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 8
    assert (adapter / "adapter_model.safetensors").is_file()
