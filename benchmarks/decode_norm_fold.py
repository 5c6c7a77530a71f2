"""Would folding each RMSNorm's weight into the product after it shorten a decode layer?

    python benchmarks/decode_norm_fold.py [--model qwen2.5-0.5b] [--rows 256] [--profile] [--coordinate-descent]

A decode layer runs nine kernels; two of them are Inductor's residual add + RMSNorm (before q/k/v and before
gate/up). Folded, a norm disappears: norm(x) @ W.T = r * (x @ (W * w).T), with r = rsqrt(mean(x^2) + eps) a
number per row. The product then reads the stream x itself, and r is applied by the product's consumer. The
residual adds go into the o and down products, as cuBLAS's in-place beta = 1 (`x.addmm_`, no copy of x), so
nothing is left for the norms' kernels to fuse. The layer becomes, around attention:

- now:    add + norm, q/k/v (+ bias), [attention], o, add + norm, gate/up, SiLU x up, down (+ split-K reduce);
- folded: q/k/v, r * qkv + bias, [attention], o += , gate/up, SiLU(r * gate) x (r * up), down += ;
- folded into attention: the same without `r * qkv + bias`, which the attention kernel would do as it loads
  q/k/v (not built: this variant bounds what that would give, minus the kernel's extra prologue).

Each variant runs the 24 layers of the 0.5B (or 1.5B) shapes with distinct weights, in one CUDA graph, the
attention kernel left out (a view of the query stands in for its output, the same in every variant). The
elementwise halves are compiled by Inductor with the engine's settings (`dynamic=True`). It also checks that
the folded layers compute what the engine's layers compute, with norm weights that are not all ones.

Answer (one H200, 2026-12-04, docs/benchmarks.md, sixteenth round): no. Inductor compiles SiLU(r * gate) x
(r * up) as two kernels that cost more than the two norms; even with r free, the fold saves ~2 us per layer.
"""

from __future__ import annotations

import argparse

import torch
import torch._inductor.config
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from asyncrl.bench.graph_timing import graph_replay_ms
from asyncrl.bench.models import qwen2_config, random_model
from asyncrl.models import compile_decoder_layers, fuse_projections


class QueryAsOutput:
    """Stands in for the attention kernel: its output is the query's view, so no variant pays for attention."""
    rotates = True

    def attend(self, layer_index, query, key, value, rotary=None):
        return query


def row_scale(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm's per-row factor in fp32, (rows, 1)."""
    return torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)


