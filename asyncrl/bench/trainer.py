"""Actor-update throughput and MFU of trainer workers on one or more ranks, and peak memory per rank.

    python -m asyncrl.bench.trainer --model qwen2.5-0.5b --micro-tokens 4096 --seq-len 1024 \
        --num-micro-batches 8 [--gradient-checkpointing] [--world-size 2] [--output trainer.jsonl]
    python -m asyncrl.bench.trainer --model tiny-test --micro-tokens 128 --seq-len 64 --num-micro-batches 2 \
        --device cpu --world-size 2                                    # smoke test on CPU (gloo)
    asyncrl bench trainer --model cpu-3m --device cpu --micro-tokens 1152 --seq-len 72 --num-micro-batches 8 \
        --num-updates 4                 # the CPU trainer step: the TRL side by side's update (~1 min on 2 cores)

`world-size` trainer ranks (the same `TrainerWorker` a run uses, FSDP2 over the ranks, bf16 compute with
fp32 master weights) run `update_actor` on synthetic rows of `seq-len` tokens (an eighth of them prompt).
The global batch is `num-micro-batches` micro-batches of `micro-tokens` tokens whatever the world size: it is
split over the ranks as a run splits it (`shard_batch`), and each rank packs its share into micro-batches of
`micro-tokens` tokens (`actor.ppo_max_token_len_per_gpu`). One rank runs in this process; N > 1 ranks run one
spawned process each, rank r on cuda:r (on the CPU: all on the CPU, gloo). Model FLOPs per update are counted
from the shapes: 6 x (linear-layer parameters) per token, the LM head on response tokens only (that is all
the trainer computes), and causal attention 6 x 2 x layers x hidden x (average context) per token. Tokens/s
and TFLOP/s are global; MFU divides by N x the dense bf16 peak of one GPU (989 TFLOP/s for an H200 SXM, by
the datasheet). Peak memory is per rank (`torch.cuda.max_memory_allocated` over the timed updates; None on
the CPU, which has no allocator statistics). Each run appends its result as one JSON line to `--output`
(default `outputs/bench/trainer.jsonl`).
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from asyncrl.bench.models import qwen2_config, write_random_model
from asyncrl.bench.results import append_result, default_output
from asyncrl.bench.trainer_ranks import free_port, run_ranks
from asyncrl.config import AsyncRLConfig, load_config
from asyncrl.models import TransformerConfig
from asyncrl.train import PolicyUpdateSpec, TrainBatch, TrainerWorker, shard_batch

H200_BF16_PEAK_FLOPS = 989e12


@dataclass(frozen=True)
class TrainerBench:
    """What one benchmark run measures; every rank gets a copy."""
    model: str = "qwen2.5-0.5b"
    micro_tokens: int = 4096
    seq_len: int = 1024
    num_micro_batches: int = 8
    gradient_checkpointing: bool = False
    num_updates: int = 3
    device: str = "cuda"
    world_size: int = 1
    cuda_graphs: bool = False          # actor.cuda_graphs: the micro-batch step replayed from CUDA graphs

    def __post_init__(self) -> None:
        if self.micro_tokens < self.seq_len:
            raise ValueError(f"micro_tokens must be at least seq_len (a micro-batch holds whole rows), got "
                             f"{self.micro_tokens} and {self.seq_len}")
        if self.world_size < 1 or self.num_rows % self.world_size:
            raise ValueError(f"world_size must divide the global batch's rows (num_micro_batches x micro_tokens "
                             f"// seq_len), got {self.world_size} and {self.num_rows}")

    @property
    def num_rows(self) -> int:
        return self.num_micro_batches * (self.micro_tokens // self.seq_len)


def update_flops(config: TransformerConfig, num_rows: int, seq_len: int, response_len: int) -> float:
    """Training FLOPs (forward + backward = 3 x forward) of one pass over the rows."""
    hidden, layers = config.hidden_size, config.num_hidden_layers
    q_out = config.num_attention_heads * config.head_dim
    kv_out = config.num_key_value_heads * config.head_dim
    per_layer_linear = hidden * (q_out + 2 * kv_out) + q_out * hidden + 3 * hidden * config.intermediate_size
    tokens = num_rows * seq_len
    linear = 2 * per_layer_linear * layers * tokens
    head = 2 * hidden * config.vocab_size * num_rows * response_len
    attention = 2 * 2 * layers * q_out * (seq_len / 2) * tokens  # QK^T and AV over the causal half
    return 3 * (linear + head + attention)


def synthetic_batch(num_rows: int, seq_len: int, vocab_size: int) -> TrainBatch:
    prompt_len = seq_len // 8
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab_size, (num_rows, seq_len), generator=generator)
    batch = TrainBatch.from_sequences(ids[:, :prompt_len].tolist(), ids[:, prompt_len:].tolist(),
                                      list(range(num_rows)))
    advantages = torch.randn(num_rows, 1, generator=generator) * batch.response_mask
    # A random model's log-prob of any token is about -log(V): old log-probs there keep the PPO ratios near 1, so
    # the clip leaves the gradient (and its norm, a check that the update ran) in place whatever the vocabulary.
    old_log_probs = torch.full_like(advantages, -math.log(vocab_size)) * batch.response_mask
    return batch.replace(advantages=advantages, old_log_probs=old_log_probs)


def bench_config(folder: str | Path, bench: TrainerBench) -> AsyncRLConfig:
    """One mini-batch of the whole global batch; dynamic micro-batches of `micro_tokens` tokens per rank."""
    return load_config(None, [
        f"model.path={folder}", f"trainer.device={bench.device}",
        f"model.dtype={'bfloat16' if bench.device == 'cuda' else 'float32'}",
        f"model.gradient_checkpointing={str(bench.gradient_checkpointing).lower()}", "rollout.n=1",
        "algorithm.adv_estimator=reinforce_plus_plus", f"data.train_batch_size={bench.num_rows}",
        f"actor.ppo_mini_batch_size={bench.num_rows}", "actor.use_dynamic_bsz=true",
        f"actor.ppo_max_token_len_per_gpu={bench.micro_tokens}", f"data.max_response_length={bench.seq_len}",
        "actor.optim.lr=1e-6", f"actor.cuda_graphs={str(bench.cuda_graphs).lower()}"])


def update_setup(model: str, micro_tokens: int, seq_len: int, num_micro_batches: int, gradient_checkpointing: bool,
                 device: str, total_steps: int,
                 cuda_graphs: bool = False) -> tuple[TrainerWorker, TrainBatch, PolicyUpdateSpec]:
    """One trainer rank on a random-weight model and a synthetic batch of `num_micro_batches` micro-batches of
    `micro_tokens` tokens (rows of `seq_len`), with the update spec `update_actor` takes."""
    bench = TrainerBench(model, micro_tokens, seq_len, num_micro_batches, gradient_checkpointing, device=device,
                         cuda_graphs=cuda_graphs)
    config = bench_config(write_random_model(model, Path(tempfile.mkdtemp()) / model), bench)
    worker = TrainerWorker(config, 0, 1, "127.0.0.1", free_port(), total_training_steps=total_steps)
    batch = synthetic_batch(bench.num_rows, seq_len, qwen2_config(model).vocab_size)
    return worker, batch, PolicyUpdateSpec.from_config(config, bench.num_rows, step=0)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_updates(worker: TrainerWorker, shard: TrainBatch, spec: PolicyUpdateSpec,
                  num_updates: int) -> tuple[float, dict[str, float]]:
    """Seconds per update over `num_updates` updates after a warm-up one, and the last update's metrics
    (already reduced over ranks). The peak-memory statistics restart after the warm-up."""
    worker.update_actor(shard, spec)  # warm-up: allocator, kernels
    synchronize(worker.device)
    if worker.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(worker.device)
    dist.barrier()  # every rank starts the clock together
    started = time.perf_counter()
    for _ in range(num_updates):
        metrics = worker.update_actor(shard, spec)
    synchronize(worker.device)
    return (time.perf_counter() - started) / num_updates, metrics


def measure_rank(rank: int, world_size: int, port: int, folder: str, bench: TrainerBench) -> dict[str, Any]:
    """This rank's share of the global batch, timed; plain Python numbers only (they cross processes)."""
    if bench.device == "cuda":
        torch.cuda.set_device(rank)  # the worker trains on the current device
    owns_group = not dist.is_initialized()
    config = bench_config(folder, bench)
    worker = TrainerWorker(config, rank, world_size, "127.0.0.1", port, total_training_steps=bench.num_updates + 1)
    batch = synthetic_batch(bench.num_rows, bench.seq_len, qwen2_config(bench.model).vocab_size)
    spec = PolicyUpdateSpec.from_config(config, batch.num_rows, step=0)
    shard = shard_batch(batch, world_size, spec.num_mini_batches)[0][rank]
    seconds, metrics = timed_updates(worker, shard, spec, bench.num_updates)
    is_cuda = worker.device.type == "cuda"
    measurement = {
        "seconds_per_update": seconds, "metrics": metrics,
        "num_tokens": int((shard.prompt_lengths + shard.response_lengths).sum()),
        "peak_memory_gib": torch.cuda.max_memory_allocated(worker.device) / 2**30 if is_cuda else None,
        "device": torch.cuda.get_device_name(worker.device) if is_cuda else "cpu"}
    del worker
    if owns_group:
        dist.destroy_process_group()
    return measurement


