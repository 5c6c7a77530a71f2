"""Decode attention against KV-cache layout and block size, timed the way the engine runs it (CUDA graphs).

    python benchmarks/decode_attention_layouts.py [--quick]

Variants, each checked against an fp32 torch reference on fresh random data, then timed:
- `engine`: the engine's kernel (`paged_decode_attention`), tiles of 8,192 key elements: with blocks smaller
  than a tile, a block-id gather per position; with blocks a multiple of it, one block id per tile;
- `blocked`: one tile per KV block, the block id a scalar per tile and the tile's addresses a fixed pattern
  around it;
- `tma`: one tile per KV block loaded by the Hopper tensor-memory accelerator (host-side descriptors over a
  2-D view of the cache);
- `masked`: `blocked` with the values' loads masked past the context length;
- `read`: the same bytes read by the `tma` variant's loads with no attention arithmetic, the ceiling of the
  access pattern.
Layouts: token-major (blocks, block_size, Hkv, D), the engine's today, and head-major (blocks, Hkv,
block_size, D), where one head's block is one contiguous run of block_size x D elements.
"""

from __future__ import annotations

import argparse
import itertools

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from asyncrl.bench.graph_timing import graph_replay_ms
from asyncrl.engine.triton_kernels import NEGATIVE_LARGE, _online_softmax_update, paged_decode_attention


@triton.jit
def _blocked_kernel(query_ptr, key_ptr, value_ptr, tables_ptr, lengths_ptr, output_ptr, order_ptr, scale,
                    stride_query_sequence, stride_query_head, stride_block, stride_token, stride_head,
                    stride_table, stride_output_sequence, stride_output_head, GROUP_SIZE: tl.constexpr,
                    GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, USE_TMA: tl.constexpr,
                    ROWS_PER_BLOCK: tl.constexpr, ROWS_PER_HEAD: tl.constexpr, COLUMNS_PER_HEAD: tl.constexpr,
                    READ_ONLY: tl.constexpr, MASK_VALUES: tl.constexpr):
    kv_head = tl.program_id(0)
    sequence = tl.load(order_ptr + tl.program_id(1))
    length = tl.load(lengths_ptr + sequence)
    group = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_DIM)
    offsets = tl.arange(0, BLOCK_SIZE)
    heads = kv_head * GROUP_SIZE + group
    head_mask = group < GROUP_SIZE
    query = tl.load(query_ptr + sequence * stride_query_sequence + heads[:, None] * stride_query_head
                    + dims[None, :], mask=head_mask[:, None], other=0.0)
    running_max = tl.full([GROUP_PAD], NEGATIVE_LARGE, tl.float32)
    running_sum = tl.zeros([GROUP_PAD], tl.float32)
    accumulator = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for tile_start in range(0, length, BLOCK_SIZE):
        block = tl.load(tables_ptr + sequence * stride_table + tile_start // BLOCK_SIZE)
        if USE_TMA:
            row = block * ROWS_PER_BLOCK + kv_head * ROWS_PER_HEAD
            key = key_ptr.load([row, kv_head * COLUMNS_PER_HEAD])
        else:
            tile_offsets = (block.to(tl.int64) * stride_block + kv_head * stride_head
                            + (offsets * stride_token)[:, None] + dims[None, :])
            key = tl.load(key_ptr + tile_offsets)
        if READ_ONLY:
            if USE_TMA:
                value = value_ptr.load([row, kv_head * COLUMNS_PER_HEAD])
            else:
                value = tl.load(value_ptr + tile_offsets)
            accumulator += tl.sum((key.to(tl.float32) + value.to(tl.float32)), 0)[None, :]
        else:
            scores = tl.dot(query, tl.trans(key)) * scale
            scores = tl.where((tile_start + offsets)[None, :] < length, scores, NEGATIVE_LARGE)
            running_max, probs, running_sum, accumulator = _online_softmax_update(running_max, running_sum,
                                                                                  accumulator, scores)
            if USE_TMA:
                value = value_ptr.load([row, kv_head * COLUMNS_PER_HEAD])
            elif MASK_VALUES:
                value = tl.load(value_ptr + tile_offsets, mask=(tile_start + offsets)[:, None] < length, other=0.0)
            else:
                value = tl.load(value_ptr + tile_offsets)
            accumulator += tl.dot(probs.to(value.dtype), value)
    if READ_ONLY:
        output = accumulator
    else:
        output = accumulator / running_sum[:, None]
    tl.store(output_ptr + sequence * stride_output_sequence + heads[:, None] * stride_output_head + dims[None, :],
             output.to(output_ptr.dtype.element_ty), mask=head_mask[:, None])


def blocked_attention(query, key_cache, value_cache, tables, lengths, order, *, layout, use_tma, warps, stages,
                      read_only=False, mask_values=False):
    """key/value caches are (blocks, block_size, Hkv, D) views, of token-major or head-major storage."""
    num_sequences, num_heads, head_dim = query.shape
    num_blocks, block_size, num_kv_heads = key_cache.shape[:3]
    output = torch.empty_like(query)
    if use_tma:
        if layout == "token":  # rows are (block, position), columns (head, dim)
            views = [cache.view(num_blocks * block_size, num_kv_heads * head_dim) for cache in (key_cache, value_cache)]
            rows_per_block, rows_per_head, columns_per_head = block_size, 0, head_dim
        else:  # rows are (block, head, position), columns dim
            views = [cache.permute(0, 2, 1, 3).reshape(num_blocks * num_kv_heads * block_size, head_dim)
                     for cache in (key_cache, value_cache)]
            assert all(view.data_ptr() == cache.data_ptr() for view, cache in zip(views, (key_cache, value_cache)))
            rows_per_block, rows_per_head, columns_per_head = num_kv_heads * block_size, block_size, 0
        keys, values = (TensorDescriptor.from_tensor(view, [block_size, head_dim]) for view in views)
    else:
        keys, values = key_cache, value_cache
        rows_per_block = rows_per_head = columns_per_head = 0
    group = num_heads // num_kv_heads
    compiled = _blocked_kernel[(num_kv_heads, num_sequences)](
        query, keys, values, tables, lengths, output, order, head_dim**-0.5, query.stride(0), query.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2), tables.stride(0), output.stride(0),
        output.stride(1), GROUP_SIZE=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, USE_TMA=use_tma, ROWS_PER_BLOCK=rows_per_block, ROWS_PER_HEAD=rows_per_head,
        COLUMNS_PER_HEAD=columns_per_head, READ_ONLY=read_only, MASK_VALUES=mask_values, num_warps=warps, num_stages=stages)
    KERNEL_REPORTS.setdefault((block_size, layout, use_tma, read_only, mask_values, warps, stages), _report(compiled))
    return output


