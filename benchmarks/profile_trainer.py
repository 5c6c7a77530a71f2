"""Where an actor update's time goes: host vs GPU, and the top GPU kernels.

    python benchmarks/profile_trainer.py --model qwen2.5-0.5b --micro-tokens 4096 --seq-len 1024
Prints the wall time of one `update_actor`, the GPU busy time, and the kernels that take the most of it.
"""

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from asyncrl.bench.models import qwen2_config, write_random_model
from asyncrl.bench.trainer import free_port, synthetic_batch
from asyncrl.config import load_config
from asyncrl.train import PolicyUpdateSpec, TrainerWorker


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen2.5-0.5b")
    parser.add_argument("--micro-tokens", type=int, default=4096)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--num-micro-batches", type=int, default=8)
    parser.add_argument("--rows", type=int, default=40)
    parser.add_argument("overrides", nargs="*")
    options = parser.parse_args()
    import tempfile
    from pathlib import Path
    folder = write_random_model(options.model, Path(tempfile.mkdtemp()) / options.model)
    num_rows = options.num_micro_batches * (options.micro_tokens // options.seq_len)
    config = load_config(None, [
        f"model.path={folder}", "trainer.device=cuda", "model.dtype=bfloat16", "rollout.n=1",
        "algorithm.adv_estimator=reinforce_plus_plus", f"data.train_batch_size={num_rows}",
        f"actor.ppo_mini_batch_size={num_rows}", "actor.use_dynamic_bsz=true",
        f"actor.ppo_max_token_len_per_gpu={options.micro_tokens}", f"data.max_response_length={options.seq_len}",
        "actor.optim.lr=1e-6", *options.overrides])
    worker = TrainerWorker(config, 0, 1, "127.0.0.1", free_port(), total_training_steps=10)
    batch = synthetic_batch(num_rows, options.seq_len, qwen2_config(options.model).vocab_size)
    spec = PolicyUpdateSpec.from_config(config, num_rows, step=0)
    worker.update_actor(batch, spec)
    torch.cuda.synchronize()
    started = time.perf_counter()
    worker.update_actor(batch, spec)
    torch.cuda.synchronize()
    wall = time.perf_counter() - started
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        worker.update_actor(batch, spec)
        torch.cuda.synchronize()
    events = profiler.key_averages()
    gpu_total = sum(event.self_device_time_total for event in events) / 1e3
    print(f"update_actor: wall {wall * 1e3:.1f} ms, GPU busy {gpu_total:.1f} ms "
          f"({num_rows} rows x {options.seq_len} tokens, {options.num_micro_batches} micro-batches)")
    print(events.table(sort_by="self_device_time_total", row_limit=options.rows, max_name_column_width=70))
    print(events.table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=70))


if __name__ == "__main__":
    main()