def run_trainer_benchmark(model: str = "qwen2.5-0.5b", micro_tokens: int = 4096, seq_len: int = 1024,
                          num_micro_batches: int = 8, gradient_checkpointing: bool = False, num_updates: int = 3,
                          peak_flops: float = H200_BF16_PEAK_FLOPS, device: str = "cuda",
                          world_size: int = 1, cuda_graphs: bool = False) -> dict:
    bench = TrainerBench(model, micro_tokens, seq_len, num_micro_batches, gradient_checkpointing, num_updates,
                         device, world_size, cuda_graphs)
    folder = str(write_random_model(model, Path(tempfile.mkdtemp()) / model))
    if world_size == 1:
        ranks = [measure_rank(0, 1, free_port(), folder, bench)]  # in this process
    else:
        ranks = run_ranks(measure_rank, world_size, folder, bench)
    return bench_result(bench, ranks, peak_flops)


def bench_result(bench: TrainerBench, ranks: list[dict[str, Any]], peak_flops: float) -> dict:
    """One record from the ranks' measurements; rank 0's metrics stand for all (reduced over ranks)."""
    seconds = max(rank["seconds_per_update"] for rank in ranks)  # an update ends when its slowest rank does
    num_tokens = sum(rank["num_tokens"] for rank in ranks)
    flops = update_flops(qwen2_config(bench.model), bench.num_rows, bench.seq_len, bench.seq_len - bench.seq_len // 8)
    peaks = [rank["peak_memory_gib"] for rank in ranks]
    return {
        "model": bench.model, "world_size": bench.world_size, "micro_tokens": bench.micro_tokens,
        "seq_len": bench.seq_len, "rows": bench.num_rows, "tokens_per_update": num_tokens,
        "gradient_checkpointing": bench.gradient_checkpointing, "cuda_graphs": bench.cuda_graphs,
        "seconds_per_update": seconds,
        "tokens_per_s": num_tokens / seconds, "tflops": flops / seconds / 1e12,
        # A GPU's datasheet peak: no yardstick for a CPU, whose figure is its TFLOP/s alone.
        "mfu": flops / seconds / (peak_flops * bench.world_size) if bench.device == "cuda" else None,
        "peak_memory_gib": None if None in peaks else max(peaks), "peak_memory_gib_per_rank": peaks,
        "metrics": ranks[0]["metrics"], "device": ranks[0]["device"], "torch": torch.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    defaults = TrainerBench()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=defaults.model)
    parser.add_argument("--micro-tokens", type=int, default=defaults.micro_tokens)
    parser.add_argument("--seq-len", type=int, default=defaults.seq_len)
    parser.add_argument("--num-micro-batches", type=int, default=defaults.num_micro_batches,
                        help="micro-batches in the global batch (all ranks together)")
    parser.add_argument("--num-updates", type=int, default=defaults.num_updates)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--device", default=defaults.device)
    parser.add_argument("--world-size", type=int, default=defaults.world_size,
                        help="trainer ranks, one process and device each (cuda:0..N-1); the global batch stays "
                             "the same, split over them (default 1: in this process)")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="actor.cuda_graphs: one rank, each micro-batch step replayed from a CUDA graph")
    parser.add_argument("--output", default=default_output("trainer.jsonl"),
                        help="append the result as one JSON line to this file (default outputs/bench/trainer.jsonl)")
    options = parser.parse_args(argv)
    result = run_trainer_benchmark(options.model, options.micro_tokens, options.seq_len, options.num_micro_batches,
                                   options.gradient_checkpointing, options.num_updates, device=options.device,
                                   world_size=options.world_size, cuda_graphs=options.cuda_graphs)
    print(json.dumps(result, indent=1))
    print(f"appended the result to {append_result(options.output, result).resolve()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
