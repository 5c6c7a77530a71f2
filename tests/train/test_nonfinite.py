"""The clipped optimizer step behind a finiteness check (`asyncrl/train/nonfinite.py`), for a fused optimizer (the
skip and the clipping done on the device, in the step's kernel) and a per-parameter one (decided on the host, the
gradients scaled first)."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.train.nonfinite import NonFiniteGuard, NonFiniteTrainingError

FUSED = [True, False]
IDS = ["fused", "per-parameter"]


def model_and_optimizer(fused: bool):
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, **({"fused": True} if fused else {"foreach": False}))
    return model, optimizer


def backward(model, value: float = 1.0) -> None:
    model.zero_grad()
    model(torch.full((4, 5), value)).sum().backward()


def poison(model) -> None:
    model.weight.grad[0, 0] = float("nan")


def state(model, optimizer):
    """Parameters, moments and step counts, copied."""
    tensors = [p.detach().clone() for p in model.parameters()]
    for values in optimizer.state.values():
        tensors += [value.detach().clone() for value in values.values()]
    return tensors


@pytest.mark.parametrize("fused", FUSED, ids=IDS)
def test_a_non_finite_norm_skips_the_step_and_too_many_in_a_row_stop_the_run(fused):
    model, optimizer = model_and_optimizer(fused)
    guard = NonFiniteGuard("actor", max_consecutive=2)
    backward(model)
    expected_norm = math.sqrt(sum(float(p.grad.square().sum()) for p in model.parameters()))
    assert guard.step(optimizer, model, max_norm=0.0) == pytest.approx(expected_norm, rel=1e-6)  # steps
    stepped = state(model, optimizer)
    assert optimizer.state[model.weight]["step"].item() == 1
    poison(model)
    assert math.isnan(guard.step(optimizer, model, max_norm=1.0)) and guard.num_skipped == 1
    assert all(torch.equal(a, b) for a, b in zip(stepped, state(model, optimizer)))  # nothing moved
    assert "found_inf" not in vars(optimizer) and "grad_scale" not in vars(optimizer)  # gone after the step
    backward(model)
    guard.step(optimizer, model, max_norm=1.0)
    assert guard.consecutive == 0 and optimizer.state[model.weight]["step"].item() == 2
    assert not torch.equal(stepped[0], model.weight)
    poison(model)
    guard.step(optimizer, model, max_norm=1.0)
    poison(model)
    with pytest.raises(NonFiniteTrainingError, match="actor: 2 optimizer steps in a row"):
        guard.step(optimizer, model, max_norm=1.0)
    assert guard.num_skipped == 3


@pytest.mark.parametrize("max_norm", [0.5, 0.0, 1e6], ids=["clipped", "no-clipping", "under-the-norm"])
def test_the_fused_step_clips_as_the_per_parameter_step_does(max_norm):
    """The fused kernel divides the gradients by 1 / the clip coefficient: the same parameters, up to rounding."""
    results, norms = [], []
    for fused in FUSED:
        model, optimizer = model_and_optimizer(fused)
        guard = NonFiniteGuard("actor", max_consecutive=3)
        for step in range(3):
            backward(model, float(step + 1))
            norms.append(guard.step(optimizer, model, max_norm))
        results.append(state(model, optimizer))
    assert norms[:3] == pytest.approx(norms[3:], rel=1e-6) and min(norms) > 0.5  # max_norm 0.5 is active
    for fused_tensor, reference in zip(*results):
        torch.testing.assert_close(fused_tensor, reference, atol=1e-6, rtol=1e-6)


def test_the_fused_optimizer_steps_as_if_the_skipped_steps_never_happened():
    """Skipped steps leave no trace (not even in Adam's bias correction): two steps with skips between them equal
    two steps without."""
    results = []
    for skips in (0, 2):
        model, optimizer = model_and_optimizer(fused=True)
        guard = NonFiniteGuard("actor", max_consecutive=5)
        for step in range(2):
            for _ in range(skips if step == 1 else 0):
                backward(model)
                poison(model)
                guard.step(optimizer, model, max_norm=1.0)
            backward(model, float(step + 1))
            guard.step(optimizer, model, max_norm=1.0)
        results.append(state(model, optimizer))
    assert all(torch.equal(a, b) for a, b in zip(*results))
