"""The decode step's layers as four fused CUDA products each (`csrc/fused_product_kernel.cuh`, torch entry
`csrc/fused_products.cu`), built on first use. Hopper (sm_90) and bf16 only.

    layers = load_fused_decode_layers(model, max_rows)   # RuntimeError where they cannot be built or used
    hidden = layers.forward(input_ids, positions, attention)  # the final-normed hidden states, as `model(...)`
    layers.refresh_weights()                              # after the model's weights were updated in place

Why. Around the attention kernel the model's decode layer is eight kernels (two add + norm, the q/k/v, o, gate/up
and down products, SiLU x up, and cuBLAS's split-K reduction for down). Each costs its launch, its pipeline's start
and its last wave's tail, and at 256 rows those fixed costs, not bandwidth or arithmetic, set a 0.5B model's step
(attention's added cost per position of context already streams the KV cache at the memory's limit). Here a layer
is four products of our own around attention:

    q/k/v  = r1 * (x (W_qkv * g1)^T) + b      r1 = rsqrt(mean(x^2) + eps), from statistics, below
    x_mid  = x + attended W_o^T               (+ the rows' sums of squares of x_mid, for r2)
    h      = SiLU(r2 * gate) * (r2 * up)      gate/up = x_mid (W_gate_up * g2)^T
    x      = x_mid + h W_down^T               K split over clusters of 4 CTAs (+ the squares of x, for r1)

- The norms disappear into the products: norm(x) W^T = r * (x (W * g)^T), with the norm's weight g folded into a
  copy of the weight (`refresh_weights` recomputes the copies). Each residual product adds up the squares of the
  rows it writes, one atomic per row and CTA, so the next product knows r without reading the rows twice.
- The products are programmatic dependent launches: each starts while the one before it finishes, setting up and
  requesting its first stages of weights before it waits for its input.

What they implement: the families and layer flags of `models/layer_features.FUSED_DECODE_LAYERS`; a model with any
other family or flag runs the model's layers (an error only where engine.decode_products='fused' asks for these).

Numerics: the products round where the model's path does not (the folded weights are bf16, r is applied to the fp32
accumulator instead of before a bf16 rounding of the normed input), so decode steps agree with the model's path to
bf16 rounding, not bit for bit. Prefill runs the model's path.
"""

from __future__ import annotations

import functools
from typing import Protocol

import torch
from torch import Tensor

from asyncrl.engine.attention import PagedAttention
from asyncrl.engine.kernels.cuda_build import SOURCES, build_extension
from asyncrl.models.layer_features import FUSED_DECODE_LAYERS
from asyncrl.models.model_config import TransformerConfig
from asyncrl.models.transformer import CausalLM

ENTRY = SOURCES / "fused_products.cu"  # the torch entry; it includes the kernel, fused_product_kernel.cuh
_DECLARATION = ("void fused_product(int64_t kind, torch::Tensor a, torch::Tensor w, torch::Tensor out, "
                "std::optional<torch::Tensor> bias, std::optional<torch::Tensor> residual, "
                "std::optional<torch::Tensor> squares_in, std::optional<torch::Tensor> squares_out, "
                "std::optional<torch::Tensor> squares_clear, double eps, bool programmatic);")
QKV, O, GATE_UP, DOWN = 0, 1, 2, 3  # the entry's product kinds
DOWN_SPLITS = 4  # down's K is split over clusters of this many CTAs


class FusedProducts(Protocol):
    """What runs the products: the CUDA extension (`_extension()`), or their semantics in torch (the CPU tests)."""

    def fused_product(self, kind: int, a: Tensor, w: Tensor, out: Tensor, bias: Tensor | None,
                      residual: Tensor | None, squares_in: Tensor | None, squares_out: Tensor | None,
                      squares_clear: Tensor | None, eps: float, programmatic: bool) -> None:
        """Writes product `kind` (QKV, O, GATE_UP, DOWN) of a (M, K) and w into out, as `csrc/fused_products.cu`
        describes: r from `squares_in`, the bias, SiLU x up, the residual; zeroes `squares_clear` and adds the
        output rows' squares into `squares_out`."""
        ...


@functools.cache
def _extension() -> FusedProducts:
    # wgmma and TMA need the architecture-specific target; an -gencode flag replaces torch's default ones.
    return build_extension("asyncrl_fused_products", ENTRY, _DECLARATION, ["fused_product"],
                           ("-gencode=arch=compute_90a,code=sm_90a",))


