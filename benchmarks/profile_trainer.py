"""Where an actor update's time goes: host vs GPU, and the top GPU kernels.

    python benchmarks/profile_trainer.py --model qwen2.5-0.5b --micro-tokens 4096 --seq-len 1024 [--cuda-graphs] \
        [--trace trace.json]
Prints the wall time of one `update_actor`, the GPU time of its kernels, and the kernels that take most.
"""

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from asyncrl.bench.trainer import update_setup


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen2.5-0.5b")
    parser.add_argument("--micro-tokens", type=int, default=4096)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--num-micro-batches", type=int, default=8)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--cuda-graphs", action="store_true", help="actor.cuda_graphs: micro-batch steps replayed")
    parser.add_argument("--rows", type=int, default=40, help="kernels to list")
    parser.add_argument("--trace", help="also write the profiled update's Chrome trace (JSON) here")
    options = parser.parse_args()
    worker, batch, spec = update_setup(options.model, options.micro_tokens, options.seq_len,
                                       options.num_micro_batches, options.gradient_checkpointing, "cuda",
                                       total_steps=10, cuda_graphs=options.cuda_graphs)
    worker.update_actor(batch, spec)  # warm-up
    torch.cuda.synchronize()
    started = time.perf_counter()
    worker.update_actor(batch, spec)
    torch.cuda.synchronize()
    wall = time.perf_counter() - started
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        worker.update_actor(batch, spec)
        torch.cuda.synchronize()
    if options.trace:
        profiler.export_chrome_trace(options.trace)
    events = profiler.key_averages()
    print(f"update_actor: wall {wall * 1e3:.1f} ms ({batch.num_rows} rows x {options.seq_len} tokens, "
          f"{options.num_micro_batches} micro-batches); the kernels' GPU time is the table's Self CUDA total")
    print(events.table(sort_by="self_device_time_total", row_limit=options.rows, max_name_column_width=70))
    print(events.table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=70))


if __name__ == "__main__":
    main()
