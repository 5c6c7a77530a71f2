"""Engine throughput: our engine against `transformers.generate` on the same weights and workload.

    asyncrl bench engine --model qwen2.5-0.5b --num-requests 256 --prompt-lengths 128:1024 \
        --output-lengths 1024 --compare-transformers          # docs/benchmarks.md's workload
    python -m asyncrl.bench.engine --model qwen2.5-0.5b --output-lengths lognormal:256:2048 --output engine.jsonl
    asyncrl bench engine --model cpu-3m --device cpu --num-requests 128 --prompt-lengths 8 --output-lengths 64 \
        --compare-transformers                                # the CPU engine step (~1 min on 2 cores)
    result = run_engine_benchmark("qwen2.5-0.5b", num_requests=256, output_lengths="512")

`--model` is an HF folder or "qwen2.5-0.5b" / "qwen2.5-1.5b" / "cpu-3m" (the TRL side by side's 2.9M-parameter
CPU model, character vocabulary): a random-weight model of that shape built from a config (no download). Every request has its own token budget (`max_new_tokens`, `ignore_eos`), so
output lengths follow the chosen distribution: "256" (fixed), "64:512" (uniform), "lognormal:256:4096[:1.0]"
(median 256, capped at 4096, sigma 1.0: a long tail like RL responses).

Measured: generated tokens/s over the whole run (prefill included), decode tokens/s, peak device memory,
and the decode memory-bandwidth roofline: each decode step must read every weight once plus the KV of every
attended position, so roofline time = (steps x weight bytes + attended positions x KV bytes per position)
/ bandwidth, and the achieved fraction = roofline time / measured decode time. The bandwidth is the
datasheet's (`--bandwidth`, 4.8 TB/s for an H200); on CUDA the fraction is also given against the bandwidth
a large device-to-device copy reaches on the machine at start, the ceiling a kernel can actually reach.
transformers runs batched
with left padding and max_new_tokens = the largest budget; only the tokens each request would keep count.
Each run appends its result as one JSON line to `--output` (default `outputs/bench/engine.jsonl`).
"""

from __future__ import annotations

import argparse
import resource
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import transformers

from asyncrl.engine import EngineConfig, GenerationRequest, LLMEngine, SamplingParams
from asyncrl.engine.config import DECODE_ATTENTION_KERNELS, DECODE_PRODUCTS
from asyncrl.engine.kv_cache import bytes_per_block
from asyncrl.bench.models import BENCH_MODEL_NAMES, qwen2_config, random_model
from asyncrl.bench.results import append_result, default_output
from asyncrl.core.lengths import LengthDistribution
from asyncrl.models import CausalLM, TransformerConfig, iter_named_tensors, load_model

H200_BANDWIDTH = 4.8e12  # bytes/s of HBM3e on an H200


def make_workload(num_requests: int, prompt_lengths: LengthDistribution, output_lengths: LengthDistribution,
                  vocab_size: int, seed: int) -> list[GenerationRequest]:
    generator = np.random.default_rng(seed)
    prompt_sizes = prompt_lengths.sample(num_requests, generator)
    budgets = output_lengths.sample(num_requests, generator)
    return [GenerationRequest(f"bench-{index}", generator.integers(10, vocab_size - 10, size=int(size)),
                              SamplingParams(temperature=1.0, max_new_tokens=int(budget), ignore_eos=True, seed=index))
            for index, (size, budget) in enumerate(zip(prompt_sizes, budgets))]


