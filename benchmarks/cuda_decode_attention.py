"""The CUDA decode-attention kernel against the Triton one, timed as the engine runs them (correctness:
`tests/engine/test_cuda_decode.py` on a GPU, or `benchmarks/csrc/decode_attention_harness.cu check`).

    python benchmarks/cuda_decode_attention.py [--models qwen2.5-0.5b qwen2.5-1.5b] [--warps 4 8]
    python benchmarks/cuda_decode_attention.py --once --models qwen2.5-0.5b     # one launch each, for ncu

Time: `tune_decode_attention.make_case`'s step (256 sequences, contexts 640-1,536 longest first, 24 distinct
caches), both kernels storing the new key/value as in the engine, launches replayed from CUDA graphs.
"""

from __future__ import annotations

import argparse

import torch

from asyncrl.bench.models import qwen2_config
from asyncrl.engine import cuda_decode, triton_kernels
from tune_decode_attention import make_case, time_ms


def time_case(model: str, warps: list[int], stages: list[int], repeats: int = 24,
              layers: int = 24) -> list[tuple[str, float]]:
    """Per-layer microseconds of each kernel; `repeats` 0 launches each once and times nothing."""
    options = argparse.Namespace(model=model, batch=256, context=1088, spread=896, block_size=16, layers=layers,
                                 longest_first=True)
    case = make_case(options)
    query, tables, lengths, order = case["query"], case["tables"], case["lengths"], case["order"]
    config = qwen2_config(model)
    kv_heads, dim = config.num_key_value_heads, config.head_dim
    generator = torch.Generator(device="cuda").manual_seed(1)
    new_key = torch.randn((256, kv_heads, dim), device="cuda", dtype=torch.bfloat16, generator=generator)
    new_value = torch.randn_like(new_key)
    # The slot of each context's last position, as the engine writes it.
    last = (lengths - 1).long()
    slots = tables[torch.arange(256, device="cuda"), last // 16].long() * 16 + last % 16
    kernels = [("triton", triton_kernels.paged_decode_attention)]
    kernels += [(f"cuda w{w} s{s}",
                 lambda *a, w=w, s=s, **k: cuda_decode.paged_decode_attention(*a, num_warps=w, num_stages=s, **k))
                for w in warps for s in stages]
    rows = []
    for name, kernel in kernels:
        def run(layer: int, kernel=kernel):
            return kernel(query, case["key_caches"][layer], case["value_caches"][layer], tables, lengths, 1,
                          new_key=new_key, new_value=new_value, write_slots=slots, row_order=order)
        if repeats == 0:
            run(0)
            torch.cuda.synchronize()
            continue
        rows.append((name, time_ms(run, layers, repeats) * 1e3, case["kv_bytes"]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", nargs="+", default=["qwen2.5-0.5b", "qwen2.5-1.5b"])
    parser.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    # 8 warps x 4 stages at head dimension 128 want a 256 KB ring, more than an SM has: the launch refuses it.
    parser.add_argument("--stages", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--once", action="store_true", help="one launch of each kernel (under ncu or a sanitizer)")
    options = parser.parse_args()
    cuda_decode.load_decode_kernel()  # built before anything is timed
    if options.once:
        for model in options.models:
            time_case(model, options.warps, options.stages, repeats=0, layers=1)
        return
    for model in options.models:
        for name, microseconds, kv_bytes in time_case(model, options.warps, options.stages):
            print(f"time {model} {name:11s}: {microseconds:6.1f} us per layer, "
                  f"{kv_bytes / microseconds / 1e6:5.2f} TB/s of KV")


if __name__ == "__main__":
    main()