KERNEL_REPORTS: dict = {}


def _report(compiled) -> str:
    if compiled is None:  # Triton's interpreter compiles nothing
        return "interpreted"
    return f"{compiled.n_regs} registers, {compiled.n_spills} spills, {compiled.metadata.shared} B shared"


def reference_attention(query, key_cache, value_cache, tables, lengths):
    """fp32 attention of each sequence over its first `lengths` cached positions, through its block table."""
    block_size = key_cache.shape[1]
    width = -(-int(lengths.max()) // block_size)
    keys = key_cache[tables[:, :width].long()].flatten(1, 2).float()  # (S, K, Hkv, D)
    values = value_cache[tables[:, :width].long()].flatten(1, 2).float()
    mask = torch.arange(keys.shape[1], device=query.device)[None, :] < lengths[:, None]
    output = torch.nn.functional.scaled_dot_product_attention(
        query.float()[:, :, None], keys.transpose(1, 2), values.transpose(1, 2), attn_mask=mask[:, None, None],
        enable_gqa=True)
    return output[:, :, 0]


def make_case(heads, kv_heads, dim, batch, low, high, block_size, layout, seed):
    """Random caches of shuffled blocks (a long-running cache) and random context lengths."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    num_blocks = batch * -(-high // block_size) + 1
    storage = (num_blocks, block_size, kv_heads, dim) if layout == "token" else (num_blocks, kv_heads, block_size, dim)
    caches = [torch.randn(storage, device="cuda", dtype=torch.bfloat16, generator=generator) for _ in range(2)]
    if layout == "head":
        caches = [cache.permute(0, 2, 1, 3) for cache in caches]  # (blocks, block_size, Hkv, D) views
    tables = torch.randperm(num_blocks, device="cuda", generator=generator)[:batch * (num_blocks // batch)]
    tables = tables.view(batch, -1).to(torch.int32)
    lengths = torch.randint(low, high + 1, (batch,), device="cuda", generator=generator, dtype=torch.int32)
    order = torch.argsort(lengths, descending=True).to(torch.int32)
    query = torch.randn((batch, heads, dim), device="cuda", dtype=torch.bfloat16, generator=generator)
    return query, caches[0], caches[1], tables, lengths, order


def time_us(function, repeats=20) -> float:
    def launch():
        for _ in range(repeats):
            function()
    return graph_replay_ms(launch) / repeats * 1e3


def variants_for(block_size: int, quick: bool) -> list[tuple[str, dict]]:
    """(kind, launch configuration) pairs to time at this block size; whole-block kinds need blocks >= 64."""
    variants = [("engine", dict(warps=4, stages=3))]
    if block_size >= 64:
        for kind, warps, stages in itertools.product(("blocked", "tma"), (4, 8), (2, 3, 4)):
            if not quick or (warps, stages) in ((4, 3), (4, 4), (8, 3)):
                variants.append((kind, dict(warps=warps, stages=stages)))
        variants.append(("masked", dict(warps=4, stages=3)))  # blocked, values masked past the length
        variants.append(("read", dict(warps=4, stages=3)))
    return variants


def time_case(case, block_size: int, layout: str, quick: bool) -> list[tuple]:
    """(block size, layout, kind, configuration, us, relative error) of every variant on one case, printed."""
    query, key_cache, value_cache, tables, lengths, order = case
    kv_bytes = 2 * int(lengths.sum()) * key_cache.shape[2] * key_cache.shape[3] * 2
    reference = reference_attention(*case[:5])
    rows = []
    for kind, config in variants_for(block_size, quick):
        if kind == "engine":
            run = lambda: paged_decode_attention(query, key_cache, value_cache, tables, lengths,
                                                 num_warps=config["warps"], num_stages=config["stages"],
                                                 row_order=order)
        else:
            run = lambda: blocked_attention(query, key_cache, value_cache, tables, lengths, order, layout=layout,
                                            use_tma=kind in ("tma", "read"), read_only=kind == "read",
                                            mask_values=kind == "masked", **config)
        label = f"  block {block_size:3d} {layout:5s} {kind:7s} w{config['warps']} s{config['stages']}"
        try:
            output = run()
            error = float("nan") if kind == "read" else ((output.float() - reference).norm() / reference.norm()).item()
            microseconds = time_us(run)
        except Exception as exception:  # a configuration the compiler rejects: report, go on
            print(f"{label}: {type(exception).__name__}: {str(exception)[:160]}", flush=True)
            continue
        rows.append((block_size, layout, kind, config, microseconds, error))
        print(f"{label}: {microseconds:6.1f} us {kv_bytes / microseconds / 1e6:5.2f} TB/s rel.err {error:.1e}",
              flush=True)
    return rows


def print_summary(results: dict) -> None:
    print("\ncompiled kernels:")
    for key, report in KERNEL_REPORTS.items():
        print(f"  blocked (block, layout, tma, read, masked, warps, stages) {key}: {report}")
    try:  # the engine kernel's compiled variants (Triton's per-device cache)
        from asyncrl.engine.triton_kernels import _paged_decode_kernel
        for compiled in _paged_decode_kernel.device_caches[torch.cuda.current_device()][0].values():
            print(f"  engine kernel: {_report(compiled)}")
    except Exception as exception:
        print(f"  engine kernel report unavailable: {type(exception).__name__}: {exception}")
    print("\nbest per case (attention variants):")
    for case_name, rows in results.items():
        for row in sorted([row for row in rows if row[2] != "read"], key=lambda row: row[4])[:5]:
            print(f"  {case_name}: block {row[0]} {row[1]} {row[2]} {row[3]} {row[4]:.1f} us err {row[5]:.1e}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer variants in every case (else only after the first)")
    parser.add_argument("--first-case-only", action="store_true", help="0.5B, contexts 640-1536 only")
    options = parser.parse_args()
    shapes = {"0.5b": (14, 2, 64), "1.5b": (12, 2, 128)}
    results: dict[str, list[tuple]] = {}
    for (name, (heads, kv_heads, dim)), (low, high) in itertools.product(shapes.items(), [(640, 1536), (1088, 1088)]):
        if (name == "1.5b" and low == high) or (options.first_case_only and results):
            continue
        print(f"== {name}, 256 sequences, contexts {low}-{high}", flush=True)
        quick = options.quick or bool(results)
        rows = results.setdefault(f"{name} {low}-{high}", [])
        for block_size, layout in itertools.product((16, 64, 128), ("token", "head")):
            if not (block_size == 128 and dim == 128 and quick):
                case = make_case(heads, kv_heads, dim, 256, low, high, block_size, layout, seed=block_size)
                rows += time_case(case, block_size, layout, quick)
                del case
                torch.cuda.empty_cache()
    print_summary(results)


if __name__ == "__main__":
    main()