def unsupported_reason(model: CausalLM) -> str | None:
    """Why the fused layers cannot run this model where it is (None: they can)."""
    config, weight = model.config, model.lm_head.weight
    if weight.device.type != "cuda" or torch.cuda.get_device_capability(weight.device) != (9, 0):
        return f"they need a Hopper GPU (sm_90), the model is on {weight.device}"
    if weight.dtype != torch.bfloat16:
        return f"they need bf16 weights, got {weight.dtype}"
    reason = FUSED_DECODE_LAYERS.unsupported_reason(config)   # the families and layer flags implemented here
    if reason is not None:
        return reason
    products = {"hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size}
    for name, size in products.items():
        if size % 64 or size // 64 < DOWN_SPLITS:
            return f"they need {name} a multiple of 64 and at least {64 * DOWN_SPLITS}, got {size}"
    return None


def launch_sizes(config: TransformerConfig, rows: int) -> dict[str, int]:
    """CTAs of each product's launch at `rows` rows, with `fused_products.cu`'s tiles (one CTA per SM)."""
    qkv_size = (config.num_attention_heads + 2 * config.num_key_value_heads) * config.head_dim
    row_tiles_128, row_tiles_256 = -(-rows // 128), -(-rows // 256)
    return {"q/k/v": -(-qkv_size // 32) * row_tiles_128, "o": -(-config.hidden_size // 32) * row_tiles_128,
            "gate/up": -(-config.intermediate_size // 40) * row_tiles_256,
            "down": -(-config.hidden_size // 64) * DOWN_SPLITS * row_tiles_128}


def slower_reason(config: TransformerConfig, rows: int, num_processors: int) -> str | None:
    """Why the fused layers would likely be slower than the model's for this shape (None: they should be faster).
    Their tiles are sized for one wave of CTAs at 256 rows of the 0.5B shapes; a launch of more CTAs than SMs runs
    a second, mostly idle wave (on an H200 the 1.5B shapes decode at 0.500 of the roofline fused, 0.562 unfused)."""
    for name, size in launch_sizes(config, rows).items():
        if size > num_processors:
            return (f"at {rows} rows the {name} product launches {size} CTAs, more than one wave of "
                    f"{num_processors} SMs")
    return None


class FusedDecodeLayers:
    """The model's decoder layers for decode steps, as the module doc describes. Holds the folded weight copies
    and two statistics buffers of `max_rows` (the decode graphs' largest bucket). `products` is what provides
    `fused_product` (default: the CUDA extension; the CPU tests pass its semantics in torch)."""

    def __init__(self, model: CausalLM, max_rows: int, products: FusedProducts | None = None) -> None:
        self.backbone = model.model
        self.extension = _extension() if products is None else products
        layers = self.backbone.layers
        # g folded into copies of the fused q/k/v and gate/up matrices (`fuse_projections` made them).
        self.folded_qkv = [torch.empty_like(layer.self_attn.qkv_weight) for layer in layers]
        self.folded_gate_up = [torch.empty_like(layer.mlp.gate_up_weight) for layer in layers]
        self.refresh_weights()
        # Row sums of squares of the stream x and of x_mid: written by down and o, read by q/k/v and gate/up.
        self.squares = torch.zeros((2, max_rows), dtype=torch.float32, device=model.lm_head.weight.device)
        self.eps = float(layers[0].input_layernorm.eps)

    @property
    def num_bytes(self) -> int:
        """Device memory of the folded weight copies."""
        return sum(weight.numel() * weight.element_size() for weight in [*self.folded_qkv, *self.folded_gate_up])

    @torch.no_grad()
    def refresh_weights(self) -> None:
        """Recomputes the folded copies from the model's weights (after an in-place update)."""
        for layer, qkv, gate_up in zip(self.backbone.layers, self.folded_qkv, self.folded_gate_up, strict=True):
            torch.mul(layer.self_attn.qkv_weight, layer.input_layernorm.weight, out=qkv)
            torch.mul(layer.mlp.gate_up_weight, layer.post_attention_layernorm.weight, out=gate_up)

    def forward(self, input_ids: Tensor, positions: Tensor, attention: PagedAttention) -> Tensor:
        """A decode step's (S,) tokens -> final-normed hidden states (S, hidden), as `model(...)` returns them.
        `attention` must rotate q and k itself (the CUDA decode kernel's `rotates`)."""
        if not attention.rotates:
            raise ValueError("FusedDecodeLayers needs a decode attention backend that rotates q and k itself "
                             "(engine.decode_attention='cuda')")
        hidden, cos, sin = self.backbone.embed(input_ids, positions)
        rows = hidden.shape[0]
        stream_squares, mid_squares = self.squares[0, :rows], self.squares[1, :rows]
        torch.sum(hidden.float().square(), dim=-1, out=stream_squares)
        product = self.extension.fused_product
        for layer, qkv_weight, gate_up_weight in zip(self.backbone.layers, self.folded_qkv, self.folded_gate_up,
                                                     strict=True):
            attn, mlp = layer.self_attn, layer.mlp
            qkv = hidden.new_empty((rows, qkv_weight.shape[0]))
            product(QKV, hidden, qkv_weight, qkv, attn.qkv_bias, None, stream_squares, None, mid_squares, self.eps,
                    True)
            query, key, value = qkv.split(attn.projection_sizes, dim=-1)
            attended = attn.attend(query.view(rows, attn.num_heads, attn.head_dim),
                                   key.view(rows, attn.num_kv_heads, attn.head_dim),
                                   value.view(rows, attn.num_kv_heads, attn.head_dim), attention, (cos, sin))
            mid = torch.empty_like(hidden)
            product(O, attended, attn.o_proj.weight, mid, None, hidden, None, mid_squares, None, self.eps, True)
            activated = hidden.new_empty((rows, gate_up_weight.shape[0] // 2))
            product(GATE_UP, mid, gate_up_weight, activated, None, None, mid_squares, None, stream_squares, self.eps,
                    True)
            hidden = torch.empty_like(mid)
            product(DOWN, activated, mlp.down_proj.weight, hidden, None, mid, None, stream_squares, None, self.eps,
                    True)
        return self.backbone.norm(hidden)


def load_fused_decode_layers(model: CausalLM, max_rows: int) -> FusedDecodeLayers:
    """The fused layers for `model`, built now (a minute the first time on a machine); RuntimeError naming why
    where they cannot run it or cannot be built."""
    reason = unsupported_reason(model)
    if reason is not None:
        raise RuntimeError(f"the fused decode layers cannot run this model: {reason}")
    try:
        return FusedDecodeLayers(model, max_rows)
    except Exception as error:  # no CUDA toolkit, a compiler error: say which, and what to set instead
        first_line = str(error).splitlines()[0] if str(error) else ""
        raise RuntimeError(f"the fused decode layers could not be built ({type(error).__name__}: {first_line}); "
                           f"engine.decode_products='torch' does without them") from error
