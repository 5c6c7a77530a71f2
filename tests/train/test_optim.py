"""The learning-rate schedule: linear warmup, then constant or cosine to a floor, over the run's length or
over `optim.total_training_steps` when that is set."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.config import load_config
from asyncrl.train.optim import build_scheduler


def lrs(total_steps: int, *overrides: str, updates: int = 6) -> list[float]:
    optim = load_config(None, ["actor.optim.lr=1.0", *overrides]).actor.optim
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=optim.lr)
    scheduler = build_scheduler(optimizer, optim, total_steps)
    seen = [optimizer.param_groups[0]["lr"]]
    for _ in range(updates):
        optimizer.step()
        scheduler.step()
        seen.append(optimizer.param_groups[0]["lr"])
    return seen


def test_warmup_then_cosine_reaches_the_floor_at_the_last_step():
    seen = lrs(5, "actor.optim.lr_warmup_steps=1", "actor.optim.lr_scheduler_type=cosine", "actor.optim.min_lr_ratio=0.2")
    # update 0 warms up (1/2); then cosine over the 4 updates after warmup, the floor from update 5 on
    cosine = [0.2 + 0.8 * 0.5 * (1 + math.cos(math.pi * k / 4)) for k in range(5)]
    assert seen == pytest.approx([0.5, *cosine, 0.2])


def test_total_training_steps_replaces_the_runs_length():
    schedule = ("actor.optim.lr_scheduler_type=cosine", "actor.optim.lr_warmup_steps=0")
    spanning_ten = lrs(5, *schedule, "actor.optim.total_training_steps=10")
    assert spanning_ten == pytest.approx([0.5 * (1 + math.cos(math.pi * k / 10)) for k in range(7)])
    assert lrs(5, *schedule)[5] == pytest.approx(0.0)    # without it, the floor at the run's own end
