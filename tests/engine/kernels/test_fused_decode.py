"""The fused decode products (`asyncrl.engine.kernels.fused_decode`): each product against the model's own
composition in torch, the engine's decode steps through them against a dense forward (before and after a weight
update), and the engine's choice ("auto" falls back to the model's layers where they cannot run). The GPU tests need a Hopper GPU;
the first builds the kernels (a minute or two).

    python -m pytest tests/engine/kernels/test_fused_decode.py -q
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from asyncrl.bench.models import qwen2_config
from asyncrl.config import ConfigError, load_config
from asyncrl.engine import EngineConfig, LLMEngine
from asyncrl.engine.kernels import fused_decode, selection
from asyncrl.engine.kernels.fused_decode import (DOWN, GATE_UP, QKV, FusedDecodeLayers, O, launch_sizes,
                                         slower_reason)
from asyncrl.models import CausalLM, build_tiny_model, fuse_projections, iter_named_tensors, load_model
from asyncrl.models import layer_features
from asyncrl.models.tiny import tiny_config

from .test_cuda_engine import assert_within_bf16_noise, requests_for, wide_folder  # noqa: F401 (a fixture)

needs_hopper = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                  reason="needs a Hopper GPU (sm_90)")
EPS = 1e-6


def model_stub(config) -> SimpleNamespace:
    """What the selection reads of a model: its config, and its modules (none adapted: no LoRA layers)."""
    return SimpleNamespace(config=config, modules=lambda: iter(()))


def normed(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The model's RMSNorm in bf16: fp32 statistics, rounded, then the weight."""
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + EPS)).to(x.dtype)


def relative_error(result: torch.Tensor, expected: torch.Tensor) -> float:
    return ((result.float() - expected.float()).abs().max() / expected.float().abs().max()).item()


@needs_hopper
@pytest.mark.parametrize("rows", [256, 37])
def test_each_fused_product_equals_the_models_composition(rows):
    product = fused_decode._extension().fused_product
    generator = torch.Generator(device="cuda").manual_seed(rows)

    def random(*shape, scale=1.0):
        return (torch.randn(shape, device="cuda", generator=generator) * scale).to(torch.bfloat16)

    hidden, qkv_size, inter = 448, 576, 1792
    x, attended, h = random(rows, hidden, scale=2.0), random(rows, hidden), random(rows, inter)
    norm_weight = (1.0 + 0.3 * torch.randn(hidden, device="cuda", generator=generator)).to(torch.bfloat16)
    w_qkv, b_qkv = random(qkv_size, hidden, scale=0.05), random(qkv_size, scale=0.5)
    w_o, w_gate_up, w_down = random(hidden, hidden, scale=0.05), random(2 * inter, hidden, scale=0.05), \
        random(hidden, inter, scale=0.02)
    squares = x.float().square().sum(-1)
    cleared = torch.full((rows,), 7.0, device="cuda")

    qkv = torch.empty((rows, qkv_size), dtype=torch.bfloat16, device="cuda")
    product(QKV, x, w_qkv * norm_weight, qkv, b_qkv, None, squares, None, cleared, EPS, False)
    assert relative_error(qkv, F.linear(normed(x, norm_weight), w_qkv, b_qkv)) < 2e-2
    assert (cleared == 0).all()  # the other statistics buffer, zeroed for the product that adds into it

    out, added = torch.empty_like(x), torch.zeros(rows, device="cuda")
    product(O, attended, w_o, out, None, x, None, added, None, EPS, False)
    expected = (x.float() + F.linear(attended, w_o).float()).to(torch.bfloat16)
    assert relative_error(out, expected) < 1e-2
    torch.testing.assert_close(added, out.float().square().sum(-1), rtol=1e-4, atol=0)  # the next norm's statistics

    activated = torch.empty((rows, inter), dtype=torch.bfloat16, device="cuda")
    product(GATE_UP, x, w_gate_up * norm_weight, activated, None, None, squares, None, None, EPS, True)
    gate, up = F.linear(normed(x, norm_weight), w_gate_up).chunk(2, dim=-1)
    assert relative_error(activated, F.silu(gate) * up) < 2e-2

    out, added = torch.empty_like(x), torch.zeros(rows, device="cuda")
    product(DOWN, h, w_down, out, None, x, None, added, None, EPS, True)  # K split over a cluster of four
    assert relative_error(out, (x.float() + F.linear(h, w_down).float()).to(torch.bfloat16)) < 1e-2
    torch.testing.assert_close(added, out.float().square().sum(-1), rtol=1e-4, atol=0)

    with pytest.raises(RuntimeError, match="residual"):  # a call the kernels cannot take names what is wrong
        product(O, attended, w_o, out, None, None, None, None, None, EPS, False)


