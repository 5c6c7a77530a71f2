"""Where the bench's decode steps spend their time, step by step: the host's pace against the GPU's work.

    python benchmarks/engine_step_times.py [--model qwen2.5-0.5b] [--output-dir DIR] [--windows ...] [--gc off]

Runs `asyncrl bench engine`'s default workload (256 requests, prompts 128-1024, 1024 new tokens, the same engine
config) and records every decode step's wall time and attended positions. In a few windows of the decode phase it
also profiles 10 steps for their GPU busy time and the decode-attention kernel's time per layer. The question it
answers: the bench's mean decode step is longer than `benchmarks/profile_engine.py`'s at the same mean context;
is that host time the GPU waits through, or GPU work that grows with the contexts of late steps?
It also fits the step's wall time as fixed + marginal x mean context (over the deciles' medians): the marginal
term is the KV bandwidth attention reaches, the fixed term what every step costs however short its contexts
(weights, kernel launches and tails, the sampler), and from both the mean context at which the steps would reach
50% of the datasheet roofline. Last, the steps well above that fit (host stalls, or anything else that is not the
step's own work). Writes `step_times.json` and `step_times.png` to `--output-dir`.

Answers so far (one H200, docs/benchmarks.md): the fit is ~1.42-1.44 ms + ~0.72-0.74 us per position; without
profiled windows (`--windows` with no value) the stalls are 0.3-0.7% of the decode time, with the garbage
collector on or off (fifteenth round).
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from asyncrl.bench.engine import H200_BANDWIDTH, make_workload, warm_up_requests
from asyncrl.bench.models import qwen2_config, random_model
from asyncrl.core.lengths import LengthDistribution
from asyncrl.engine import EngineConfig, LLMEngine
from asyncrl.engine.kv_cache import bytes_per_block
from asyncrl.models import iter_named_tensors
from asyncrl.telemetry.plots import new_figure, save_figure

PROFILED_STEPS = 10
NUM_REQUESTS = 256  # the bench's default workload, all decoding together


def profiled_window(engine: LLMEngine, num_layers: int) -> dict:
    """GPU busy ms per step and attention-kernel us per layer over PROFILED_STEPS decode steps."""
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        for _ in range(PROFILED_STEPS):
            engine.step()
        torch.cuda.synchronize()
    events = profiler.key_averages()
    busy = sum(event.self_device_time_total for event in events) / 1e3 / PROFILED_STEPS
    attention = sum(event.self_device_time_total for event in events if "paged_decode" in event.key)
    return {"gpu_busy_ms": busy, "attention_us_per_layer": attention / PROFILED_STEPS / num_layers}


def record_decode_steps(engine: LLMEngine, windows: list[int], num_layers: int) -> tuple[np.ndarray, np.ndarray, list]:
    """Runs the engine to the end: each decode step's wall ms and attended positions, and the profiled windows
    (taken after the given numbers of decode steps; their steps are left out of the record)."""
    walls, contexts, profiled = [], [], []
    windows_left = sorted(windows)
    torch.cuda.synchronize()
    while engine.has_unfinished():
        if windows_left and len(walls) == windows_left[0]:
            windows_left.pop(0)
            profiled.append({"after_step": len(walls), "wall_ms_before": 1e3 * float(np.mean(walls[-PROFILED_STEPS:])),
                             "context_per_sequence": contexts[-1] / NUM_REQUESTS,
                             **profiled_window(engine, num_layers)})
            print(profiled[-1], flush=True)
            continue
        start = time.perf_counter()
        engine.step()
        wall = time.perf_counter() - start
        summary = engine.last_step
        if summary is not None and not summary.is_prefill:
            walls.append(wall)
            contexts.append(summary.num_context_tokens)
    return 1e3 * np.array(walls), np.array(contexts), profiled


def print_tenths_and_fit(walls_ms: np.ndarray, contexts: np.ndarray, roofline_ms: np.ndarray, weight_ms: float,
                         kv_ms_per_position: float) -> None:
    """Per tenth of the decode phase: mean context, wall ms and roofline fraction; then the fixed + marginal fit
    over the tenths' medians and the mean context at which the steps reach 50% of the roofline."""
    tenths = np.array_split(np.arange(len(walls_ms)), 10)
    print("decode steps | mean context | wall ms (median, mean, p99) | roofline fraction of the mean")
    for part in tenths:
        print(f"{part[0]:4d}-{part[-1]:4d} | {contexts[part].mean() / NUM_REQUESTS:7.0f} | "
              f"{np.median(walls_ms[part]):.3f} {walls_ms[part].mean():.3f} {np.percentile(walls_ms[part], 99):.3f} | "
              f"{roofline_ms[part].sum() / walls_ms[part].sum():.4f}")
    print(f"all {len(walls_ms)} decode steps: mean {walls_ms.mean():.3f} ms, median {np.median(walls_ms):.3f} ms, "
          f"fraction {roofline_ms.sum() / walls_ms.sum():.4f} (profiled windows excluded)")
    mean_contexts = np.array([contexts[part].mean() / NUM_REQUESTS for part in tenths])
    slope, fixed = np.polyfit(mean_contexts, [np.median(walls_ms[part]) for part in tenths], 1)
    if 2 * kv_ms_per_position > slope:
        half_context = (fixed - 2 * weight_ms) / (2 * kv_ms_per_position - slope)
    else:
        half_context = float("inf")
    print(f"step = {fixed:.3f} ms fixed + {1e3 * slope:.3f} us per position of mean context (KV at "
          f"{kv_ms_per_position / slope * H200_BANDWIDTH / 1e12:.2f} TB/s); the roofline's fixed part (weights) "
          f"is {weight_ms:.3f} ms; 50% of the roofline from a mean context of {half_context:.0f}")


