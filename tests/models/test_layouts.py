"""Dense (B, T) and flattened (N,) layouts agree; gradient checkpointing; value model shapes."""

from __future__ import annotations

import pytest
import torch

from asyncrl.models import CausalLM, PackedCausalAttention, ValueModel, load_model, tiny_config
from asyncrl.models.rope import apply_rotary, compute_inv_freq

from .helpers import FAMILY_CASES, right_padded_batch

LENGTHS = [9, 4, 1, 6]


def _packed_inputs(input_ids: torch.Tensor, lengths: list[int]) -> tuple[torch.Tensor, PackedCausalAttention]:
    attention = PackedCausalAttention.from_lengths(lengths)
    packed_ids = torch.cat([row[:length] for row, length in zip(input_ids, lengths)])  # (N,)
    return packed_ids, attention


@pytest.mark.parametrize("case", list(FAMILY_CASES))
def test_dense_and_packed_give_the_same_logits(family_folders, case):
    model = load_model(family_folders[case])
    input_ids, positions, attention_mask = right_padded_batch(LENGTHS, model.config.vocab_size, seed=3)
    packed_ids, attention = _packed_inputs(input_ids, LENGTHS)
    with torch.no_grad():
        dense = model.compute_logits(model(input_ids, positions))  # (B, T, V)
        packed = model.compute_logits(model(packed_ids, attention.positions(), attention))  # (N, V)
    assert packed.shape == (sum(LENGTHS), model.config.vocab_size)
    assert (dense[attention_mask.bool()] - packed).abs().max().item() <= 1e-5


def test_packed_positions_and_mask_are_block_causal():
    attention = PackedCausalAttention(torch.tensor([0, 3, 5]))
    assert attention.positions().tolist() == [0, 1, 2, 0, 1]
    mask = attention._block_causal_mask(torch.device("cpu"))
    expected = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 1, 1]])
    assert torch.equal(mask, expected.bool())


def test_packed_attention_rejects_bad_cu_seqlens_and_token_counts():
    with pytest.raises(ValueError, match=r"strictly increasing, got \[0, 3, 3\]"):
        PackedCausalAttention(torch.tensor([0, 3, 3]))
    with pytest.raises(ValueError, match=r"start at 0"):
        PackedCausalAttention(torch.tensor([1, 3]))
    attention = PackedCausalAttention.from_lengths([2, 2])
    with pytest.raises(ValueError, match="expects 4 tokens"):
        attention.attend(0, torch.zeros(3, 4, 8), torch.zeros(3, 2, 8), torch.zeros(3, 2, 8))


def test_layout_errors_name_the_expected_shapes(qwen2_model):
    ids = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"positions must have the shape of input_ids"):
        qwen2_model(ids, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"dense layout \(attention=None\) needs input_ids \(B, T\)"):
        qwen2_model(ids.flatten(), ids.flatten())
    with pytest.raises(ValueError, match=r"an AttentionBackend needs flattened input_ids \(N,\)"):
        qwen2_model(ids, ids, PackedCausalAttention.from_lengths([6]))


class RecordingBackend:
    """A fake engine backend: checks the protocol's shapes and layer order, delegates to the packed one."""

    rotates = False

    def __init__(self, lengths: list[int]) -> None:
        self.inner = PackedCausalAttention.from_lengths(lengths)
        self.layer_indices: list[int] = []
        self.shapes: list[tuple] = []

    def attend(self, layer_index, query, key, value):
        self.layer_indices.append(layer_index)
        self.shapes.append((tuple(query.shape), tuple(key.shape), tuple(value.shape)))
        return self.inner.attend(layer_index, query, key, value)


def test_backend_receives_protocol_shapes_in_layer_order(family_folders):
    model = load_model(family_folders["qwen3_qk_norm"])  # head_dim 32 != hidden / heads
    backend = RecordingBackend([3, 2])
    with torch.no_grad():
        model(torch.arange(5), backend.inner.positions(), backend)
    config = model.config
    assert backend.layer_indices == list(range(config.num_hidden_layers))
    head_dim = config.head_dim
    expected = ((5, config.num_attention_heads, head_dim), (5, config.num_key_value_heads, head_dim),
                (5, config.num_key_value_heads, head_dim))
    assert backend.shapes == [expected] * config.num_hidden_layers


