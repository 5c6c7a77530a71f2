"""The decode step's layer GEMMs timed the way a decode step runs them, against their floors.

    python benchmarks/decode_gemms.py [--rows 256] [--splits 2 4 8]

For each layer shape of the 0.5B and 1.5B Qwen2.5 models (q/k/v, o, gate/up, down at `--rows` rows), one CUDA
graph runs the product over 24 distinct weight matrices, so weights come from HBM as in a real step, not from
L2. Reported per product: microseconds, the weight bytes over that time, and the floor (the larger of weight
bytes at 4.8 TB/s and FLOPs at 990 TFLOP/s). Besides cuBLAS (`F.linear`), it times split-K written as a
batched matmul over K slices plus a sum, the cheapest split-K torch can express (fp32 partial sums).
"""

import argparse

import torch
import torch.nn.functional as F

from asyncrl.bench.graph_timing import graph_replay_ms
from asyncrl.bench.models import qwen2_config

NUM_LAYERS = 24  # distinct weights per shape in one graph: more than L2 holds for every shape here


def layer_shapes(model: str) -> list[tuple[str, int, int]]:
    """(name, K, N) of a decoder layer's products with q/k/v and gate/up fused, as the engine runs them."""
    config = qwen2_config(model)
    hidden, q_out = config.hidden_size, config.num_attention_heads * config.head_dim
    kv_out = config.num_key_value_heads * config.head_dim
    return [("qkv", hidden, q_out + 2 * kv_out), ("o", q_out, hidden),
            ("gate_up", hidden, 2 * config.intermediate_size), ("down", config.intermediate_size, hidden)]


def split_k(splits: int):
    """x (M, K) @ w (N, K)^T as `splits` products over K slices (one batched matmul, fp32 out) and a sum."""
    def product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        rows, (outputs, inner) = x.shape[0], weight.shape
        width = inner // splits
        left = x.view(rows, splits, width).permute(1, 0, 2)  # (S, M, K / S), no copy
        right = weight.view(outputs, splits, width).permute(1, 2, 0)  # (S, K / S, N), no copy
        return torch.bmm(left, right, out_dtype=torch.float32).sum(0).to(x.dtype)
    return product


def graph_microseconds(product, rows: int, inner: int, outputs: int, repeats: int = 20) -> tuple[float, float]:
    """Mean microseconds per product inside one CUDA graph of NUM_LAYERS products, and its max abs difference
    from cuBLAS on the first weight."""
    x = torch.randn(rows, inner, device="cuda", dtype=torch.bfloat16)
    weights = [torch.randn(outputs, inner, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(NUM_LAYERS)]
    error = (product(x, weights[0]).float() - F.linear(x, weights[0]).float()).abs().max().item()

    def launch() -> None:
        for weight in weights:
            product(x, weight)
    milliseconds = graph_replay_ms(launch, replays=repeats)
    return milliseconds * 1e3 / NUM_LAYERS, error


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=256, help="decode batch (rows of every product)")
    parser.add_argument("--splits", type=int, nargs="*", default=[2, 4, 8])
    options = parser.parse_args()
    variants = [("cublas", F.linear)] + [(f"split-K {splits}", split_k(splits)) for splits in options.splits]
    for model in ("qwen2.5-0.5b", "qwen2.5-1.5b"):
        totals = {name: 0.0 for name, _ in variants}
        for name, inner, outputs in layer_shapes(model):
            weight_bytes, flops = 2 * inner * outputs, 2 * options.rows * inner * outputs
            floor = max(weight_bytes / 4.8e12, flops / 990e12) * 1e6
            cells = []
            for variant, product in variants:
                microseconds, error = graph_microseconds(product, options.rows, inner, outputs)
                totals[variant] += microseconds
                cells.append(f"{variant} {microseconds:5.1f} us ({weight_bytes / microseconds / 1e6:.2f} TB/s, "
                             f"max diff {error:.3f})")
            print(f"{model} {name} (K {inner}, N {outputs}; floor {floor:.1f} us): " + " | ".join(cells))
        print(f"{model} per layer: " + ", ".join(f"{variant} {total:.1f} us" for variant, total in totals.items()))


if __name__ == "__main__":
    main()