@needs_hopper
def test_engine_decodes_through_the_fused_layers_and_refreshes_them_on_update(wide_folder, tmp_path):
    """bf16 tokens may diverge between paths (near-ties), so each result is checked against a teacher-forced dense
    forward of its own tokens; after an update, against the new weights (stale folded copies would fail it)."""
    engine = LLMEngine(wide_folder, EngineConfig(device="cuda", dtype=torch.bfloat16, max_num_seqs=64,
                                                  max_num_batched_tokens=2048, gpu_memory_utilization=0.15,
                                                  decode_products="fused"))
    assert engine.runner.kernels.fused_layers is not None and engine.runner.graphs.decode_forward == \
        engine.runner.kernels.fused_layers.forward
    assert_within_bf16_noise(wide_folder, engine.generate(requests_for(24, max_new_tokens=60))[:8])
    other = build_tiny_model(tmp_path / "other", family="qwen2", seed=12, init_std=0.1, hidden_size=448,
                             num_heads=7, num_kv_heads=1, num_layers=3, max_position_embeddings=512)
    engine.update_weights(iter_named_tensors(load_model(other, dtype=torch.bfloat16, device="cuda")), version=2)
    assert_within_bf16_noise(other, engine.generate(requests_for(24, max_new_tokens=60))[:8])


def test_engine_config_checks_decode_products():
    with pytest.raises(ValueError, match="engine.decode_products"):
        EngineConfig(device="cuda:0", decode_products="cutlass")
    with pytest.raises(ValueError, match="needs engine.decode_attention"):
        EngineConfig(device="cuda:0", decode_products="fused", decode_attention="triton")


def test_run_config_rejects_fused_products_with_the_triton_kernel():
    with pytest.raises(ConfigError, match="rollout.decode_products=fused"):
        load_config(overrides=["rollout.decode_products=fused", "rollout.decode_attention=triton"])


@pytest.mark.parametrize("asked", ["auto", "fused"])
def test_auto_falls_back_to_the_models_layers_with_a_warning(monkeypatch, caplog, asked):
    def load(model, max_rows):
        raise RuntimeError("the fused decode layers could not be built (no nvcc)")

    monkeypatch.setattr(fused_decode, "load_fused_decode_layers", load)
    config = EngineConfig(device="cuda:0", dtype=torch.bfloat16, decode_products=asked)
    model = model_stub(qwen2_config("qwen2.5-0.5b"))
    if asked == "auto":
        assert selection.load_fused_layers(model, config, "cuda", 8, 132) is None
        assert "runs the model's layers" in caplog.text and "no nvcc" in caplog.text
    else:  # asked for by name, a failed build is an error
        with pytest.raises(RuntimeError, match="no nvcc"):
            selection.load_fused_layers(model, config, "cuda", 8, 132)
    # Without the CUDA attention kernel, "auto" says why; fp32 and "torch" never try.
    caplog.clear()
    auto = EngineConfig(device="cuda:0", dtype=torch.bfloat16)
    assert selection.load_fused_layers(model, auto, "triton", 8, 132) is None
    assert "need the CUDA decode-attention kernel" in caplog.text
    assert selection.load_fused_layers(model, EngineConfig(device="cuda:0", dtype=torch.float32), "cuda", 8, 132) is None
    assert selection.load_fused_layers(model, EngineConfig(device="cuda:0", dtype=torch.bfloat16,
                                                              decode_products="torch"), "cuda", 8, 132) is None


def test_auto_keeps_the_models_layers_where_a_fused_launch_would_take_two_waves(caplog):
    """The tiles are sized for one wave of 132 SMs at 256 rows of the 0.5B shapes: 72, 56, 122 and 112 CTAs. The
    1.5B gate/up takes 224 (measured slower fused: 0.500 against 0.562 of the roofline)."""
    small, large = qwen2_config("qwen2.5-0.5b"), qwen2_config("qwen2.5-1.5b")
    assert launch_sizes(small, 256) == {"q/k/v": 72, "o": 56, "gate/up": 122, "down": 112}
    assert slower_reason(small, 256, 132) is None
    assert slower_reason(small, 512, 132) == "at 512 rows the q/k/v product launches 144 CTAs, more than one wave of 132 SMs"
    assert "gate/up product launches 224 CTAs" in slower_reason(large, 256, 132)
    caplog.set_level("INFO")
    config = EngineConfig(device="cuda:0", dtype=torch.bfloat16)
    assert selection.load_fused_layers(model_stub(large), config, "cuda", 256, 132) is None
    assert "224 CTAs" in caplog.text


