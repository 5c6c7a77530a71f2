"""`FlatAdamW` (`asyncrl/train/fast/flat_adamw.py`): the graphed trainer's AdamW over flat masters, gradients and
moments.

Its Triton step runs on a GPU, or on CPU tensors under Triton's interpreter, which `tests/conftest.py` turns on
where no GPU is present:

    python -m pytest tests/train/fast/test_flat_adamw.py -q
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

from asyncrl.config.schema import OptimConfig
from asyncrl.models import CausalLM, init_weights, tiny_config
from asyncrl.train.fast.compute_weights import ComputeWeights
from asyncrl.train.fast.flat_adamw import FlatAdamW

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"),
                                  reason="runs Triton kernels on a GPU or under TRITON_INTERPRET=1")
CONFIG = OptimConfig(lr=1e-2, betas=[0.9, 0.95], eps=1e-8, weight_decay=0.1)


def tiny_model(device: str) -> CausalLM:
    model = CausalLM(tiny_config("qwen2", hidden_size=32, num_layers=2, vocab_size=96))
    init_weights(model, seed=3)
    return model.to(device)


def set_gradients(flat: ComputeWeights, reference: CausalLM, seed: int, scale: float) -> None:
    """The same random gradient on the flat masters and, divided by `scale`, on the reference's parameters."""
    generator = torch.Generator().manual_seed(seed)
    for master, parameter in zip(flat.trainable_masters, reference.parameters()):
        gradient = torch.randn(master.shape, generator=generator).to(master.device)
        master.grad.copy_(gradient)
        parameter.grad = gradient / scale


def assert_same_state(optimizer: FlatAdamW, reference: torch.optim.AdamW, model: CausalLM,
                      reference_model: CausalLM, atol: float) -> None:
    for (name, master), parameter in zip(model.named_parameters(), reference_model.parameters()):
        torch.testing.assert_close(master, parameter, atol=atol, rtol=0, msg=name)
        mine, theirs = optimizer.state[master], reference.state[parameter]
        assert float(mine["step"]) == float(theirs["step"]), name
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(mine[key], theirs[key], atol=atol, rtol=1e-5, msg=f"{name} {key}")


@needs_triton
def test_the_flat_step_is_torch_adamw_with_its_skip_flag_and_gradient_divisor():
    """Gradients divided by 2 on the device; a step flagged non-finite, which changes nothing (nor the step
    counts); plain steps, one of them torch's. Parameters and moments equal torch's per-parameter AdamW, and the
    moments are parts of the optimizer's flat buffers."""
    model, reference_model = tiny_model(DEVICE), tiny_model(DEVICE)
    weights = ComputeWeights(model, None)
    optimizer = FlatAdamW(weights, CONFIG)
    optimizer.fused_kernel = True  # the Triton step, on CPU tensors too (interpreter)
    reference = torch.optim.AdamW(reference_model.parameters(), lr=CONFIG.lr, betas=tuple(CONFIG.betas),
                                  eps=CONFIG.eps, weight_decay=CONFIG.weight_decay, foreach=False)
    two, one, zero = (torch.tensor(value, device=DEVICE) for value in (2.0, 1.0, 0.0))

    set_gradients(weights, reference_model, seed=0, scale=2.0)
    optimizer.found_inf, optimizer.grad_scale = zero, two  # as `NonFiniteGuard` sets them for a step
    optimizer.step()
    reference.step()
    assert_same_state(optimizer, reference, model, reference_model, atol=1e-6)
    before = [master.detach().clone() for master in model.parameters()]
    moments = optimizer.flat_exp_avg.clone()

    set_gradients(weights, reference_model, seed=1, scale=1.0)
    weights.trainable_masters[0].grad[0] = float("nan")
    optimizer.found_inf, optimizer.grad_scale = one, None
    optimizer.step()
    assert all(torch.equal(master, saved) for master, saved in zip(model.parameters(), before))
    assert torch.equal(optimizer.flat_exp_avg, moments)
    assert all(float(state["step"]) == 1.0 for state in optimizer.state.values())

    set_gradients(weights, reference_model, seed=2, scale=1.0)
    del optimizer.found_inf  # back to the class's None
    optimizer.step()
    reference.step()
    assert_same_state(optimizer, reference, model, reference_model, atol=1e-6)

    # A step of torch's own in between (as torch's state-dict helpers take) updates the flat parts in place;
    # the next flat step carries on from them.
    for seed, kernel in ((3, False), (4, True)):
        set_gradients(weights, reference_model, seed=seed, scale=1.0)
        optimizer.fused_kernel = kernel
        optimizer.step()
        reference.step()
    assert_same_state(optimizer, reference, model, reference_model, atol=1e-6)
    for master in model.parameters():
        for key, flat in (("exp_avg", optimizer.flat_exp_avg), ("exp_avg_sq", optimizer.flat_exp_avg_sq)):
            assert optimizer.state[master][key].untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()


