"""A linear layer whose weight gradient is added into a given float32 tensor (`asyncrl/models/linear_into.py`),
alone and as the MLPs of a model whose layers are compiled (`aot_eager`: the graphs CUDA's inductor compiles)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from asyncrl.models import PackedCausalAttention, compile_decoder_layers, load_model
from asyncrl.models.layers import MLPGradients
from asyncrl.models.linear_into import linear_into
from asyncrl.train.fast.compute_weights import carve


@pytest.mark.parametrize("backend", [None, "aot_eager", pytest.param("inductor", marks=pytest.mark.skipif(
    shutil.which("g++") is None and not torch.cuda.is_available(), reason="Inductor needs CUDA or a C++ compiler"))])
def test_backward_adds_the_weight_gradient_into_the_target_and_returns_none(backend):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 4, generator=generator, requires_grad=True)
    weight = torch.randn(3, 4, generator=generator, requires_grad=True)
    upstream = torch.randn(2, 5, 3, generator=generator)
    expected_x, expected_weight = torch.autograd.grad((F.linear(x, weight) * upstream).sum(), (x, weight))
    into = torch.full((3, 4), 0.25)

    def loss(x, weight, into):
        return (linear_into(x, weight, into) * upstream).sum() + (weight * 2.0).sum()  # plus a tied use

    run = loss if backend is None else torch.compile(loss, backend=backend, fullgraph=True, dynamic=True)
    for calls in (1, 2):  # a second call adds again, on top
        grad_x, grad_weight = torch.autograd.grad(run(x, weight, into), (x, weight))
        torch.testing.assert_close(grad_x, expected_x, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(grad_weight, torch.full((3, 4), 2.0))  # the tied use's gradient only
        torch.testing.assert_close(into, calls * expected_weight + 0.25, atol=1e-6, rtol=1e-6)


def test_compiled_mlps_add_their_weight_gradients_where_asked(family_folders: dict[str, Path]):
    """A compiled model over packed rows, its MLPs given gradient targets: the targets receive exactly the
    weight gradients an eager model returns, and every other gradient is unchanged."""
    eager, compiled = load_model(family_folders["qwen2_bias_tied"]), load_model(family_folders["qwen2_bias_tied"])
    compile_decoder_layers(compiled, backend="aot_eager")
    attention = PackedCausalAttention.from_lengths([4, 7])
    input_ids = torch.randint(0, eager.config.vocab_size, (11,), generator=torch.Generator().manual_seed(4))
    upstream = torch.randn(11, eager.config.hidden_size, generator=torch.Generator().manual_seed(5))
    (eager(input_ids, attention.positions(), attention) * upstream).sum().backward()
    # The targets are parts of one buffer, as the trainer's fp32 gradients are (`carve`): each layer's backward
    # adds into its own part while the others' saved parts must stay valid.
    linears = [(layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj) for layer in compiled.model.layers]
    _, parts = carve([linear.weight.shape for trio in linears for linear in trio], torch.float32, torch.device("cpu"))
    targets = [MLPGradients(*parts[3 * index:3 * index + 3]) for index in range(len(linears))]
    (compiled(input_ids, attention.positions(), attention, mlp_grads_into=targets) * upstream).sum().backward()
    eager_grads = {name: p.grad for name, p in eager.named_parameters()}
    for name, parameter in compiled.named_parameters():
        if ".mlp." in name:
            assert parameter.grad is None, name
        else:
            torch.testing.assert_close(parameter.grad, eager_grads[name], atol=1e-5, rtol=1e-5, msg=name)
    for layer, target in zip(eager.model.layers, targets):
        for linear, into in zip((layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj), target):
            torch.testing.assert_close(into, linear.weight.grad, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="one entry per layer"):
        compiled(input_ids, attention.positions(), attention, mlp_grads_into=targets[:1])