@pytest.mark.parametrize(("family", "overrides", "reason"), [
    ("qwen3", {}, "implement the llama, qwen2 families, not qwen3"),
    ("mixtral", {}, "implement the llama, qwen2 families, not mixtral"),
    ("llama", {"attention_bias": True}, "do not implement o_proj bias"),
], ids=["qwen3", "mixtral", "llama-with-biases"])
def test_a_family_or_flag_off_the_allow_list_runs_the_models_layers(monkeypatch, caplog, family, overrides, reason):
    """Only what `FUSED_DECODE_LAYERS` lists runs fused: the rest takes the readable path under "auto" (before any
    build is tried), and is an error naming what is missing where "fused" is asked for by name."""
    monkeypatch.setattr(fused_decode, "load_fused_decode_layers", lambda model, max_rows: pytest.fail("built"))
    model = model_stub(tiny_config(family, hidden_size=256, intermediate_size=512, num_heads=4, num_kv_heads=2,
                                   **overrides))
    caplog.set_level("INFO")
    assert selection.load_fused_layers(model, EngineConfig(device="cuda:0", dtype=torch.bfloat16), "cuda", 8,
                                       132) is None
    assert reason in caplog.text
    with pytest.raises(RuntimeError, match=f"decode_products='fused' cannot run this model: the fused decode "
                                           f"layers {reason}"):
        selection.load_fused_layers(model, EngineConfig(device="cuda:0", dtype=torch.bfloat16,
                                                        decode_products="fused"), "cuda", 8, 132)


def test_a_layer_flag_added_later_keeps_the_fused_layers_off_until_they_list_it(monkeypatch):
    """A new flag (here a made-up sliding window) is on no allow-list: a listed family with it runs the model's
    layers; without it the same model reaches the fused layers."""
    monkeypatch.setattr(fused_decode, "load_fused_decode_layers", lambda model, max_rows: "fused layers")
    model = model_stub(tiny_config("llama", hidden_size=256, intermediate_size=512, num_heads=4, num_kv_heads=2))
    config = EngineConfig(device="cuda:0", dtype=torch.bfloat16)
    assert selection.load_fused_layers(model, config, "cuda", 8, 132) == "fused layers"
    flags = layer_features.layer_flags
    monkeypatch.setattr(layer_features, "layer_flags", lambda model_config: flags(model_config) | {"sliding window"})
    assert selection.load_fused_layers(model, config, "cuda", 8, 132) is None


class TorchProducts:
    """The fused products' semantics in torch, without their roundings (`FusedProducts`; fp32 on CPU)."""

    @staticmethod
    def fused_product(kind, a, w, out, bias, residual, squares_in, squares_out, squares_clear, eps, programmatic):
        if squares_clear is not None:
            squares_clear.zero_()
        product = a.float() @ w.float().T
        if squares_in is not None:
            product = product * torch.rsqrt(squares_in[:, None] / a.shape[1] + eps)
        if kind == GATE_UP:
            gate, up = product.chunk(2, dim=-1)
            product = F.silu(gate) * up
        if bias is not None:
            product = product + bias.float()
        if residual is not None:
            product = product + residual.float()
        out.copy_(product)
        if squares_out is not None:
            squares_out.add_(out.float().square().sum(-1))


class SelfOnlyAttention:
    """Attention over a context of one token, the new one: each query head gets its kv head's value. q and k do not
    matter, so a backend that rotates and one that does not give the same output."""

    def __init__(self, rotates: bool) -> None:
        self.rotates = rotates

    def attend(self, layer_index, query, key, value, rotary=None):
        assert (rotary is not None) == self.rotates
        return value.repeat_interleave(query.shape[1] // value.shape[1], dim=1)


def test_fused_layers_compute_the_models_decode_forward_and_follow_weight_updates():
    """The wiring of `FusedDecodeLayers.forward` (the folded weights, the statistics passed from product to product,
    the residuals), on CPU in fp32 with the products' semantics in torch: the model's own forward, to float rounding."""
    torch.manual_seed(0)
    model = CausalLM(tiny_config("qwen2", num_layers=3)).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:  # norm weights that are not all ones, so the fold is exercised
                parameter.copy_(1.0 + 0.5 * torch.randn_like(parameter))
    fuse_projections(model.model)
    layers = FusedDecodeLayers(model, max_rows=8, products=TorchProducts())
    input_ids, positions = torch.tensor([5, 17, 3, 9, 30]), torch.tensor([4, 0, 11, 7, 2])
    with torch.no_grad():
        expected = model(input_ids, positions, SelfOnlyAttention(rotates=False))
        torch.testing.assert_close(layers.forward(input_ids, positions, SelfOnlyAttention(rotates=True)), expected,
                                   atol=1e-5, rtol=1e-5)
        for parameter in model.parameters():  # an in-place update, as `update_weights` writes it
            parameter.mul_(1.1)
        updated = model(input_ids, positions, SelfOnlyAttention(rotates=False))
        stale = layers.forward(input_ids, positions, SelfOnlyAttention(rotates=True))
        assert (stale - updated).abs().max() > 1e-3  # the folded copies still hold the old weights
        layers.refresh_weights()
        torch.testing.assert_close(layers.forward(input_ids, positions, SelfOnlyAttention(rotates=True)), updated,
                                   atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="rotates q and k itself"):
        layers.forward(input_ids, positions, SelfOnlyAttention(rotates=False))
