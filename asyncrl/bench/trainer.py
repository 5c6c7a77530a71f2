"""Actor-update throughput and MFU of the trainer worker, and its peak memory.

    python -m asyncrl.bench.trainer --model qwen2.5-0.5b --micro-tokens 4096 --seq-len 1024 \
        --num-micro-batches 8 [--gradient-checkpointing] --output benchmarks/results/trainer.json

One trainer rank (the same `TrainerWorker` a run uses, FSDP2 over one device, bf16 compute with fp32
master weights) runs `update_actor` on synthetic rows of `seq-len` tokens (an eighth of them prompt),
packed into micro-batches of `micro-tokens` tokens. Model FLOPs per update are counted from the shapes:
6 x (linear-layer parameters) per token, the LM head on response tokens only (that is all the trainer
computes), and causal attention 6 x 2 x layers x hidden x (average context) per token. MFU divides by the
dense bf16 peak (989 TFLOP/s for an H200 SXM, by the datasheet).
"""

from __future__ import annotations

import argparse
import json
import socket
import tempfile
import time
from pathlib import Path

import torch

from asyncrl.bench.models import qwen2_config, write_random_model
from asyncrl.bench.results import append_result
from asyncrl.config import load_config
from asyncrl.models import TransformerConfig
from asyncrl.train import PolicyUpdateSpec, TrainBatch, TrainerWorker

H200_BF16_PEAK_FLOPS = 989e12


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
    return batch.replace(advantages=advantages, old_log_probs=torch.full_like(advantages, -11.0) * batch.response_mask)


def update_setup(model: str, micro_tokens: int, seq_len: int, num_micro_batches: int, gradient_checkpointing: bool,
                 device: str, total_steps: int) -> tuple[TrainerWorker, TrainBatch, PolicyUpdateSpec]:
    """One trainer rank on a random-weight model and a synthetic batch of `num_micro_batches` micro-batches of
    `micro_tokens` tokens (rows of `seq_len`), with the update spec `update_actor` takes."""
    folder = write_random_model(model, Path(tempfile.mkdtemp()) / model)
    num_rows = num_micro_batches * (micro_tokens // seq_len)
    config = load_config(None, [
        f"model.path={folder}", f"trainer.device={device}", f"model.dtype={'bfloat16' if device == 'cuda' else 'float32'}",
        f"model.gradient_checkpointing={str(gradient_checkpointing).lower()}", "rollout.n=1",
        "algorithm.adv_estimator=reinforce_plus_plus", f"data.train_batch_size={num_rows}",
        f"actor.ppo_mini_batch_size={num_rows}", "actor.use_dynamic_bsz=true",
        f"actor.ppo_max_token_len_per_gpu={micro_tokens}", f"data.max_response_length={seq_len}",
        "actor.optim.lr=1e-6"])
    worker = TrainerWorker(config, 0, 1, "127.0.0.1", free_port(), total_training_steps=total_steps)
    batch = synthetic_batch(num_rows, seq_len, qwen2_config(model).vocab_size)
    return worker, batch, PolicyUpdateSpec.from_config(config, num_rows, step=0)


def run_trainer_benchmark(model: str = "qwen2.5-0.5b", micro_tokens: int = 4096, seq_len: int = 1024,
                          num_micro_batches: int = 8, gradient_checkpointing: bool = False, num_updates: int = 3,
                          peak_flops: float = H200_BF16_PEAK_FLOPS, device: str = "cuda") -> dict:
    worker, batch, spec = update_setup(model, micro_tokens, seq_len, num_micro_batches, gradient_checkpointing,
                                       device, total_steps=num_updates + 1)
    num_rows = batch.num_rows
    is_cuda = device == "cuda"
    worker.update_actor(batch, spec)  # warm-up: allocator, kernels
    if is_cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    for _ in range(num_updates):
        worker.update_actor(batch, spec)
    if is_cuda:
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - started) / num_updates
    flops = update_flops(qwen2_config(model), num_rows, seq_len, seq_len - seq_len // 8)
    return {
        "model": model, "micro_tokens": micro_tokens, "seq_len": seq_len, "rows": num_rows,
        "gradient_checkpointing": gradient_checkpointing, "seconds_per_update": seconds,
        "tokens_per_s": num_rows * seq_len / seconds, "tflops": flops / seconds / 1e12,
        "mfu": flops / seconds / peak_flops,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if is_cuda else None,
        "device": torch.cuda.get_device_name() if is_cuda else "cpu", "torch": torch.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen2.5-0.5b")
    parser.add_argument("--micro-tokens", type=int, default=4096)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--num-micro-batches", type=int, default=8)
    parser.add_argument("--num-updates", type=int, default=3)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--output", default=None, help="append the result as one JSON line to this file")
    options = parser.parse_args(argv)
    result = run_trainer_benchmark(options.model, options.micro_tokens, options.seq_len, options.num_micro_batches,
                                   options.gradient_checkpointing, options.num_updates, device=options.device)
    print(json.dumps(result, indent=1))
    if options.output:
        append_result(options.output, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