@needs_triton
def test_a_loaded_state_dict_continues_exactly_and_in_flat_memory():
    """The state dict is torch's AdamW's: loaded into a fresh FlatAdamW (over the same weights), the next step
    equals the original optimizer's next step bit for bit, from moments copied back into the flat buffers."""
    models = [tiny_model(DEVICE) for _ in range(2)]
    weights = [ComputeWeights(model, None) for model in models]
    optimizers = [FlatAdamW(flat, CONFIG) for flat in weights]
    for optimizer in optimizers:
        optimizer.fused_kernel = True
    scratch = tiny_model(DEVICE)
    for seed in range(2):
        set_gradients(weights[0], scratch, seed=seed, scale=1.0)
        optimizers[0].step()
    state = copy.deepcopy(optimizers[0].state_dict())
    assert set(state["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}  # torch's entries
    with torch.no_grad():
        for source, target in zip(models[0].parameters(), models[1].parameters()):
            target.copy_(source)
    optimizers[1].load_state_dict(state)
    for flat, optimizer in zip(weights, optimizers):
        set_gradients(flat, scratch, seed=7, scale=1.0)
        optimizer.step()
    for first, second in zip(models[0].parameters(), models[1].parameters()):
        assert torch.equal(first, second)
    assert torch.equal(optimizers[0].flat_exp_avg_sq, optimizers[1].flat_exp_avg_sq)
    assert all(float(entry["step"]) == 3.0 for entry in optimizers[1].state.values())


def test_without_the_kernel_it_steps_as_torch_adamw_on_the_masters():
    """The CPU path (and torch's state-dict helpers' step): torch's AdamW on the masters, bit for bit."""
    model, reference_model = tiny_model("cpu"), tiny_model("cpu")
    weights = ComputeWeights(model, torch.bfloat16)
    optimizer = FlatAdamW(weights, CONFIG)
    assert not optimizer.fused_kernel
    reference = torch.optim.AdamW(reference_model.parameters(), lr=CONFIG.lr, betas=tuple(CONFIG.betas),
                                  eps=CONFIG.eps, weight_decay=CONFIG.weight_decay, foreach=False)
    for seed in range(3):
        set_gradients(weights, reference_model, seed=seed, scale=1.0)
        optimizer.step()
        reference.step()
    assert_same_state(optimizer, reference, model, reference_model, atol=0.0)
    weights.refresh()
    assert all(torch.equal(copy, master.detach().to(torch.bfloat16))
               for copy, master in zip(weights.copies, weights.masters))


@needs_triton
def test_a_trainer_checkpoint_resumes_the_flat_step_exactly(tmp_path):
    """Through the trainer's checkpoint (torch's distributed state-dict helpers, which step a fresh optimizer once
    with gradients of their own before loading): two steps, save, a third; a fresh model and optimizer loaded from
    the save and given the same third step end equal, bit for bit."""
    from asyncrl.train.checkpoint import load_trainer_state, save_trainer_state

    runs = []
    for _ in range(2):
        model = tiny_model(DEVICE)
        weights = ComputeWeights(model, torch.bfloat16)
        optimizer = FlatAdamW(weights, CONFIG)
        optimizer.fused_kernel = True
        runs.append((model, weights, optimizer))
    (model, weights, optimizer), (fresh_model, fresh_weights, fresh_optimizer) = runs
    scratch = tiny_model(DEVICE)
    for seed in range(2):
        set_gradients(weights, scratch, seed=seed, scale=1.0)
        optimizer.step()
    save_trainer_state(tmp_path, {"actor": (model, optimizer, None)}, extra={})
    with torch.no_grad():
        for parameter in fresh_model.parameters():
            parameter.add_(1.0)  # the load must overwrite it
    load_trainer_state(tmp_path, {"actor": (fresh_model, fresh_optimizer, None)})
    assert all(parameter.grad is grad for parameter, grad in zip(fresh_weights.trainable_masters,
                                                                 fresh_weights.flat_grad_parts))
    for flat, step in ((weights, optimizer), (fresh_weights, fresh_optimizer)):
        set_gradients(flat, scratch, seed=5, scale=1.0)
        step.step()
    for first, second in zip(model.parameters(), fresh_model.parameters()):
        assert torch.equal(first, second)
    assert torch.equal(optimizer.flat_exp_avg, fresh_optimizer.flat_exp_avg)
    assert all(float(entry["step"]) == 3.0 for entry in fresh_optimizer.state.values())
