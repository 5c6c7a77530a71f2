"""`asyncrl bench modes` says up front what it will run and for about how long, and keeps nothing in /tmp."""

import argparse

from asyncrl.bench import modes


def options(**overrides):
    values = dict(modes=list(modes.MODES), device="cpu", devices=2, model="tiny", samples=2048, n=4,
                  prompts_per_step=32, rollout_backend="auto")
    return argparse.Namespace(**{**values, **overrides})


def test_the_default_cpu_workload_gets_an_estimate_in_minutes():
    text = modes.plan(options())
    # 5 runs x (20 s start-up + 2048 samples at 100 samples/s) = 202 s, said in minutes
    assert text.startswith("[bench modes] 5 training runs (sync, one_step_off, fully_async, fully_async_stale, "
                           "fully_async_partial), each 2048 samples in 16 steps on 2 cpu devices")
    assert text.endswith("about 3 min on 2 cores (a busy machine takes longer)")


def test_a_workload_without_a_measured_rate_says_when_it_will_know():
    text = modes.plan(options(device="cuda", model="qwen2.5-0.5b", modes=["sync"]))
    assert "1 training run (sync)" in text
    assert text.endswith("the time left is estimated once the first run has finished")


def test_short_estimates_read_in_seconds():
    assert modes.format_minutes(45.0) == "45 s" and modes.format_minutes(600.0) == "10 min"


def test_a_single_length_budget_reaches_the_config_as_text(tmp_path):
    # `--lengths 512` is one budget for every request; unquoted, YAML would hand the config the number 512.
    config = modes.mode_config("sync", tmp_path / "model", tmp_path / "train.parquet", tmp_path / "val.parquet",
                               tmp_path / "run", options(lengths="512", rollout_devices=1, max_response_length=512,
                                                         micro_batch=16, overrides=[]))
    assert config.rollout.length_distribution == "512"


def test_the_vllm_backend_gives_every_mode_replicas_on_the_rollout_devices(tmp_path):
    def config(mode, backend):
        return modes.mode_config(mode, tmp_path / "model", tmp_path / "train.parquet", tmp_path / "val.parquet",
                                 tmp_path / "run", options(rollout_backend=backend, lengths="24", rollout_devices=1,
                                                           max_response_length=32, micro_batch=16, overrides=[]))
    assert (config("sync", "auto").rollout.backend, config("sync", "auto").trainer.n_gpus_per_node) == ("auto", 2)
    assert (config("sync", "vllm").rollout.backend, config("sync", "vllm").trainer.n_gpus_per_node) == ("vllm", 1)
    assert config("fully_async", "vllm").rollout.backend == "vllm"
    assert config("fully_async", "ray_replicas").rollout.backend == "ray_replicas"