def print_stalls(walls_ms: np.ndarray, contexts: np.ndarray, threshold_ms: float = 0.3) -> None:
    """Steps more than `threshold_ms` above a straight-line fit of wall time against context: the host stalls
    (or anything else that is not the step's own work), with their step numbers."""
    slope, fixed = np.polyfit(contexts, walls_ms, 1)
    excess = walls_ms - (fixed + slope * contexts)
    stalled = np.flatnonzero(excess[1:-1] > threshold_ms) + 1  # the first and last steps have reasons of their own
    print(f"stalls: {len(stalled)} steps over {threshold_ms} ms above the fit, {excess[stalled].sum():.1f} ms in all "
          f"({excess[stalled].sum() / walls_ms.sum():.2%} of the decode time); steps "
          + ", ".join(f"{step} (+{excess[step]:.2f})" for step in stalled))


def plot_steps(walls_ms: np.ndarray, roofline_ms: np.ndarray, path: Path) -> None:
    figure, (axis,) = new_figure()
    axis.plot(walls_ms, linewidth=0.6, label="decode step wall (ms)")
    axis.plot(2 * roofline_ms, linewidth=1.0, label="twice the datasheet roofline (the 50% target)")
    axis.set_xlabel("decode step")
    axis.set_ylabel("ms")
    axis.legend()
    save_figure(figure, path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen2.5-0.5b")
    parser.add_argument("--windows", type=int, nargs="*", default=[100, 500, 900],
                        help="decode steps after which 10 steps are profiled")
    parser.add_argument("--output-dir", type=Path, default=Path("."))
    parser.add_argument("--gc", choices=("on", "off"), default="on",
                        help="off: Python's cyclic garbage collector disabled over the decode phase (do the host "
                             "stalls go with it?)")
    options = parser.parse_args()
    model = random_model(qwen2_config(options.model), torch.bfloat16, "cuda")
    requests = make_workload(NUM_REQUESTS, LengthDistribution.parse("128:1024"), LengthDistribution.parse("1024"),
                             model.config.vocab_size, seed=0)
    engine = LLMEngine(model, EngineConfig(device="cuda", dtype=torch.bfloat16, max_num_seqs=NUM_REQUESTS,
                                           max_num_batched_tokens=8192, gpu_memory_utilization=0.8))
    engine.warm_up()
    engine.generate(warm_up_requests(requests, engine.config.max_num_batched_tokens))
    for item in requests:
        engine.add_request(item)
    if options.gc == "off":
        gc.disable()
    walls_ms, contexts, windows = record_decode_steps(engine, options.windows, model.config.num_hidden_layers)
    gc.enable()
    print_stalls(walls_ms, contexts)
    weight_bytes = sum(tensor.numel() * tensor.element_size() for _, tensor in iter_named_tensors(model))
    kv_bytes = bytes_per_block(model.config, 1, torch.bfloat16)
    roofline_ms = 1e3 * (weight_bytes + contexts * kv_bytes) / H200_BANDWIDTH
    print_tenths_and_fit(walls_ms, contexts, roofline_ms, 1e3 * weight_bytes / H200_BANDWIDTH,
                         1e3 * NUM_REQUESTS * kv_bytes / H200_BANDWIDTH)
    options.output_dir.mkdir(parents=True, exist_ok=True)
    (options.output_dir / "step_times.json").write_text(json.dumps(
        {"wall_ms": walls_ms.tolist(), "context_tokens": contexts.tolist(), "roofline_ms": roofline_ms.tolist(),
         "windows": windows}))
    plot_steps(walls_ms, roofline_ms, options.output_dir / "step_times.png")


if __name__ == "__main__":
    main()
