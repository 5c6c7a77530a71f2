"""How much of a decode layer's GEMM time is waiting for weights from HBM? The same products with their weights
already in L2 against weights from HBM.

    python benchmarks/gemm_l2_hot.py

For 0.5B's four layer products at 256 rows (q/k/v with its bias, o, gate/up, down), one CUDA graph runs each
product 24 times: over 24 distinct weight matrices (cold: every weight comes from HBM, as in a decode step) or
over one matrix 24 times (hot: after the first, it is in the 50 MB L2). Then a layer's four in a row, over 24
distinct layers or one layer 24 times (its 30 MB fits in L2). If hot products are much faster, a step could
prefetch the next layer's weights into L2 while attention streams KV below the HBM limit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from asyncrl.bench.graph_timing import graph_replay_ms
from asyncrl.bench.models import qwen2_config

NUM_LAYERS = 24
ROWS = 256


def main() -> None:
    config = qwen2_config("qwen2.5-0.5b")
    hidden, inner = config.hidden_size, config.intermediate_size
    q_out = config.num_attention_heads * config.head_dim
    qkv_out = q_out + 2 * config.num_key_value_heads * config.head_dim
    shapes = {"qkv": (hidden, qkv_out), "o": (q_out, hidden), "gate_up": (hidden, 2 * inner), "down": (inner, hidden)}

    def random(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * 0.02

    layers = [{name: random(outputs, inputs) for name, (inputs, outputs) in shapes.items()} for _ in range(NUM_LAYERS)]
    bias = random(qkv_out)
    inputs = {name: random(ROWS, size) for name, (size, _) in shapes.items()}

    def product(name: str, weight: torch.Tensor) -> torch.Tensor:
        if name == "qkv":
            return F.linear(inputs[name], weight, bias)
        return F.linear(inputs[name], weight)

    print(f"0.5B products at {ROWS} rows, us per product (graph of {NUM_LAYERS}): "
          "cold (weights from HBM) | hot (in L2)")
    for name in shapes:
        cold = graph_replay_ms(lambda: [product(name, layer[name]) for layer in layers], replays=20)
        hot = graph_replay_ms(lambda: [product(name, layers[0][name]) for _ in layers], replays=20)
        weight_mb = layers[0][name].numel() * 2 / 1e6
        print(f"{name:8s} ({weight_mb:5.1f} MB): {1e3 * cold / NUM_LAYERS:6.2f} | {1e3 * hot / NUM_LAYERS:6.2f}")
    cold = graph_replay_ms(lambda: [product(name, layer[name]) for layer in layers for name in shapes], replays=20)
    hot = graph_replay_ms(lambda: [product(name, layers[0][name]) for _ in layers for name in shapes], replays=20)
    print(f"a layer's four ({sum(w.numel() * 2 for w in layers[0].values()) / 1e6:.1f} MB): "
          f"{1e3 * cold / NUM_LAYERS:6.2f} | {1e3 * hot / NUM_LAYERS:6.2f} us per layer")


if __name__ == "__main__":
    main()
