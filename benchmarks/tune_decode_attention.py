"""Sweep the paged decode kernel's launch parameters on one decode step's shapes and report KV bandwidth.

    python benchmarks/tune_decode_attention.py --model qwen2.5-0.5b --batch 256 --context 1044 [--spread 896]
Each configuration is timed with CUDA events over 100 launches replayed from CUDA graphs; bandwidth counts
the K and V bytes every program must read (the step's floor), so it compares directly with the device's
4.8 TB/s.
With `--spread`, context lengths are uniform in context +- spread / 2 (a real batch's mix), in random order
or longest first (`--longest-first`).

`--layers N` gives each of N launches in a graph its own cache, as the engine's N layers have (one cache is
re-read by every replay). Measured on an H200 (0.5B shapes, ~140 MB of K/V per launch): 41.8 us with one cache,
41.1 us with 24, so the 50 MB L2 does not flatter the single-cache timing. `--max-registers` caps registers per
thread (every cap measured slower than the compiler's choice).
"""

import argparse
import itertools

import torch

from asyncrl.bench.graph_timing import graph_replay_ms
from asyncrl.bench.models import qwen2_config
from asyncrl.engine.triton_kernels import TILE_ELEMENTS, paged_decode_attention


def time_ms(function, num_layers: int, repeats: int = 24) -> float:
    """Mean milliseconds per launch, `repeats` launches in one CUDA graph (`graph_replay_ms`), launch i on
    layer i % num_layers."""
    def launch() -> None:
        for index in range(repeats):
            function(index % num_layers)
    return graph_replay_ms(launch) / repeats


def make_case(options: argparse.Namespace) -> dict:
    """Query, `options.layers` key/value caches of shuffled blocks, block tables, context lengths and the
    longest-first row order of one decode step."""
    config = qwen2_config(options.model)
    heads, kv_heads, dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    longest = options.context + options.spread // 2
    num_blocks = options.batch * -(-longest // options.block_size)
    generator = torch.Generator(device="cuda").manual_seed(0)
    shape = (num_blocks, options.block_size, kv_heads, dim)
    def cache() -> torch.Tensor:
        return torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=generator)
    key_caches = [cache() for _ in range(options.layers)]
    value_caches = [cache() for _ in range(options.layers)]
    # Shuffled blocks, as a long-running cache hands them out.
    tables = torch.randperm(num_blocks, device="cuda", generator=generator).view(options.batch, -1).to(torch.int32)
    lengths = torch.randint(options.context - options.spread // 2, longest + 1, (options.batch,), device="cuda",
                            generator=generator, dtype=torch.int32)
    # Longest first through the kernel's row order, as the engine launches a mixed batch.
    order = lengths.argsort(descending=True).to(torch.int32) if options.longest_first else None
    query = torch.randn((options.batch, heads, dim), device="cuda", dtype=torch.bfloat16, generator=generator)
    return {"query": query, "key_caches": key_caches, "value_caches": value_caches, "tables": tables,
            "lengths": lengths, "order": order, "dim": dim, "kv_bytes": 2 * int(lengths.sum()) * kv_heads * dim * 2}


def sweep(case: dict, options: argparse.Namespace) -> list[tuple]:
    """(milliseconds, splits, tile, warps, stages, registers, max diff to the default launch) per configuration
    the compiler accepts."""
    query, key_caches, value_caches = case["query"], case["key_caches"], case["value_caches"]
    tables, lengths, order = case["tables"], case["lengths"], case["order"]
    reference = paged_decode_attention(query, key_caches[0], value_caches[0], tables, lengths)
    results = []
    for splits, tile, warps, stages, registers in itertools.product(options.splits, options.tiles, options.warps,
                                                                    options.stages, options.max_registers):
        def run(layer: int = 0):
            return paged_decode_attention(query, key_caches[layer], value_caches[layer], tables, lengths, splits, tile,
                                          warps, stages, row_order=order, max_registers=registers or None)
        try:
            error = (run().float() - reference.float()).abs().max().item()
            milliseconds = time_ms(run, options.layers)
        except Exception as exception:  # a configuration the compiler rejects (e.g. shared memory)
            print(f"splits {splits} tile {tile} warps {warps} stages {stages} registers {registers}: "
                  f"{type(exception).__name__}")
            continue
        results.append((milliseconds, splits, tile, warps, stages, registers, error))
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen2.5-0.5b")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--context", type=int, default=1044)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--spread", type=int, default=0)
    parser.add_argument("--longest-first", action="store_true")
    parser.add_argument("--splits", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--tiles", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--warps", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--stages", type=int, nargs="+", default=[2, 3, 4],
                        help="software-pipelining depth; K/V tiles get a second buffer only from 5 on")
    parser.add_argument("--max-registers", type=int, nargs="+", default=[0],
                        help="registers per thread caps (0: the compiler's choice)")
    parser.add_argument("--layers", type=int, default=1, help="distinct caches launched in turn (24: as the "
                        "engine's layers; 1: one cache re-read by every replay)")
    options = parser.parse_args()
    case = make_case(options)
    kv_bytes = case["kv_bytes"]
    print(f"{options.model}: batch {options.batch}, context {options.context} +- {options.spread // 2}"
          f"{' longest first' if options.longest_first else ''}, KV read {kv_bytes / 1e6:.0f} MB per launch, "
          f"{options.layers} distinct caches")
    results = sweep(case, options)
    for milliseconds, splits, tile, warps, stages, registers, error in sorted(results)[:16]:
        print(f"splits {splits} tile {tile:3d} warps {warps} stages {stages} registers {registers or '-':>3}: "
              f"{milliseconds * 1e3:6.1f} us {kv_bytes / milliseconds / 1e9:5.2f} TB/s (max diff {error:.1e})")
    default_tile = TILE_ELEMENTS // max(16, case["dim"])
    default = [r for r in results if r[1:6] == (1, default_tile, 4, 3, 0)]
    if default:
        print(f"current default (splits 1, tile {default_tile}, warps 4, stages 3): {default[0][0] * 1e3:.1f} us")


if __name__ == "__main__":
    main()
