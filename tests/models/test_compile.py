"""The speed-ups of `asyncrl.models.compile` keep the model's numbers, names and in-place updates.

Compiled layers are traced with the `aot_eager` backend here (dynamo + AOTAutograd, forward and backward,
no code generation): on CPU that checks the same graphs CUDA's inductor compiles, without a compiler.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from asyncrl.models import PackedCausalAttention, compile_decoder_layers, fuse_projections, load_model

from .helpers import FAMILY_CASES, right_padded_batch


@pytest.mark.parametrize("case", list(FAMILY_CASES))
def test_fused_projections_match_separate_ones(family_folders: dict[str, Path], case: str) -> None:
    reference, fused = load_model(family_folders[case]), load_model(family_folders[case])
    names_before = [name for name, _ in fused.named_parameters()]
    fuse_projections(fused.model)
    assert [name for name, _ in fused.named_parameters()] == names_before
    input_ids, positions, _ = right_padded_batch([7, 5], fused.config.vocab_size, seed=1)
    with torch.no_grad():
        difference = (reference(input_ids, positions) - fused(input_ids, positions)).abs().max().item()
    assert difference <= 1e-5


def test_in_place_update_of_a_fused_view_changes_the_output(family_folders: dict[str, Path]) -> None:
    """Weight sync copies into `...k_proj.weight` and `...up_proj.weight`: the stacked matrices must see it."""
    model = load_model(family_folders["qwen2_bias_tied"])
    fuse_projections(model.model)
    parameters = dict(model.named_parameters())
    attention, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    q_rows = attention.q_proj.weight.shape[0]
    new_key = torch.randn_like(parameters["model.layers.0.self_attn.k_proj.weight"])
    new_up = torch.randn_like(parameters["model.layers.0.mlp.up_proj.weight"])
    with torch.no_grad():
        parameters["model.layers.0.self_attn.k_proj.weight"].copy_(new_key)
        parameters["model.layers.0.mlp.up_proj.weight"].copy_(new_up)
    assert torch.equal(attention.qkv_weight[q_rows:q_rows + new_key.shape[0]], new_key)
    assert torch.equal(mlp.gate_up_weight[mlp.gate_proj.weight.shape[0]:], new_up)

    unfused = load_model(family_folders["qwen2_bias_tied"])
    with torch.no_grad():
        unfused.model.layers[0].self_attn.k_proj.weight.copy_(new_key)
        unfused.model.layers[0].mlp.up_proj.weight.copy_(new_up)
        input_ids, positions, _ = right_padded_batch([6], model.config.vocab_size, seed=2)
        assert (model(input_ids, positions) - unfused(input_ids, positions)).abs().max().item() <= 1e-5


def _unique_graphs() -> int:
    return counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("case", ["qwen2_bias_tied", "qwen3_qk_norm"])
def test_compiled_layers_match_eager_forward_and_backward(family_folders: dict[str, Path], case: str) -> None:
    eager, compiled = load_model(family_folders[case]), load_model(family_folders[case])
    compile_decoder_layers(compiled, backend="aot_eager")
    input_ids, positions, mask = right_padded_batch([9, 6, 3], eager.config.vocab_size, seed=3)
    losses = []
    for model in (eager, compiled):
        hidden = model(input_ids, positions)  # (B, T, H)
        loss = (model.compute_logits(hidden).log_softmax(-1).amax(-1) * mask).sum()
        loss.backward()
        losses.append(loss.detach())
    assert torch.allclose(losses[0], losses[1], rtol=1e-6, atol=1e-6)
    for (name, parameter), (_, other) in zip(eager.named_parameters(), compiled.named_parameters()):
        assert other.grad is not None, name
        assert (parameter.grad - other.grad).abs().max().item() <= 1e-5, name


def test_compiled_layers_share_one_graph_whatever_the_depth(family_folders: dict[str, Path]) -> None:
    """Every layer reuses the same compiled code: graphs do not grow with the number of layers, so compile
    time and the recompile limit do not either."""
    model = load_model(family_folders["qwen2_bias_tied"])
    assert len(model.model.layers) >= 2
    compile_decoder_layers(model, backend="aot_eager")
    counters.clear()
    with torch.no_grad():
        for lengths in ([5, 4], [8, 2], [11, 3, 2]):
            input_ids, positions, _ = right_padded_batch(lengths, model.config.vocab_size)
            model(input_ids, positions)
    # one whole-layer graph (dense batches) for all layers and all three shapes, plus the embedding + cos/sin
    assert _unique_graphs() == 2
    attention = PackedCausalAttention.from_lengths([4, 7])
    with torch.no_grad():
        model(torch.randint(0, model.config.vocab_size, (11,)), attention.positions(), attention)
    # plus the halves around an attention backend, the first half twice (the first layer has no pending MLP
    # output to add, every other layer has one), the embedding of flattened (N,) tokens and the final norm
    assert _unique_graphs() == 7


def test_compiled_layers_leave_a_packed_attention_backend_eager(family_folders: dict[str, Path]) -> None:
    """The attention backend (the engine's paged KV cache) runs between the compiled halves, outside them."""
    eager, compiled = load_model(family_folders["llama_output_bias"]), load_model(family_folders["llama_output_bias"])
    fuse_projections(compiled.model)
    compile_decoder_layers(compiled, backend="aot_eager")
    attention = PackedCausalAttention.from_lengths([4, 7])
    input_ids = torch.randint(0, eager.config.vocab_size, (11,), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = eager(input_ids, attention.positions(), attention)
        actual = compiled(input_ids, attention.positions(), attention)
    assert (expected - actual).abs().max().item() <= 1e-5


def test_int32_positions_give_the_same_hidden_states(family_folders: dict[str, Path]) -> None:
    """The engine's decode graphs hand the staging buffer's int32 positions to the compiled `embed`: the
    rotary angles, and so the output, must be those of int64 positions exactly."""
    eager, compiled = load_model(family_folders["qwen3_qk_norm"]), load_model(family_folders["qwen3_qk_norm"])
    compile_decoder_layers(compiled, backend="aot_eager")
    attention = PackedCausalAttention.from_lengths([3, 9])
    positions = attention.positions() + 1000  # far enough that a wrong angle would show
    input_ids = torch.randint(0, eager.config.vocab_size, (12,), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = eager(input_ids, positions, attention)
        assert torch.equal(eager(input_ids, positions.int(), attention), expected)
        assert torch.equal(compiled(input_ids, positions.int(), attention), compiled(input_ids, positions, attention))


def test_compiled_first_half_hands_attention_its_inputs_from_the_compiled_graph(family_folders: dict[str, Path]) -> None:
    """query, key and value leave the compiled half as its own outputs, so their gradients flow back through the
    compiled backward: no output is an eager view re-created after the call (AOTAutograd does that when two
    outputs view one intermediate, and the views' backward then runs as extra eager kernels)."""
    for case in ("qwen2_bias_tied", "qwen3_qk_norm"):
        model = load_model(family_folders[case])
        compile_decoder_layers(model, backend="aot_eager")
        attention = PackedCausalAttention.from_lengths([4, 7])
        hidden = torch.randn(11, model.config.hidden_size, requires_grad=True)
        cos, sin = model.model.rotary_emb(attention.positions(), hidden.dtype)
        _, *inputs = model.model.layers[0].attention_inputs(hidden, None, cos, sin)
        assert [type(tensor.grad_fn).__name__ for tensor in inputs] == ["CompiledFunctionBackward"] * 3, case


def test_without_autograd_the_key_is_a_view_of_the_rotary_output_not_a_copy(family_folders: dict[str, Path]) -> None:
    """The copy out of the joint rotary output exists for autograd (above); an engine's decode layers run without
    it, and there the copy would be a kernel of its own per layer. Same values either way, eager and compiled."""
    model = load_model(family_folders["qwen2_bias_tied"])
    compiled = load_model(family_folders["qwen2_bias_tied"])
    compile_decoder_layers(compiled, backend="aot_eager")
    attention = PackedCausalAttention.from_lengths([4, 7])
    hidden = torch.randn(11, model.config.hidden_size)
    cos, sin = model.model.rotary_emb(attention.positions(), hidden.dtype)
    keys = {}
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            for name, each in (("eager", model), ("compiled", compiled)):
                _, query, key, _ = each.model.layers[0].attention_inputs(hidden, None, cos, sin)
                keys[name, grad] = key
                # Query and key are adjacent heads of one rotated tensor: without autograd they share its storage.
                assert key.is_contiguous() == grad
                assert (key.untyped_storage().data_ptr() == query.untyped_storage().data_ptr()) != grad
    assert all(torch.equal(keys["eager", False], key) for key in keys.values())
