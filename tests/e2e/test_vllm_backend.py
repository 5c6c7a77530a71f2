"""rollout.backend=vllm end to end, on vLLM's CPU build: the demo task learns in sync, one_step_off and fully_async
(partial rollout), each run through real Ray actors with a vLLM engine in its rollout replica.

The policy is the demo's (same task, same SFT warm start on a stuttering teacher's sums) with heads of 32
dimensions instead of 16, which vLLM's CPU attention needs. What must hold: validation accuracy rises by 0.3 in
every mode; one_step_off's tokens are one version stale; in fully_async with partial rollout some trained samples
carry two policy versions; a vLLM replica killed with SIGKILL mid-run is restarted and re-synced, the run finishes and
every prompt trains once, and the killed actor's vLLM processes do not outlive it. Needs vLLM (`scripts/vllm_cpu_venv.sh`); three runs of 32-48 steps (~1.5 min each on 2 cores,
an engine start included).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import psutil
import pyarrow.parquet as parquet
import pytest

from asyncrl.data.make import make_task, write_task
from asyncrl.launch import train
from asyncrl.data.demo_tasks import DEMO_TASKS
from asyncrl.models import build_tiny_model
from asyncrl.rollout.vllm.engine_args import vllm_installed
from asyncrl.telemetry import read_metrics
from asyncrl.train.sft import SFTSettings, run_sft
from tests.e2e.demo_configs import VLLM_SHAPE, warm_config
from tests.e2e.replica_killer import ReplicaKiller
from tests.e2e.test_agents import assert_the_tools_demo_learned

pytestmark = [pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.skipif(not vllm_installed(), reason="vLLM is not installed here "
                                 "(bash scripts/vllm_cpu_venv.sh; docs/vllm.md)")]
VLLM = ("rollout.backend=vllm", "rollout.n_gpus_per_node=1", "rollout.cpu_kv_cache_mb=64", "trainer.dump_rollouts=true",
        "trainer.test_freq=-1")
GAIN = 0.3
TOOLS_SFT_EPOCHS = 3.75


def dumped(output_dir: str) -> dict[int, list[dict]]:
    folder = Path(output_dir) / "rollouts"
    return {int(path.stem.split("_")[1]): [json.loads(line) for line in path.read_text().splitlines()]
            for path in folder.glob("step_*.jsonl")}


def run(vllm_policy, tmp_path, *overrides):
    config = warm_config(vllm_policy, tmp_path / "run", *VLLM, *overrides)
    summary = train(config)
    before = summary["initial_validation"]["val/score/mean"]
    after = summary["final_validation"]["val/score/mean"]
    return config, summary, before, after


def test_sync_learns_on_vllm(vllm_policy, ray_session, tmp_path):
    config, summary, before, after = run(vllm_policy, tmp_path, "trainer.mode=sync", "trainer.total_steps=32")
    assert after >= before + GAIN, (before, after)
    assert all(sample["versions"] == [step - 1] for step, samples in dumped(config.trainer.output_dir).items()
               for sample in samples)   # sync: every token sampled by the weights of the step before


def test_one_step_off_learns_on_vllm_one_version_stale(vllm_policy, ray_session, tmp_path):
    config, summary, before, after = run(vllm_policy, tmp_path, "trainer.mode=one_step_off", "trainer.total_steps=32")
    assert after >= before + GAIN, (before, after)
    steps = dumped(config.trainer.output_dir)
    assert sorted(steps) == list(range(1, 33))
    assert all(sample["versions"] == [step - 1] for step, samples in steps.items() for sample in samples)


def test_fully_async_with_partial_rollout_learns_on_vllm_and_resumes_samples_across_versions(vllm_policy, ray_session,
                                                                                           tmp_path):
    config, summary, before, after = run(
        vllm_policy, tmp_path, "trainer.mode=fully_async", "trainer.total_steps=48",
        "async_training.trigger_parameter_sync_step=1",
        "async_training.staleness_threshold=1.0", "async_training.partial_rollout=true",
        # Eight sequences at a time: generating takes longer than training, so syncs find responses in flight.
        "rollout.max_num_seqs=8")
    assert after >= before + GAIN, (before, after)
    samples = [sample for samples in dumped(config.trainer.output_dir).values() for sample in samples]
    spanning = [sample for sample in samples if len(set(sample["versions"])) > 1]
    assert spanning, "no trained sample was interrupted by a sync"
    rows = [row for row in read_metrics(f"{config.trainer.output_dir}/metrics.jsonl") if "critic/score/mean" in row]
    assert max(row["fully_async/partial/partial_ratio"] for row in rows) > 0


def test_a_killed_vllm_replica_is_restarted_resynced_and_every_prompt_trains_once(vllm_policy, ray_session, tmp_path,
                                                                                 monkeypatch):
    epoch = tmp_path / "epoch.parquet"
    parquet.write_table(parquet.read_table(vllm_policy["train"]).slice(0, 64), epoch)
    config = warm_config(vllm_policy, tmp_path / "run", *VLLM, f"data.train_files=[{epoch}]", "data.val_files=[]",
                         "trainer.val_before_train=false", "data.train_batch_size=8", "actor.ppo_mini_batch_size=8",
                         "trainer.mode=fully_async", "async_training.trigger_parameter_sync_step=2",
                         "async_training.staleness_threshold=0.5", "async_training.partial_rollout=true",
                         # a restarted replica starts a vLLM engine before it can re-join the weight group
                         "weight_sync.timeout_s=180")
    output = Path(config.trainer.output_dir)
    killer = ReplicaKiller(monkeypatch, ray_session, output, after_step=2)
    summary = train(config)
    killer.join()
    killed, orphans = killer.killed, killer.children   # orphans: its vLLM engine core and worker
    assert len(killed) == 1 and summary["steps"] == 8
    trained = Counter(sample["prompt_id"] for samples in dumped(config.trainer.output_dir).values()
                      for sample in samples if sample["sample_index"] == 0)
    assert len(trained) == 64 and set(trained.values()) == {1}
    rows = read_metrics(output / "metrics.jsonl")
    assert max(row.get("faults/replica_restarts", 0) for row in rows) == 1
    # The killed actor's vLLM processes (engine core, worker) went with it.
    assert orphans
    _, alive = psutil.wait_procs(orphans, timeout=30)
    assert alive == [], [process.pid for process in alive]


def test_the_tools_demo_learns_on_vllm_in_one_step_off(ray_session, tmp_path):
    """Multi-turn trajectories (call, tool result, answer) through vLLM replicas: the tools demo's task and settings on
    its model twice as wide, warm-started for fewer epochs (with the demo's 6 the wider model starts at 89%, leaving
    RL nothing to gain); the margins of tests/e2e/test_agents.py."""
    demo = DEMO_TASKS["tools"]
    paths = write_task(make_task(demo.task, demo.knobs), tmp_path / "data", demo.train_size, demo.val_size, seed=0)
    raw = build_tiny_model(tmp_path / "raw", family="qwen2", seed=0, **{**VLLM_SHAPE, "max_position_embeddings": 192})
    model = run_sft(raw, [str(paths["train"])], tmp_path / "model", SFTSettings(epochs=TOOLS_SFT_EPOCHS, seed=0))
    policy = {"model": model, "train": paths["train"], "val": paths["val"]}
    output = tmp_path / "run"
    summary = train(warm_config(policy, output, *demo.run_overrides("one_step_off"), *VLLM[:3],
                                "trainer.mode=one_step_off", "trainer.test_freq=0", "actor.optim.lr=1e-4"))
    assert_the_tools_demo_learned(summary, output)
