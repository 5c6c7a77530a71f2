"""Would two half-batches on two CUDA streams hide a decode step's GEMMs behind its attention?

    python benchmarks/decode_two_streams.py

A decode step's layers without norms or rotary (q/k/v, paged attention writing the new K/V, o + residual,
gate/up, SiLU x up, down + residual) over 24 layers of distinct weights and KV caches, batch 256, contexts
640-1,536 in shuffled blocks, each variant captured in one CUDA graph and timed by replay:
the whole batch on one stream, attention alone, GEMMs alone, one half-batch alone, and the two halves on
two streams (or four quarters on four) so attention of one part can run beside the GEMMs of another.
Halves are interleaved by context length, so each gets the same mix.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from asyncrl.bench.graph_timing import graph_replay_ms
from asyncrl.bench.models import qwen2_config
from asyncrl.engine.triton_kernels import paged_decode_attention

NUM_LAYERS = 24
BLOCK_SIZE = 16


def decode_model(model: str, batch: int = 256, context: int = 1088, spread: int = 896) -> dict:
    """Random weights, caches and step inputs of a decode step at 0.5B or 1.5B shapes."""
    config = qwen2_config(model)
    heads, kv_heads, dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    generator = torch.Generator(device="cuda").manual_seed(0)

    def random(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=generator) * 0.02

    hidden, inner = config.hidden_size, config.intermediate_size
    layers = [{"qkv": random((heads + 2 * kv_heads) * dim, hidden), "o": random(hidden, heads * dim),
               "gate_up": random(2 * inner, hidden), "down": random(hidden, inner)} for _ in range(NUM_LAYERS)]
    longest = context + spread // 2
    num_blocks = batch * -(-(longest + 1) // BLOCK_SIZE)
    caches = [(random(num_blocks, BLOCK_SIZE, kv_heads, dim), random(num_blocks, BLOCK_SIZE, kv_heads, dim))
              for _ in range(NUM_LAYERS)]
    tables = torch.randperm(num_blocks, device="cuda", generator=generator).view(batch, -1).to(torch.int32)
    lengths = torch.randint(context - spread // 2, longest + 1, (batch,), device="cuda", generator=generator,
                            dtype=torch.int32)
    newest = (lengths - 1).long()
    slots = tables.gather(1, (newest // BLOCK_SIZE)[:, None]).squeeze(1).long() * BLOCK_SIZE + newest % BLOCK_SIZE
    return {"heads": heads, "kv_heads": kv_heads, "dim": dim, "inner": inner, "layers": layers, "caches": caches,
            "tables": tables, "lengths": lengths, "slots": slots, "hidden": random(batch, hidden) * 50}


def decode_step(model: dict, rows: torch.Tensor, attention: bool = True, gemms: bool = True):
    """The step's layers for `rows` as a function (inputs gathered once, outside any capture)."""
    heads, kv_heads, dim, inner = model["heads"], model["kv_heads"], model["dim"], model["inner"]
    hidden, tables, lengths, slots = (model[key][rows] for key in ("hidden", "tables", "lengths", "slots"))
    order = torch.argsort(lengths, descending=True).to(torch.int32)
    num_rows = len(rows)
    fixed_qkv = torch.randn(num_rows, (heads + 2 * kv_heads) * dim, device="cuda", dtype=torch.bfloat16)
    fixed_attention = torch.randn(num_rows, heads * dim, device="cuda", dtype=torch.bfloat16)

    def run() -> torch.Tensor:
        state = hidden
        for layer, (key_cache, value_cache) in zip(model["layers"], model["caches"]):
            qkv = F.linear(state, layer["qkv"]) if gemms else fixed_qkv
            attended = fixed_attention
            if attention:
                query = qkv[:, :heads * dim].view(num_rows, heads, dim)
                key = qkv[:, heads * dim:(heads + kv_heads) * dim].view(num_rows, kv_heads, dim)
                value = qkv[:, (heads + kv_heads) * dim:].view(num_rows, kv_heads, dim)
                attended = paged_decode_attention(query, key_cache, value_cache, tables, lengths, new_key=key,
                                                  new_value=value, write_slots=slots,
                                                  row_order=order).view(num_rows, heads * dim)
            if gemms:
                mixed = torch.addmm(state, attended, layer["o"].t())
                gate_up = F.linear(mixed, layer["gate_up"])
                state = torch.addmm(mixed, F.silu(gate_up[:, :inner]) * gate_up[:, inner:], layer["down"].t())
        return state
    return run


def graph_microseconds(functions: list, repeats: int = 10) -> float:
    """Each function on its own stream, forked from and joined back to the capturing stream, in one graph."""
    streams = [torch.cuda.Stream() for _ in functions]

    def launch() -> None:
        origin = torch.cuda.current_stream()
        for stream, function in zip(streams, functions):
            stream.wait_stream(origin)
            with torch.cuda.stream(stream):
                function()
        for stream in streams:
            origin.wait_stream(stream)
    return graph_replay_ms(launch, replays=repeats) * 1e3


def main() -> None:
    for name in ("qwen2.5-0.5b", "qwen2.5-1.5b"):
        model = decode_model(name)
        every_row = torch.arange(len(model["lengths"]), device="cuda")
        by_length = torch.argsort(model["lengths"], descending=True)
        halves = [by_length[0::2], by_length[1::2]]
        quarters = [by_length[part::4] for part in range(4)]
        first, second = (decode_step(model, half) for half in halves)
        results = {
            "whole batch, one stream": [decode_step(model, every_row)],
            "attention only": [decode_step(model, every_row, gemms=False)],
            "GEMMs only": [decode_step(model, every_row, attention=False)],
            "one half alone": [first],
            "two halves, one stream": [lambda: (first(), second())],
            "two halves, two streams": [first, second],
            "four quarters, four streams": [decode_step(model, quarter) for quarter in quarters],
        }
        print(f"{name} (24 layers, batch 256):")
        for label, functions in results.items():
            print(f"  {label}: {graph_microseconds(functions):.0f} us")


if __name__ == "__main__":
    main()
