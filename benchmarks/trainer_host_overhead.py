"""The host's share of an actor update: the update of a model with a 0.5B model's depth (24 layers) but
widths so small that its arithmetic is negligible, on the CPU, so what is timed is Python, autograd, FSDP
hooks and dispatch, the work a GPU update waits on when it is host-bound.

    python benchmarks/trainer_host_overhead.py [--compile aot_eager|inductor]

Same micro-batching as `asyncrl.bench.trainer`'s default (8 micro-batches, 4 rows each), shorter rows.
"""

import argparse
import tempfile
import time
from pathlib import Path

import torch

from asyncrl.bench.trainer import synthetic_batch
from asyncrl.bench.trainer_ranks import free_port
from asyncrl.config import load_config
from asyncrl.models import build_tiny_model, compile_decoder_layers, read_config
from asyncrl.train import PolicyUpdateSpec, TrainerWorker


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--compile", default=None, help="a torch.compile backend for the decoder layers")
    parser.add_argument("--updates", type=int, default=5)
    options = parser.parse_args()
    torch.set_num_threads(1)
    folder = build_tiny_model(Path(tempfile.mkdtemp()) / "model", family="qwen2", num_layers=options.layers,
                              hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2)
    rows, seq_len = 32, 64
    config = load_config(None, [
        f"model.path={folder}", "trainer.device=cpu", "rollout.n=1", "algorithm.adv_estimator=reinforce_plus_plus",
        f"data.train_batch_size={rows}", f"actor.ppo_mini_batch_size={rows}", "actor.use_dynamic_bsz=true",
        f"actor.ppo_max_token_len_per_gpu={4 * seq_len}", f"data.max_response_length={seq_len}"])
    worker = TrainerWorker(config, 0, 1, "127.0.0.1", free_port(), total_training_steps=options.updates + 2)
    if options.compile:
        compile_decoder_layers(worker.actor.model, backend=options.compile)
    batch = synthetic_batch(rows, seq_len, read_config(folder)[0].vocab_size)
    spec = PolicyUpdateSpec.from_config(config, rows, step=0)
    for _ in range(2):  # warm-up (and compilation)
        worker.update_actor(batch, spec)
    seconds = []
    for _ in range(options.updates):
        started = time.perf_counter()
        worker.update_actor(batch, spec)
        seconds.append(time.perf_counter() - started)
    print(f"{options.layers} layers, 8 micro-batches, compile={options.compile}: update {min(seconds):.3f} s "
          f"(best of {options.updates}), median {sorted(seconds)[len(seconds) // 2]:.3f} s")


if __name__ == "__main__":
    main()
