"""Would one Triton kernel for the MLP's gate/up product with SiLU x up in its epilogue beat the engine's two
kernels (cuBLAS's product, then Inductor's SiLU x up)?

    python benchmarks/gate_up_silu.py [--rows 16 64 128 256]

For 0.5B's and 1.5B's MLP shapes at each row count, one CUDA graph runs the first half of the MLP over 24
distinct gate/up matrices (so weights come from HBM, as in a decode step): cuBLAS's product plus Inductor's
compiled SiLU x up (the engine's unfused path), and the Triton kernel at several block shapes. Each variant is
checked against the composition first (max abs difference; NaN if an element went unwritten, as
torch.empty's memory rarely holds the right value).

Answer on an H200 (2026-12-03, docs/benchmarks.md "Fifteenth round"): no. At 256 rows the best block shape
takes 15.0 us against 13.4 us for 0.5B and 41.0 against 30.9 us for 1.5B; it wins only for 1.5B at 64-128
rows. Wired into the engine (with an attention change that also lost) the decode fraction fell 2.2%; it
is not kept.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from asyncrl.bench.graph_timing import graph_replay_ms
from asyncrl.bench.models import qwen2_config

NUM_LAYERS = 24
BLOCK_K = 64
SHAPES = [(64, 32, 4, 3), (64, 64, 4, 3), (128, 32, 8, 3), (128, 64, 8, 3), (128, 64, 4, 4), (256, 32, 8, 3),
          (64, 128, 8, 3), (128, 128, 8, 3)]


@triton.jit
def _gate_up_silu_kernel(x_ptr, weight_ptr, out_ptr, num_rows, inner, hidden, stride_x, stride_weight, stride_out,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program (column block, row block): out[rows, columns] = silu(x W_gate[columns]^T) * (x W_up[columns]^T).
    `hidden` is a multiple of BLOCK_K and `inner` of BLOCK_N (both models' shapes), so only rows are masked."""
    column_block = tl.program_id(0)
    row_block = tl.program_id(1)
    rows = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    columns = column_block * BLOCK_N + tl.arange(0, BLOCK_N)
    depth = tl.arange(0, BLOCK_K)
    row_mask = rows < num_rows
    x_ptrs = x_ptr + rows[:, None] * stride_x + depth[None, :]
    # (BLOCK_K, BLOCK_N) tiles of W^T: the weight's rows are the product's columns.
    gate_ptrs = weight_ptr + columns[None, :] * stride_weight + depth[:, None]
    up_ptrs = gate_ptrs + inner * stride_weight
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, hidden, BLOCK_K):
        x = tl.load(x_ptrs, mask=row_mask[:, None], other=0.0)
        gate = tl.dot(x, tl.load(gate_ptrs), gate)
        up = tl.dot(x, tl.load(up_ptrs), up)
        x_ptrs += BLOCK_K
        gate_ptrs += BLOCK_K
        up_ptrs += BLOCK_K
    # Rounded where the unfused product's bf16 output rounds; SiLU x up in fp32, rounded once.
    gate = gate.to(out_ptr.dtype.element_ty).to(tl.float32)
    up = up.to(out_ptr.dtype.element_ty).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + rows[:, None] * stride_out + columns[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_mask[:, None])


def unfused_gate_up_silu(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The same function as two kernels: the product, then SiLU x up."""
    gate, up = F.linear(x, weight).chunk(2, dim=-1)
    return F.silu(gate) * up


def fused(block_m: int, block_n: int, warps: int, stages: int):
    def run(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        num_rows, hidden = x.shape
        inner = weight.shape[0] // 2
        out = torch.empty((num_rows, inner), dtype=x.dtype, device=x.device)
        _gate_up_silu_kernel[(inner // block_n, triton.cdiv(num_rows, block_m))](
            x, weight, out, num_rows, inner, hidden, x.stride(0), weight.stride(0), out.stride(0),
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=BLOCK_K, num_warps=warps, num_stages=stages)
        return out
    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="*", default=[16, 64, 128, 256])
    options = parser.parse_args()
    compiled_silu_mul = torch.compile(lambda gate_up: F.silu(gate_up[:, :gate_up.shape[1] // 2])
                                      * gate_up[:, gate_up.shape[1] // 2:])
    for model in ("qwen2.5-0.5b", "qwen2.5-1.5b"):
        config = qwen2_config(model)
        hidden, inner = config.hidden_size, config.intermediate_size
        weights = [torch.randn(2 * inner, hidden, device="cuda", dtype=torch.bfloat16) * 0.03
                   for _ in range(NUM_LAYERS)]
        for rows in options.rows:
            x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
            expected = unfused_gate_up_silu(x, weights[0]).float()

            def unfused(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
                return compiled_silu_mul(F.linear(x, weight))

            variants = [("cublas+silu", unfused)] + [(f"triton {m}x{n} w{w} s{s}", fused(m, n, w, s))
                                                     for m, n, w, s in SHAPES if m <= max(16, 2 * rows)]
            cells = []
            for name, product in variants:
                out = product(x, weights[0])
                difference = (out.float() - expected).abs().max().item()

                def launch() -> None:
                    for weight in weights:
                        product(x, weight)
                microseconds = graph_replay_ms(launch, replays=20) * 1e3 / NUM_LAYERS
                cells.append((microseconds, f"{name} {microseconds:6.2f} us (diff {difference:.1e})"))
            best = min(cells[1:])[1] if len(cells) > 1 else "-"
            print(f"{model} rows {rows}: {cells[0][1]} | best {best}")
            print("   " + " | ".join(cell for _, cell in sorted(cells)))


if __name__ == "__main__":
    main()