class RotatingBackend:
    """A fake backend that applies RoPE itself, as the engine's CUDA decode kernel does: it records the q/k it
    receives (before RoPE) and rotates them with the given cos/sin before the packed backend attends."""

    rotates = True

    def __init__(self, lengths: list[int]) -> None:
        self.inner = PackedCausalAttention.from_lengths(lengths)
        self.received: list[tuple[torch.Tensor, torch.Tensor]] = []

    def attend(self, layer_index, query, key, value, rotary=None):
        assert rotary is not None, "a backend that rotates gets cos/sin"
        self.received.append((query.clone(), key.clone()))
        return self.inner.attend(layer_index, apply_rotary(query, *rotary), apply_rotary(key, *rotary), value)


@pytest.mark.parametrize("case", ["qwen2_bias_tied", "qwen3_qk_norm"])
def test_a_backend_that_rotates_gets_q_and_k_before_rope_and_the_same_logits(family_folders, case):
    model = load_model(family_folders[case])
    lengths = [3, 2]
    ids = torch.arange(5) + 7
    plain, rotating = RecordingBackend(lengths), RotatingBackend(lengths)
    with torch.no_grad():
        expected = model.compute_logits(model(ids, plain.inner.positions(), plain))
        logits = model.compute_logits(model(ids, rotating.inner.positions(), rotating))
        # What layer 0 must have received: its projection with `rotate` False, from the embedding's norm.
        layer = model.model.layers[0]
        hidden, cos, sin = model.model.embed(ids, rotating.inner.positions())
        query, key, _ = layer.self_attn.project(layer.input_layernorm(hidden), cos, sin, rotate=False)
        rotated_query, _, _ = layer.self_attn.project(layer.input_layernorm(hidden), cos, sin)
    assert len(rotating.received) == model.config.num_hidden_layers
    assert torch.equal(rotating.received[0][0], query) and torch.equal(rotating.received[0][1], key)
    assert not torch.allclose(query[1:], rotated_query[1:])  # position 0 is the identity rotation
    assert (logits - expected).abs().max().item() <= 1e-6


def _gradients(model: CausalLM, input_ids: torch.Tensor, positions: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad()
    logits = model.compute_logits(model(input_ids, positions))
    torch.log_softmax(logits, dim=-1)[..., 0].sum().backward()
    return {name: parameter.grad.clone() for name, parameter in model.named_parameters()}


def test_gradient_checkpointing_gives_the_same_gradients(family_folders):
    model = load_model(family_folders["llama3_scaled_untied"])
    model.train()
    input_ids, positions, _ = right_padded_batch(LENGTHS, model.config.vocab_size, seed=4)
    plain = _gradients(model, input_ids, positions)
    model.set_gradient_checkpointing(True)
    checkpointed = _gradients(model, input_ids, positions)
    assert model.model.gradient_checkpointing
    assert plain.keys() == checkpointed.keys()
    for name in plain:
        assert plain[name].abs().sum() > 0, name  # every parameter gets a gradient
        assert torch.allclose(plain[name], checkpointed[name], atol=1e-6), name


def test_value_model_shapes_in_both_layouts(family_folders):
    critic = load_model(family_folders["qwen2_bias_tied"], kind="value")
    assert isinstance(critic, ValueModel)
    input_ids, positions, attention_mask = right_padded_batch(LENGTHS, critic.config.vocab_size, seed=5)
    packed_ids, attention = _packed_inputs(input_ids, LENGTHS)
    with torch.no_grad():
        dense = critic(input_ids, positions)
        packed = critic(packed_ids, attention.positions(), attention)
    assert dense.shape == input_ids.shape and dense.dtype == torch.float32
    assert packed.shape == (sum(LENGTHS),)
    assert (dense[attention_mask.bool()] - packed).abs().max().item() <= 1e-5
    # A fresh head: small nonzero values, zero bias.
    assert 0 < dense.abs().max().item() < 1.0
    assert critic.score.bias.item() == 0.0


def test_rope_frequencies_stay_fp32_through_dtype_casts():
    config = tiny_config("llama", rope_theta=500000.0)
    model = CausalLM(config).to(torch.bfloat16)
    assert model.lm_head.weight.dtype == torch.bfloat16
    inv_freq = model.model.rotary_emb.inv_freq
    assert inv_freq.dtype == torch.float32 and torch.equal(inv_freq, compute_inv_freq(config))
