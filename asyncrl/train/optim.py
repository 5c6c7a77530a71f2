"""AdamW and its learning-rate schedule: linear warmup, then constant or cosine decay to a floor."""

from __future__ import annotations

import math

import torch
from torch import nn

from asyncrl.config.schema import OptimConfig


def build_optimizer(model: nn.Module, config: OptimConfig) -> torch.optim.AdamW:
    """On GPU one fused kernel updates every parameter (the per-parameter loop costs ~12 DTensor ops per
    tensor of host time, hundreds of ms per step for a 0.5B model); on CPU the per-parameter loop keeps the
    update numerically identical for sharded and whole parameters (the FSDP equivalence tests rely on it)."""
    on_gpu = any(parameter.is_cuda for parameter in model.parameters())
    # Frozen parameters (a LoRA policy's base weights) get neither a gradient nor optimizer state.
    trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
    return torch.optim.AdamW(trainable, lr=config.lr, betas=tuple(config.betas), eps=config.eps,
                             weight_decay=config.weight_decay, **({"fused": True} if on_gpu else {"foreach": False}))


def warmup_steps(config: OptimConfig, total_steps: int) -> int:
    if config.lr_warmup_steps >= 0:
        return config.lr_warmup_steps
    return int(config.lr_warmup_steps_ratio * total_steps)


def lr_factor(step: int, config: OptimConfig, total_steps: int) -> float:
    """Multiplier of the peak lr after `step` optimizer steps."""
    warmup = warmup_steps(config, total_steps)
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if config.lr_scheduler_type == "constant" or total_steps <= warmup:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return config.min_lr_ratio + (1.0 - config.min_lr_ratio) * cosine


def build_scheduler(optimizer: torch.optim.Optimizer, config: OptimConfig,
                    total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """`total_steps` is the run's length as the recipe will train it; `optim.total_training_steps` > 0
    replaces it (a schedule meant for a longer run, of which this one is a part)."""
    if config.total_training_steps > 0:
        total_steps = config.total_training_steps
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, config, total_steps))
