"""LoRA sizes and costs behind docs/benchmarks.md's LoRA rows and docs/lora.md's merge-or-not choice.

    python benchmarks/lora_cpu.py --out benchmarks/results/lora_cpu.json

Per model shape, with and without LoRA (rank 8, all-linear):
- bytes per weight sync: the transfer plan's payload in the engine's dtype (fp32 on CPU; bf16 for the GPU
  shapes, counted on the meta device, nothing run);
- trainer memory (CPU shapes): one trainer rank doing two PPO updates in a fresh process: `trainer/state_bytes`
  (parameter shards + gradients + Adam moments + a reference model where KL needs one) and the process's peak RSS;
- the engine's cost of unmerged adapters: greedy decoding of the same requests with adapters (unmerged) and
  without (what a merged engine runs), and the time a merge-on-receipt would take per sync (W + s B A for
  every adapted projection, from a kept copy of the base weights) and the memory that copy needs.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from asyncrl.bench.trainer_ranks import run_ranks
from asyncrl.config import load_config
from asyncrl.engine import EngineConfig, GenerationRequest, LLMEngine, SamplingParams
from asyncrl.data.demo_tasks import MODEL_SHAPE
from asyncrl.models import CausalLM, build_tiny_model, tiny_config
from asyncrl.models.adapted import load_policy
from asyncrl.models.lora import LoRASpec, add_adapters, count_parameters, is_adapter_name, merge_adapters
from asyncrl.train import PolicyUpdateSpec, TrainBatch, TrainerWorker

LORA = LoRASpec(rank=8, alpha=16.0)
CPU_SHAPES = {"demo": dict(MODEL_SHAPE), "cpu-mid": dict(hidden_size=512, num_layers=4, num_heads=8, num_kv_heads=2,
                                                          max_position_embeddings=256)}
# Qwen2.5 shapes (vocab 151,936, tied head for 0.5B/1.5B), counted only.
GPU_SHAPES = {"qwen2.5-0.5b": dict(hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, intermediate_size=4864,
                                   vocab_size=151936),
              "qwen2.5-1.5b": dict(hidden_size=1536, num_layers=28, num_heads=12, num_kv_heads=2,
                                   intermediate_size=8960, vocab_size=151936)}


def sync_bytes(shape: dict, itemsize: int) -> dict[str, int]:
    with torch.device("meta"):
        model = CausalLM(tiny_config(**shape))
        full = sum(parameter.numel() for parameter in model.parameters())
        add_adapters(model, LORA)
    trainable, _ = count_parameters(model)
    return {"full_params": full, "adapter_params": trainable, "sync_bytes_full": full * itemsize,
            "sync_bytes_lora": trainable * itemsize}


def trainer_rank(rank: int, world_size: int, port: int, folder: str, lora: bool) -> dict:
    overrides = [f"model.path={folder}", "trainer.device=cpu", "data.train_batch_size=16", "rollout.n=4",
                 "actor.ppo_mini_batch_size=16", "actor.ppo_micro_batch_size_per_gpu=64",
                 "algorithm.use_kl_in_reward=true"] + (["model.lora_rank=8", "model.lora_alpha=16"] if lora else [])
    config = load_config(None, overrides)
    worker = TrainerWorker(config, rank, world_size, "127.0.0.1", port, total_training_steps=10)
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(6, 60, (12,), generator=generator).tolist() for _ in range(64)]
    responses = [torch.randint(6, 60, (24,), generator=generator).tolist() for _ in range(64)]
    batch = TrainBatch.from_sequences(prompts, responses, [index // 4 for index in range(64)])
    log_probs, _ = worker.compute_log_prob(batch)
    batch = batch.replace(old_log_probs=log_probs, advantages=torch.randn(batch.response_mask.shape,
                                                                         generator=generator) * batch.response_mask)
    metrics = {}
    for _ in range(2):
        metrics = worker.update_actor(batch, PolicyUpdateSpec.from_config(config, batch.num_rows, step=0))
    return {"trainer_state_bytes": metrics["trainer/state_bytes"], "weight_sync_bytes": metrics["weight_sync/bytes"],
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def engine_decode_s(folder: str, spec: LoRASpec | None, num_requests: int, num_tokens: int, repeats: int) -> float:
    model = load_policy(folder, spec, torch.float32, torch.device("cpu"))
    if spec is not None:  # trained-looking adapters (B nonzero), so no shortcut could hide their cost
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if is_adapter_name(name):
                    parameter.normal_(0, 0.02)
    engine = LLMEngine(model, EngineConfig(device="cpu", num_kv_blocks=512))
    times = []
    for repeat in range(repeats):
        requests = [GenerationRequest(f"{repeat}-{index}", [5 + index % 40, 9, 11],
                                      SamplingParams(temperature=0.0, max_new_tokens=num_tokens, ignore_eos=True))
                    for index in range(num_requests)]
        started = time.perf_counter()
        engine.generate(requests)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def merge_cost(folder: str) -> dict[str, float]:
    """What merge-on-receipt would cost an engine per sync: W = W_base + s B A for every adapted projection."""
    model = load_policy(folder, LORA, torch.float32, torch.device("cpu"))
    state = {name: parameter.detach() for name, parameter in model.named_parameters()}
    base_copy = {name: tensor.clone() for name, tensor in state.items()
                 if name.replace(".weight", ".lora_A.weight") in state}
    times = []
    for _ in range(5):
        started = time.perf_counter()
        merged = merge_adapters(state, LORA)
        for name in base_copy:
            state[name].copy_(merged[name])
        times.append(time.perf_counter() - started)
    return {"merge_s": statistics.median(times),
            "kept_base_bytes": sum(tensor.numel() * tensor.element_size() for tensor in base_copy.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="lora_cpu.json")
    args = parser.parse_args()
    torch.set_num_threads(2)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    results = {"commit": commit, "date": time.strftime("%Y-%m-%d"), "lora": vars(LORA) | {"targets": LORA.targets},
               "shapes": {}}
    with tempfile.TemporaryDirectory() as root:
        for name, shape in CPU_SHAPES.items():
            folder = str(build_tiny_model(Path(root) / name, family="qwen2", seed=0, **shape))
            row = sync_bytes(shape, 4)
            for lora in (False, True):
                (measured,) = run_ranks(trainer_rank, 1, folder, lora, num_threads=2)
                row |= {f"{key}_{'lora' if lora else 'full'}": value for key, value in measured.items()}
            num_tokens = 32
            row["decode_s_no_adapters"] = engine_decode_s(folder, None, 32, num_tokens, 3)
            row["decode_s_unmerged"] = engine_decode_s(folder, LORA, 32, num_tokens, 3)
            row |= merge_cost(folder)
            results["shapes"][name] = row
            print(name, json.dumps(row, indent=1), flush=True)
    for name, shape in GPU_SHAPES.items():
        results["shapes"][name] = sync_bytes(shape, 2) | {"trainer_memory": "not measured: no GPU lent"}
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
