"""The optimizer step behind a finiteness check: a NaN or inf gradient skips the step (counted), and too
many in a row stop the run (a diverged model does not recover by skipping).

    guard = NonFiniteGuard("actor", max_consecutive=3)
    guard.step(optimizer, grad_norm)    # steps, or skips and counts in guard.num_skipped
"""

from __future__ import annotations

import math

import torch


class NonFiniteTrainingError(RuntimeError):
    """Too many optimizer steps in a row had a non-finite gradient."""


class NonFiniteGuard:
    def __init__(self, component: str, max_consecutive: int):
        self.component = component
        self.max_consecutive = max_consecutive
        self.consecutive = 0
        self.num_skipped = 0          # over the whole run (checkpointed with the trainer)

    def step(self, optimizer: torch.optim.Optimizer, grad_norm: float) -> None:
        if math.isfinite(grad_norm):
            self.consecutive = 0
            optimizer.step()
            return
        self.consecutive += 1
        self.num_skipped += 1
        if self.consecutive >= self.max_consecutive:
            raise NonFiniteTrainingError(
                f"{self.component}: {self.consecutive} optimizer steps in a row had a non-finite gradient norm "
                f"({grad_norm}); stopping (trainer.max_consecutive_nonfinite={self.max_consecutive}). Lower the "
                f"learning rate or check the rewards and advantages for NaN/inf.")
