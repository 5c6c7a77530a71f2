"""Where a decode step's time goes: host work (scheduling, inputs) vs GPU kernels, per kernel.

    python benchmarks/profile_engine.py --model qwen2.5-0.5b --batch 256 --prompt-len 1024 [--min-prompt-len 128]
Prints the wall time per decode step, the GPU busy time per step, and the top GPU kernels.
"""

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from asyncrl.bench.models import qwen2_config, random_model
from asyncrl.engine import EngineConfig, GenerationRequest, LLMEngine, SamplingParams
from asyncrl.engine.config import DECODE_ATTENTION_KERNELS


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen2.5-0.5b")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=1024)
    parser.add_argument("--min-prompt-len", type=int, default=None, help="prompt lengths uniform from this one")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rows", type=int, default=45, help="kernels listed")
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--block-size", type=int, default=EngineConfig.block_size, help="KV-cache block size")
    parser.add_argument("--decode-attention", choices=DECODE_ATTENTION_KERNELS, default=EngineConfig.decode_attention,
                        help="decode-attention kernel")
    options = parser.parse_args()
    model = random_model(qwen2_config(options.model), torch.bfloat16, "cuda")
    engine = LLMEngine(model, EngineConfig(device="cuda", max_num_seqs=options.batch, gpu_memory_utilization=0.6,
                                           enforce_eager=options.enforce_eager, max_num_batched_tokens=16384,
                                           block_size=options.block_size,
                                           decode_attention=options.decode_attention))
    generator = torch.Generator().manual_seed(0)
    min_prompt_len = options.min_prompt_len or options.prompt_len
    for index in range(options.batch):
        length = int(torch.randint(min_prompt_len, options.prompt_len + 1, (), generator=generator))
        prompt = torch.randint(0, 150000, (length,), generator=generator).tolist()
        engine.add_request(GenerationRequest(str(index), prompt, SamplingParams(max_new_tokens=512, ignore_eos=True,
                                                                                 seed=index)))
    while engine.scheduler.waiting:  # prefill everything
        engine.step()
    for _ in range(10):  # warm up decode (graph capture)
        engine.step()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(options.steps):
        engine.step()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - started) / options.steps
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        for _ in range(options.steps):
            engine.step()
        torch.cuda.synchronize()
    events = profiler.key_averages()
    gpu_total = sum(event.self_device_time_total for event in events) / 1e3 / options.steps
    print(f"decode step: wall {wall * 1e3:.2f} ms, GPU busy {gpu_total:.2f} ms (batch {options.batch}, "
          f"context ~{(min_prompt_len + options.prompt_len) // 2 + 20})")
    print(events.table(sort_by="self_device_time_total", row_limit=options.rows, max_name_column_width=70))


if __name__ == "__main__":
    main()
