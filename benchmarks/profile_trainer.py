"""Where one actor update's time goes: a `torch.profiler` trace of `update_actor` on one rank, as `asyncrl bench
trainer` sets it up (random-weight model, synthetic rows), summarised as the device-busy fraction and the top
operators by self device time and by self host time.

    python benchmarks/profile_trainer.py --model qwen2.5-0.5b --device cuda [--cuda-graphs] --out trace_dir

The device-busy fraction (kernel time over wall time) says whether an update is bound by the GPU or by the
host launching work for it: a path far under its MFU target with a low busy fraction waits on Python, FSDP's
per-parameter bookkeeping or launches, not on arithmetic.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from asyncrl.bench.trainer import synchronize, update_setup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-0.5b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--micro-tokens", type=int, default=4096)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--num-micro-batches", type=int, default=8)
    parser.add_argument("--cuda-graphs", action="store_true")
    parser.add_argument("--out", default="outputs/bench/profile_trainer")
    options = parser.parse_args()
    worker, batch, spec = update_setup(options.model, options.micro_tokens, options.seq_len,
                                       options.num_micro_batches, False, options.device, total_steps=8,
                                       cuda_graphs=options.cuda_graphs)
    for _ in range(2):   # warm-up: allocator, kernels, graphs
        worker.update_actor(batch, spec)
    synchronize(worker.device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if options.device == "cuda" else [])
    with profile(activities=activities) as trace:
        started = time.perf_counter()
        worker.update_actor(batch, spec)
        synchronize(worker.device)
        wall = time.perf_counter() - started
    events = trace.key_averages()
    # Kernels alone (an operator's row repeats the time of the kernels it launched).
    device_time = sum(event.device_time for event in trace.events()
                      if event.device_type == torch.autograd.DeviceType.CUDA) / 1e6
    name = f"{options.model}{'_graphs' if options.cuda_graphs else ''}"
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    by_device = events.table(sort_by="self_device_time_total", row_limit=25, max_name_column_width=60)
    by_host = events.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60)
    (out / f"{name}.txt").write_text(f"{by_device}\n\n{by_host}\n")
    summary = {"model": options.model, "cuda_graphs": options.cuda_graphs, "wall_s": wall,
               "device_busy_s": device_time, "device_busy_fraction": device_time / wall,
               "host_ops": sum(event.count for event in events if event.self_cpu_time_total > 0)}
    (out / f"{name}.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(by_device[:6000])
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
