"""The optimizer step behind a finiteness check (`asyncrl/train/nonfinite.py`), for a fused optimizer (the skip
decided on the device) and a per-parameter one (decided on the host)."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.train.nonfinite import NonFiniteGuard, NonFiniteTrainingError


def model_and_optimizer(fused: bool):
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, **({"fused": True} if fused else {"foreach": False}))
    return model, optimizer


def state(model, optimizer):
    """Parameters, moments and step counts, copied."""
    tensors = [p.detach().clone() for p in model.parameters()]
    for values in optimizer.state.values():
        tensors += [value.detach().clone() for value in values.values()]
    return tensors


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "per-parameter"])
def test_a_non_finite_norm_skips_the_step_and_too_many_in_a_row_stop_the_run(fused):
    model, optimizer = model_and_optimizer(fused)
    guard = NonFiniteGuard("actor", max_consecutive=2)
    model(torch.randn(4, 5)).sum().backward()
    assert guard.step(optimizer, torch.tensor(1.5)) == 1.5  # a finite norm steps
    stepped = state(model, optimizer)
    assert optimizer.state[model.weight]["step"].item() == 1
    norm = guard.step(optimizer, torch.tensor(float("nan")))
    assert math.isnan(norm) and guard.num_skipped == 1
    assert all(torch.equal(a, b) for a, b in zip(stepped, state(model, optimizer)))  # nothing moved
    assert "found_inf" not in vars(optimizer)  # the flag does not outlive the step
    assert guard.step(optimizer, torch.tensor(2.0)) == 2.0 and guard.consecutive == 0
    assert optimizer.state[model.weight]["step"].item() == 2
    assert not torch.equal(stepped[0], model.weight)
    guard.step(optimizer, torch.tensor(float("inf")))
    with pytest.raises(NonFiniteTrainingError, match="actor: 2 optimizer steps in a row"):
        guard.step(optimizer, torch.tensor(float("inf")))
    assert guard.num_skipped == 3


def test_the_fused_optimizer_steps_as_if_the_skipped_steps_never_happened():
    """Skipped steps leave no trace (not even in Adam's bias correction): two steps with skips between them equal
    two steps without."""
    results = []
    for skips in (0, 2):
        model, optimizer = model_and_optimizer(fused=True)
        guard = NonFiniteGuard("actor", max_consecutive=5)
        for step in range(2):
            model.zero_grad()
            model(torch.full((4, 5), float(step + 1))).sum().backward()
            for _ in range(skips if step == 1 else 0):
                guard.step(optimizer, torch.tensor(float("nan")))
            guard.step(optimizer, torch.tensor(1.0))
        results.append(state(model, optimizer))
    assert all(torch.equal(a, b) for a, b in zip(*results))
