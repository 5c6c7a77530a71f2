"""Save and restore everything a trainer rank needs to continue exactly: sharded model and optimizer
states (torch.distributed.checkpoint), LR schedulers, RNG states, and counters.

    save_trainer_state(folder, {"actor": (model, optimizer, scheduler)}, extra={"num_skipped_steps": 0})
    extra = load_trainer_state(folder, {"actor": (model, optimizer, scheduler)})

Each rank writes its own shards; loading works with the same world size (resharding is DCP's job).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)

from asyncrl.train.parallel import rank

Component = tuple[nn.Module, Optional[torch.optim.Optimizer], Optional[torch.optim.lr_scheduler.LRScheduler]]


def sharded_state(components: dict[str, Component]) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for name, (model, optimizer, _) in components.items():
        state[f"{name}.model"] = get_model_state_dict(model)
        if optimizer is not None:
            with gradients_aside(model):
                state[f"{name}.optimizer"] = get_optimizer_state_dict(model, optimizer)
    return state


@contextmanager
def gradients_aside(model: nn.Module) -> Iterator[None]:
    """No parameter has a `.grad` inside the block; after it, each has the very tensor it had before.

    torch's state-dict helpers build an optimizer's empty state (a fresh process about to load a checkpoint)
    with a zero-lr step, but only when no parameter has a gradient (otherwise the state stays empty and the
    load restores nothing), and then drop every gradient. Gradients kept at fixed addresses (`ComputeWeights`,
    which a captured CUDA graph adds into) must survive both."""
    gradients = [(parameter, parameter.grad) for parameter in model.parameters()]
    for parameter, _ in gradients:
        parameter.grad = None
    try:
        yield
    finally:
        for parameter, gradient in gradients:
            parameter.grad = gradient


def save_trainer_state(folder: str | Path, components: dict[str, Component], extra: dict[str, Any]) -> None:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    dcp.save(sharded_state(components), checkpoint_id=str(folder / "shards"))
    local = {
        "schedulers": {name: scheduler.state_dict() for name, (_, _, scheduler) in components.items()
                       if scheduler is not None},
        "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
        "extra": extra,
    }
    torch.save(local, folder / f"rank_{rank()}.pt")


def load_trainer_state(folder: str | Path, components: dict[str, Component]) -> dict[str, Any]:
    folder = Path(folder)
    local_path = folder / f"rank_{rank()}.pt"
    if not local_path.is_file():
        raise FileNotFoundError(f"trainer checkpoint {folder} has no {local_path.name} (saved with another "
                                f"number of trainer ranks, or incomplete)")
    state = sharded_state(components)
    dcp.load(state, checkpoint_id=str(folder / "shards"))
    for name, (model, optimizer, _) in components.items():
        set_model_state_dict(model, state[f"{name}.model"])
        if optimizer is not None:
            with gradients_aside(model):
                set_optimizer_state_dict(model, optimizer, state[f"{name}.optimizer"])
    local = torch.load(local_path, weights_only=False)
    for name, (_, _, scheduler) in components.items():
        if scheduler is not None:
            scheduler.load_state_dict(local["schedulers"][name])
    torch.set_rng_state(local["rng"]["torch"])
    np.random.set_state(local["rng"]["numpy"])
    random.setstate(local["rng"]["python"])
    if local["rng"]["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(local["rng"]["cuda"])
    return local["extra"]