def _synchronize(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _peak_memory_bytes(device: str) -> int:
    if torch.device(device).type == "cuda":
        return int(torch.cuda.max_memory_allocated())
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _reset_peak_memory(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats()


def warm_up_requests(requests: list[GenerationRequest], num_batched_tokens: int) -> list[GenerationRequest]:
    """The workload's first prompts, enough to fill one full prefill step (at least two), with 4 new tokens
    each. A full multi-row prefill compiles the graphs' specialisations and loads the kernels a real step
    needs: warmed up with two prompts only, the timed run's first prefill step took 260 ms instead of ~25 ms
    (0.5B on an H200)."""
    chosen, num_tokens = [], 0
    for item in requests:
        if len(chosen) >= 2 and num_tokens >= num_batched_tokens:
            break
        chosen.append(GenerationRequest(f"warm-up-{len(chosen)}", item.prompt_ids, SamplingParams(max_new_tokens=4)))
        num_tokens += item.prompt_ids.size
    return chosen


def measure_engine(engine: LLMEngine, requests: list[GenerationRequest], device: str) -> dict:
    """Runs the workload step by step; each step ends with its device-to-host copy, so host timing of a
    step covers its device work."""
    engine.warm_up()  # CUDA graphs of every bucket
    engine.generate(warm_up_requests(requests, engine.config.max_num_batched_tokens))
    _synchronize(device)
    _reset_peak_memory(device)
    for item in requests:
        engine.add_request(item)
    decode_seconds, num_decode_steps, num_decode_tokens, num_context_tokens, num_generated = 0.0, 0, 0, 0, 0
    prefill_seconds, num_prefill_steps, num_prefill_tokens = 0.0, 0, 0
    start = time.perf_counter()
    while engine.has_unfinished():
        step_start = time.perf_counter()
        num_generated += sum(result.num_response_tokens for result in engine.step())
        summary = engine.last_step
        if summary is None:
            continue
        if summary.is_prefill:
            prefill_seconds += time.perf_counter() - step_start
            num_prefill_steps += 1
            num_prefill_tokens += summary.num_computed_tokens
        else:
            decode_seconds += time.perf_counter() - step_start
            num_decode_steps += 1
            num_decode_tokens += summary.num_sequences
            num_context_tokens += summary.num_context_tokens
    _synchronize(device)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "generated_tokens": num_generated, "tokens_per_s": num_generated / seconds,
            "prefill_seconds": prefill_seconds, "num_prefill_steps": num_prefill_steps,
            "prefill_tokens_per_s": num_prefill_tokens / max(prefill_seconds, 1e-9),
            "decode_seconds": decode_seconds, "num_decode_steps": num_decode_steps,
            "decode_tokens_per_s": num_decode_tokens / max(decode_seconds, 1e-9),
            "mean_decode_batch": num_decode_tokens / max(num_decode_steps, 1),
            "num_context_tokens": num_context_tokens, "num_preemptions": engine.scheduler.num_preemptions,
            "peak_memory_bytes": _peak_memory_bytes(device), "kv_cache_tokens": engine.kv_capacity_tokens,
            "block_size": engine.config.block_size}


def decode_roofline(model: CausalLM, dtype: torch.dtype, measured: dict, bandwidth: float) -> dict:
    """Bytes a decode must read (weights once per step, KV of every attended position) over bandwidth."""
    weight_bytes = sum(tensor.numel() * tensor.element_size() for _, tensor in iter_named_tensors(model))
    kv_bytes_per_token = bytes_per_block(model.config, 1, dtype)
    num_steps = measured["num_decode_steps"]
    total_bytes = num_steps * weight_bytes + measured["num_context_tokens"] * kv_bytes_per_token
    roofline_seconds = total_bytes / bandwidth
    return {"bandwidth_bytes_per_s": bandwidth, "weight_bytes": weight_bytes,
            "kv_bytes_per_token": kv_bytes_per_token, "bytes_per_decode_step": total_bytes / max(num_steps, 1),
            "roofline_seconds": roofline_seconds,
            "fraction_of_roofline": roofline_seconds / max(measured["decode_seconds"], 1e-9)}


def measure_copy_bandwidth(device: str, num_bytes: int = 2**31, repeats: int = 10) -> float | None:
    """Bytes read plus written per second by a large device-to-device copy: the bandwidth a kernel can
    actually reach (4.3 TB/s on an H200 against the datasheet's 4.8), the ceiling our method takes for the
    roofline besides the datasheet's. None on CPU."""
    if torch.device(device).type != "cuda":
        return None
    source = torch.empty(num_bytes, dtype=torch.uint8, device=device).random_()
    target = torch.empty_like(source)
    target.copy_(source)  # warm-up
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        target.copy_(source)
    stop.record()
    stop.synchronize()
    bandwidth = 2 * num_bytes * repeats / (start.elapsed_time(stop) / 1e3)
    del source, target
    torch.cuda.empty_cache()
    return bandwidth


def transformers_model(model: CausalLM, folder: Path | None, dtype: torch.dtype, device: str):
    """The same weights as an HF model: from the folder, or our random weights copied into a fresh one."""
    if folder is not None:
        return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    hf_dict = model.config.to_hf_dict(dtype=dtype)
    hf_config = transformers.AutoConfig.for_model(hf_dict.pop("model_type"), **hf_dict)
    with torch.device(device):
        reference = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    missing, unexpected = reference.load_state_dict(dict(iter_named_tensors(model)), strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise ValueError(f"transformers model does not match ours: missing {missing}, unexpected {unexpected}")
    return reference.eval()


@torch.inference_mode()
def measure_transformers(reference, requests: list[GenerationRequest], device: str, batch_size: int,
                         pad_token_id: int) -> dict:
    """Batched sampling with left padding; every row runs to the batch's largest budget, only each request's
    own budget counts as generated."""
    _reset_peak_memory(device)
    seconds, num_kept = 0.0, 0
    for start in range(0, len(requests), batch_size):
        batch = requests[start:start + batch_size]
        width = max(item.prompt_ids.size for item in batch)
        input_ids = torch.full((len(batch), width), pad_token_id, dtype=torch.int64)
        attention_mask = torch.zeros((len(batch), width), dtype=torch.int64)
        for row, item in enumerate(batch):
            input_ids[row, width - item.prompt_ids.size:] = torch.as_tensor(item.prompt_ids, dtype=torch.int64)
            attention_mask[row, width - item.prompt_ids.size:] = 1
        max_new_tokens = max(item.params.max_new_tokens for item in batch)
        _synchronize(device)
        batch_start = time.perf_counter()
        reference.generate(input_ids.to(device), attention_mask=attention_mask.to(device), do_sample=True,
                           temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens,
                           min_new_tokens=max_new_tokens, pad_token_id=pad_token_id)
        _synchronize(device)
        seconds += time.perf_counter() - batch_start
        num_kept += sum(item.params.max_new_tokens for item in batch)
    return {"seconds": seconds, "generated_tokens": num_kept, "tokens_per_s": num_kept / seconds,
            "peak_memory_bytes": _peak_memory_bytes(device)}


def benchmark_model(model: str | Path | TransformerConfig, dtype: torch.dtype, device: str,
                    seed: int) -> tuple[CausalLM, str, Path | None]:
    """The benchmarked model, its display name and its HF folder (None for random weights): `model` is an HF folder,
    a Qwen2.5 size name or a TransformerConfig."""
    if isinstance(model, TransformerConfig):
        return random_model(model, dtype, device, seed), f"random {model.model_type}", None
    if str(model) in BENCH_MODEL_NAMES:
        return random_model(qwen2_config(str(model)), dtype, device, seed), f"{model} (random weights)", None
    folder = Path(model)
    return load_model(folder, dtype=dtype, device=device), folder.name, folder


def run_engine_benchmark(model: str | Path | TransformerConfig = "qwen2.5-0.5b", num_requests: int = 256,
                         prompt_lengths: str | LengthDistribution = "128",
                         output_lengths: str | LengthDistribution = "512", dtype: torch.dtype | None = None,
                         device: str | None = None, compare_transformers: bool = False,
                         bandwidth: float = H200_BANDWIDTH, max_num_seqs: int = 256,
                         max_num_batched_tokens: int = 8192, gpu_memory_utilization: float = 0.8,
                         enforce_eager: bool = False, transformers_batch_size: int | None = None,
                         seed: int = 0, block_size: int = EngineConfig.block_size,
                         decode_attention: str = EngineConfig.decode_attention,
                         decode_products: str = EngineConfig.decode_products) -> dict:
    """Runs the workload on our engine (and on transformers when asked); prints a table, returns the numbers.

    `model`: an HF folder, a Qwen2.5 size name ("qwen2.5-0.5b", "qwen2.5-1.5b") or a TransformerConfig
    (random weights). `device` defaults to CUDA when present, `dtype` to bf16 on CUDA and fp32 on CPU,
    `block_size` is the KV-cache block size in positions, `decode_attention` the decode kernel
    (`EngineConfig.decode_attention`), `decode_products` the decode step's layers (`EngineConfig.decode_products`)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = dtype or (torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32)
    if not isinstance(prompt_lengths, LengthDistribution):
        prompt_lengths = LengthDistribution.parse(prompt_lengths)
    if not isinstance(output_lengths, LengthDistribution):
        output_lengths = LengthDistribution.parse(output_lengths)
    ours, name, folder = benchmark_model(model, dtype, device, seed)
    requests = make_workload(num_requests, prompt_lengths, output_lengths, ours.config.vocab_size, seed)
    config = EngineConfig(device=device, dtype=dtype, max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=max_num_batched_tokens,
                          gpu_memory_utilization=gpu_memory_utilization, enforce_eager=enforce_eager,
                          block_size=block_size, decode_attention=decode_attention, decode_products=decode_products)
    copy_bandwidth = measure_copy_bandwidth(device)  # before the engine takes its share of device memory
    engine = LLMEngine(ours, config)
    measured = measure_engine(engine, requests, device)
    roofline = decode_roofline(ours, dtype, measured, bandwidth)
    roofline["measured_copy_bandwidth_bytes_per_s"] = copy_bandwidth
    roofline["fraction_of_measured_roofline"] = (None if copy_bandwidth is None else
                                                 roofline["fraction_of_roofline"] * bandwidth / copy_bandwidth)
    result = {
        "model": name, "device": str(device), "dtype": str(dtype).removeprefix("torch."),
        "decode_attention": decode_attention,
        "decode_attention_kernel": engine.runner.kernels.decode_attention,  # the one that ran ("auto" picks one)
        "decode_products": decode_products,
        "decode_layers": "torch" if engine.runner.kernels.fused_layers is None else "fused",  # the ones that ran
        "num_requests": num_requests, "prompt_lengths": prompt_lengths.__dict__,
        "output_lengths": output_lengths.__dict__,
        "prompt_tokens": int(sum(item.prompt_ids.size for item in requests)),
        "engine": {**measured, "roofline": roofline},
    }
    if compare_transformers:
        engine.sleep()  # give the KV cache back before transformers allocates its own
        reference = transformers_model(ours, folder, dtype, device)
        pad_token_id = ours.config.pad_token_id if ours.config.pad_token_id is not None else 0
        result["transformers"] = measure_transformers(reference, requests, device,
                                                      transformers_batch_size or num_requests, pad_token_id)
        result["speedup_vs_transformers"] = measured["tokens_per_s"] / result["transformers"]["tokens_per_s"]
    print_table(result)
    return result


def print_table(result: dict) -> None:
    ours, theirs = result["engine"], result.get("transformers")
    gib = 2**30
    rows = [
        ("generated tokens", ours["generated_tokens"], theirs and theirs["generated_tokens"]),
        ("wall time (s)", ours["seconds"], theirs and theirs["seconds"]),
        ("tokens/s", ours["tokens_per_s"], theirs and theirs["tokens_per_s"]),
        ("prefill tokens/s", ours["prefill_tokens_per_s"], None),
        ("prefill steps (s)", ours["prefill_seconds"], None),
        ("decode tokens/s", ours["decode_tokens_per_s"], None),
        ("mean decode batch", ours["mean_decode_batch"], None),
        ("decode roofline fraction", ours["roofline"]["fraction_of_roofline"], None),
        ("  at measured copy B/W", ours["roofline"]["fraction_of_measured_roofline"], None),
        ("peak memory (GiB)", ours["peak_memory_bytes"] / gib, theirs and theirs["peak_memory_bytes"] / gib),
        ("KV cache (tokens)", ours["kv_cache_tokens"], None),
        ("preemptions", ours["num_preemptions"], None),
    ]
    print(f"engine benchmark: {result['model']} on {result['device']} ({result['dtype']}), "
          f"{result['num_requests']} requests, {result['prompt_tokens']} prompt tokens")
    print(f"{'metric':<26}{'asyncrl':>16}{'transformers':>16}")
    for label, value, reference in rows:
        print(f"{label:<26}{_format(value):>16}{_format(reference):>16}")
    if theirs:
        print(f"speedup vs transformers: {result['speedup_vs_transformers']:.2f}x")


def _format(value) -> str:
    if value is None:
        return "-"
    return f"{value:,.3f}" if isinstance(value, float) else f"{value:,}"


def main(argv: list[str] | None = None) -> int:
    """`asyncrl bench engine` / `python -m asyncrl.bench.engine`; see the module docstring."""
    parser = argparse.ArgumentParser(prog="asyncrl bench engine", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen2.5-0.5b", help="HF folder, qwen2.5-0.5b, qwen2.5-1.5b or cpu-3m")
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--prompt-lengths", default="128", help="'N' or 'LOW:HIGH'")
    parser.add_argument("--output-lengths", default="512", help="'N', 'LOW:HIGH' or 'lognormal:MEDIAN:CAP[:SIGMA]'")
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default=None)
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when present)")
    parser.add_argument("--compare-transformers", action="store_true")
    parser.add_argument("--transformers-batch-size", type=int, default=None)
    parser.add_argument("--bandwidth", type=float, default=H200_BANDWIDTH, help="device memory bandwidth, B/s")
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.8)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--block-size", type=int, default=EngineConfig.block_size, help="KV-cache block size")
    parser.add_argument("--decode-attention", choices=DECODE_ATTENTION_KERNELS, default=EngineConfig.decode_attention,
                        help="decode-attention kernel on CUDA")
    parser.add_argument("--decode-products", choices=DECODE_PRODUCTS, default=EngineConfig.decode_products,
                        help="decode layers on CUDA: the fused products or the model's layers")
    parser.add_argument("--output", type=Path, default=default_output("engine.jsonl"),
                        help="append the result as one JSON line to this file (default outputs/bench/engine.jsonl)")
    args = parser.parse_args(argv)
    result = run_engine_benchmark(
        args.model, args.num_requests, args.prompt_lengths, args.output_lengths,
        getattr(torch, args.dtype) if args.dtype else None, args.device, args.compare_transformers, args.bandwidth,
        args.max_num_seqs, args.max_num_batched_tokens, args.gpu_memory_utilization, args.enforce_eager,
        args.transformers_batch_size, args.seed, args.block_size, args.decode_attention, args.decode_products)
    print(f"appended the result to {append_result(args.output, result).resolve()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
