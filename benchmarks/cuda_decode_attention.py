"""The CUDA decode-attention kernel against the Triton one: checked, then timed as the engine runs them.

    python benchmarks/cuda_decode_attention.py [--models qwen2.5-0.5b qwen2.5-1.5b] [--warps 4 8]
    python benchmarks/cuda_decode_attention.py --once --models qwen2.5-0.5b     # one launch each, for ncu

Check (fresh random data per case, shuffled blocks, NaN in every slot past a context): outputs of both
kernels against an fp32 torch reference (relative error), the new keys/values stored by each, over context
lengths 1-2,047, block sizes 16 and 128 and 0.5B / 1.5B head shapes.
Time: `tune_decode_attention.make_case`'s step (256 sequences, contexts 640-1,536 longest first, 24 distinct
caches), both kernels storing the new key/value as in the engine, launches replayed from CUDA graphs.
"""

from __future__ import annotations

import argparse

import torch

from asyncrl.bench.models import qwen2_config
from asyncrl.engine import cuda_decode, triton_kernels
from tune_decode_attention import make_case, time_ms


def reference(query, key_cache, value_cache, tables, lengths) -> torch.Tensor:
    """fp32 attention of each sequence's query over its gathered context."""
    outputs = []
    block_size, group = key_cache.shape[1], query.shape[1] // key_cache.shape[2]
    for sequence, length in enumerate(lengths.tolist()):
        positions = torch.arange(length, device=query.device)
        blocks = tables[sequence, positions // block_size].long()
        keys = key_cache[blocks, positions % block_size].float().repeat_interleave(group, 1)  # (L, Hq, D)
        values = value_cache[blocks, positions % block_size].float().repeat_interleave(group, 1)
        scores = torch.einsum("hd,lhd->hl", query[sequence].float(), keys) * query.shape[-1] ** -0.5
        outputs.append(torch.einsum("hl,lhd->hd", scores.softmax(-1), values))
    return torch.stack(outputs)


def check_case(model: str, block_size: int, lengths: list[int], seed: int) -> dict:
    config = qwen2_config(model)
    heads, kv_heads, dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    generator = torch.Generator(device="cuda").manual_seed(seed)
    blocks_per_sequence = -(-max(lengths) // block_size)
    num_blocks = len(lengths) * blocks_per_sequence + 1
    shape = (num_blocks, block_size, kv_heads, dim)
    key_cache = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=generator)
    value_cache = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=generator)
    tables = torch.randperm(num_blocks - 1, device="cuda", generator=generator)[: len(lengths) * blocks_per_sequence]
    tables = tables.view(len(lengths), blocks_per_sequence).to(torch.int32)
    lengths_tensor = torch.tensor(lengths, device="cuda", dtype=torch.int32)
    for sequence, length in enumerate(lengths):  # NaN past each context, in its last block
        last = tables[sequence, (length - 1) // block_size].long()
        key_cache[last, (length - 1) % block_size + 1:] = float("nan")
        value_cache[last, (length - 1) % block_size + 1:] = float("nan")
    last_blocks = tables[torch.arange(len(lengths), device="cuda"), (lengths_tensor - 1) // block_size].long()
    slots = last_blocks * block_size + ((lengths_tensor - 1) % block_size).long()
    # q/k/v as strided views of one projection output, as the engine passes them.
    qkv = torch.randn((len(lengths), (heads + 2 * kv_heads) * dim), device="cuda", dtype=torch.bfloat16,
                      generator=generator)
    query = qkv[:, : heads * dim].view(-1, heads, dim)
    new_key = qkv[:, heads * dim: (heads + kv_heads) * dim].view(-1, kv_heads, dim)
    new_value = qkv[:, (heads + kv_heads) * dim:].view(-1, kv_heads, dim)
    results = {}
    kernels = [("triton", triton_kernels.paged_decode_attention)]
    kernels += [(f"cuda w{w} s{s}", lambda *a, w=w, s=s, **k: cuda_decode.paged_decode_attention(
        *a, num_warps=w, num_stages=s, **k)) for w, s in ((4, 2), (4, 3), (8, 4))]
    for name, kernel in kernels:
        keys, values = key_cache.clone(), value_cache.clone()
        try:
            output = kernel(query, keys, values, tables, lengths_tensor, 1, new_key=new_key, new_value=new_value,
                            write_slots=slots, row_order=lengths_tensor.argsort(descending=True).to(torch.int32))
            torch.cuda.synchronize()
        except RuntimeError as error:  # a configuration the kernel refuses (shared memory), reported, not fatal
            results[name] = (float("nan"), False, str(error).splitlines()[0])
            continue
        stored = (torch.equal(keys.view(-1, kv_heads, dim)[slots], new_key)
                  and torch.equal(values.view(-1, kv_heads, dim)[slots], new_value))
        expected = reference(query, keys, values, tables, lengths_tensor)
        error = ((output.float() - expected).norm() / expected.norm()).item()
        results[name] = (error, bool(torch.isfinite(output).all()), stored)
    return results


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
    kernels = [("triton", lambda *a, **k: triton_kernels.paged_decode_attention(*a, **k))]
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
    parser.add_argument("--stages", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument("--once", action="store_true", help="one launch of each kernel (under ncu or a sanitizer)")
    options = parser.parse_args()
    cuda_decode._extension()
    if options.once:
        for model in options.models:
            time_case(model, options.warps, options.stages, repeats=0, layers=1)
        return
    lengths = [1, 2, 15, 16, 17, 31, 32, 33, 100, 129, 1000, 2047]
    for model in options.models:
        for block_size in (16, 128):
            for seed in range(2):
                results = check_case(model, block_size, lengths, seed)
                print(f"check {model} block {block_size} seed {seed}: " + ", ".join(
                    f"{name} rel.err {error:.1e} finite {finite} stored {stored}"
                    for name, (error, finite, stored) in results.items()))
    for model in options.models:
        for name, microseconds, kv_bytes in time_case(model, options.warps, options.stages):
            print(f"time {model} {name:11s}: {microseconds:6.1f} us per layer, "
                  f"{kv_bytes / microseconds / 1e6:5.2f} TB/s of KV")


if __name__ == "__main__":
    main()
