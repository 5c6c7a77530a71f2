"""The engine benchmark on a tiny folder (CPU): workload shapes, token accounting, roofline arithmetic."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from asyncrl.bench.engine import LengthDistribution, main, make_workload, run_engine_benchmark, warm_up_requests
from asyncrl.bench.models import qwen2_config
from asyncrl.models import CausalLM, char_vocab_size


@pytest.mark.parametrize("name,num_parameters", [("qwen2.5-0.5b", 494_032_768), ("qwen2.5-1.5b", 1_543_714_304)])
def test_qwen2_configs_have_the_published_parameter_counts(name, num_parameters):
    with torch.device("meta"):
        model = CausalLM(qwen2_config(name))
    assert sum(parameter.numel() for parameter in model.parameters()) == num_parameters


def test_the_cpu_model_is_the_side_by_sides_shape_with_the_character_vocabulary():
    config = qwen2_config("cpu-3m")
    with torch.device("meta"):
        model = CausalLM(config)
    per_layer = (256 * 256 + 256) + 2 * (256 * 128 + 128) + 256 * 256 + 3 * 256 * 688 + 2 * 256  # q, k, v, o, MLP, norms
    assert config.vocab_size == char_vocab_size()
    assert sum(parameter.numel() for parameter in model.parameters()) == 4 * per_layer + config.vocab_size * 256 + 256


def test_length_distributions():
    generator = np.random.default_rng(0)
    assert LengthDistribution.parse("64").sample(3, generator).tolist() == [64, 64, 64]
    uniform = LengthDistribution.parse("8:12").sample(500, generator)
    assert uniform.min() == 8 and uniform.max() == 12
    tail = LengthDistribution.parse("lognormal:100:400:1.0").sample(5000, generator)
    assert tail.max() == 400 and 80 <= np.median(tail) <= 120 and tail.mean() > np.median(tail)
    with pytest.raises(ValueError, match="lognormal"):
        LengthDistribution.parse("normal:3")


def test_warm_up_fills_one_full_prefill_step_with_the_workloads_prompts():
    requests = make_workload(10, LengthDistribution.parse("100"), LengthDistribution.parse("50"), 1000, seed=0)
    warm = warm_up_requests(requests, num_batched_tokens=350)
    assert len(warm) == 4  # 3 x 100 tokens fall short of the 350-token step
    assert all(np.array_equal(item.prompt_ids, source.prompt_ids) for item, source in zip(warm, requests))
    assert {item.params.max_new_tokens for item in warm} == {4}
    assert len({item.request_id for item in warm} | {item.request_id for item in requests}) == 14
    assert len(warm_up_requests(requests, num_batched_tokens=1)) == 2  # two rows even when one fills the step


def test_benchmark_counts_tokens_and_computes_the_roofline(tiny_folder, tmp_path, capsys):
    output = tmp_path / "engine.json"
    assert main(["--model", str(tiny_folder), "--num-requests", "6", "--prompt-lengths", "4:9",
                 "--output-lengths", "lognormal:8:20", "--device", "cpu", "--compare-transformers",
                 "--output", str(output)]) == 0
    result = json.loads(output.read_text())
    assert "speedup vs transformers" in capsys.readouterr().out
    rerun = run_engine_benchmark(tiny_folder, num_requests=6, prompt_lengths="4:9", output_lengths="lognormal:8:20",
                                 device="cpu")
    engine, reference = result["engine"], result["transformers"]
    # Same seed, same workload: every request generates exactly its budget in both systems.
    assert engine["generated_tokens"] == reference["generated_tokens"] == rerun["engine"]["generated_tokens"]
    assert engine["tokens_per_s"] > 0 and reference["tokens_per_s"] > 0
    roofline = engine["roofline"]
    weight_bytes, kv_bytes = roofline["weight_bytes"], roofline["kv_bytes_per_token"]
    expected = (engine["num_decode_steps"] * weight_bytes + engine["num_context_tokens"] * kv_bytes) / 4.8e12
    assert roofline["roofline_seconds"] == pytest.approx(expected)
    assert roofline["fraction_of_roofline"] == pytest.approx(expected / engine["decode_seconds"])
    # 2 layers x 2 kv heads x head_dim 16 x (key + value) x 4 bytes.
    assert kv_bytes == 2 * 2 * 2 * 16 * 4
    assert engine["num_decode_steps"] > 0 and engine["mean_decode_batch"] >= 1.0
    # The layers that ran are recorded with the ones asked for: fp32 on CPU always runs the model's.
    assert (result["decode_products"], result["decode_layers"]) == ("auto", "torch")