def scale_and_bias(qkv: torch.Tensor, x: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    return (row_scale(x, eps) * qkv.float() + bias.float()).to(qkv.dtype)


def folded_swiglu(gate_up: torch.Tensor, x: torch.Tensor, eps: float) -> torch.Tensor:
    scale = row_scale(x, eps)
    gate, up = gate_up.float().chunk(2, dim=-1)
    return (F.silu(scale * gate) * (scale * up)).to(gate_up.dtype)


def plain_swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def folded_weights(model) -> list[dict]:
    """Per layer: q/k/v and gate/up with their norm's weight folded into the columns, o and down transposed."""
    layers = []
    for layer in model.model.layers:
        attention, mlp = layer.self_attn, layer.mlp
        layers.append({
            "qkv": (attention.qkv_weight.float() * layer.input_layernorm.weight.float()).to(attention.qkv_weight.dtype),
            "bias": attention.qkv_bias,
            "o_t": attention.o_proj.weight.t(),
            "gate_up": (mlp.gate_up_weight.float() * layer.post_attention_layernorm.weight.float()).to(
                mlp.gate_up_weight.dtype),
            "down_t": mlp.down_proj.weight.t(),
        })
    return layers


def engine_model(name: str):
    """The engine's compiled layers at a Qwen2.5 size, random weights, with norms that are not all ones (so a fold
    that dropped them would show in the error)."""
    model = random_model(qwen2_config(name), torch.bfloat16, "cuda")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.input_layernorm.weight.normal_(1.0, 0.2)
            layer.post_attention_layernorm.weight.normal_(1.0, 0.2)
    fuse_projections(model.model)
    compile_decoder_layers(model)
    return model


class FoldedLayers:
    """The model's layers with each norm folded into the product after it, the stream updated in place."""

    def __init__(self, model, source: torch.Tensor) -> None:
        config = model.config
        self.weights = folded_weights(model)
        self.eps, self.heads_width = config.rms_norm_eps, config.num_attention_heads * config.head_dim
        self.source = source
        self.state, self.mixed = torch.empty_like(source), torch.empty_like(source)
        self.scale_bias = torch.compile(scale_and_bias, fullgraph=True, dynamic=True)
        self.scaled_swiglu = torch.compile(folded_swiglu, fullgraph=True, dynamic=True)
        self.plain_swiglu = torch.compile(plain_swiglu, fullgraph=True, dynamic=True)

    def __call__(self, into_attention: bool, scaled_swiglu: bool = True, residual: bool = True) -> torch.Tensor:
        """`scaled_swiglu` False (SiLU x up without r) and `residual` False (o and down as plain products, the
        stream not updated) compute something else: they only split the folded layer's time into its parts."""
        state, mixed, eps = self.state, self.mixed, self.eps
        state.copy_(self.source)  # the stream is updated in place; every replay starts from the same values
        for weights in self.weights:
            qkv = F.linear(state, weights["qkv"])
            if not into_attention:
                qkv = self.scale_bias(qkv, state, weights["bias"], eps)
            attended = qkv[:, :self.heads_width]
            if residual:
                state.addmm_(attended, weights["o_t"])
            else:
                torch.mm(attended, weights["o_t"], out=mixed)
            gate_up = F.linear(state if residual else mixed, weights["gate_up"])
            activation = self.scaled_swiglu(gate_up, state, eps) if scaled_swiglu else self.plain_swiglu(gate_up)
            if residual:
                state.addmm_(activation, weights["down_t"])
            else:
                torch.mm(activation, weights["down_t"], out=mixed)
        return state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-0.5b")
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--profile", action="store_true", help="also each kernel's time in two variants")
    parser.add_argument("--coordinate-descent", action="store_true",
                        help="Inductor tunes each generated kernel's block sizes and warps at compile time")
    args = parser.parse_args()
    torch._inductor.config.coordinate_descent_tuning = args.coordinate_descent
    model = engine_model(args.model)
    config, num_layers = model.config, model.config.num_hidden_layers
    generator = torch.Generator(device="cuda").manual_seed(0)
    source = torch.randn(args.rows, config.hidden_size, device="cuda", dtype=torch.bfloat16, generator=generator)
    folded = FoldedLayers(model, source)
    backend = QueryAsOutput()
    cos = sin = torch.zeros(args.rows, config.head_dim, device="cuda", dtype=torch.bfloat16)

    def engine_layers() -> torch.Tensor:
        hidden, update = source, None
        for layer in model.model.layers:
            hidden, update = layer.paged_forward(hidden, update, cos, sin, backend)
        return (hidden.float() + update.float()).to(hidden.dtype)

    with torch.no_grad():
        reference = engine_layers().float()
        error = ((folded(False).float() - reference).norm() / reference.norm()).item()
        print(f"{args.model}, {args.rows} rows, {num_layers} layers: folded against the engine's layers, "
              f"relative error {error:.2e} (bf16 rounding is ~4e-3)")

        def into_attention() -> torch.Tensor:
            return folded(True)

        timings = {
            "engine's layers (add + norm kernels)": engine_layers,
            "folded, r * qkv + bias as a kernel": lambda: folded(False),
            "folded into attention (no r * qkv kernel)": into_attention,
            "  part: that, SiLU x up without r": lambda: folded(True, scaled_swiglu=False),
            "  part: that, o and down without the residual": lambda: folded(True, False, residual=False),
        }
        for label, launch in timings.items():
            per_step = [graph_replay_ms(launch, replays=20) * 1e3 for _ in range(3)]
            print(f"  {label}: {min(per_step):7.1f} us per step ({min(per_step) / num_layers:5.2f} us per layer), "
                  f"runs {' '.join(f'{value:.1f}' for value in per_step)}")
        if args.profile:
            print_kernel_times("engine's layers (add + norm kernels)", engine_layers, num_layers)
            print_kernel_times("folded into attention (no r * qkv kernel)", into_attention, num_layers)


def print_kernel_times(label: str, launch, num_layers: int, steps: int = 5) -> None:
    """The GPU time of each kernel name, per layer, over `steps` eager calls (kernels only, no gaps)."""
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        for _ in range(steps):
            launch()
        torch.cuda.synchronize()
    print(f"  kernels of {label!r}, us per layer:")
    for event in sorted(profiler.key_averages(), key=lambda event: -event.device_time_total)[:12]:
        print(f"    {event.device_time_total / steps / num_layers:6.2f}  x{event.count / steps / num_layers:4.1f}  "
              f"{event.key[:110]}")


if __name__ == "__main__":
    main()
