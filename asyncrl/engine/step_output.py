"""The sampled tokens of a launched step, on the device and on their way to the host."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor


@dataclass
class StepOutput:
    """The sampled tokens of a launched step: on the device (the next decode's input ids) and on their way to
    the host."""

    token_ids: Tensor  # (S,) int64 on the device
    packed: Tensor  # (S, 2) int32 on the host: ids and log-prob bit patterns (pinned on CUDA)
    copied: torch.cuda.Event | None  # fires once `packed` holds the values; None on CPU (already there)
    routed_experts: Tensor | None = None  # (N, L, k) uint8/int16 on the host: MoE experts of each computed token

    def routing(self) -> np.ndarray | None:
        """The experts of the step's computed tokens (after `wait`), or None for a dense model."""
        return None if self.routed_experts is None else self.routed_experts.numpy()

    def wait(self) -> tuple[list[int], list[float]]:
        """Blocks until the copy of this step (and so everything queued before it) is done."""
        if self.copied is not None:
            self.copied.synchronize()
        packed = self.packed.numpy()
        return packed[:, 0].tolist(), packed[:, 1].view(np.float32).tolist()


def recorded_event(tensor: Tensor) -> torch.cuda.Event | None:
    """An event recorded now on the current stream when `tensor` is on CUDA (it fires once the work queued so
    far, e.g. a copy from or to pinned memory, is done); None on CPU, where that work is already done."""
    if not tensor.is_cuda:
        return None
    event = torch.cuda.Event()
    event.record()
    return event


def start_download(token_ids: Tensor, log_probs: Tensor, routed_experts: Tensor | None = None) -> StepOutput:
    """The step's device-to-host copy: ids and log-prob bit patterns packed into one int32 tensor (and, for an MoE
    model, the experts of its tokens), copied without blocking into pinned memory, so the host can launch the next
    step before this one ends."""
    packed = torch.stack([token_ids.to(torch.int32), log_probs.to(torch.float32).view(torch.int32)], dim=1)
    if not packed.is_cuda:
        return StepOutput(token_ids, packed, None, routed_experts)
    host = torch.empty(packed.shape, dtype=torch.int32, pin_memory=True)
    host.copy_(packed, non_blocking=True)
    routed_host = None
    if routed_experts is not None:
        routed_host = torch.empty(routed_experts.shape, dtype=routed_experts.dtype, pin_memory=True)
        routed_host.copy_(routed_experts, non_blocking=True)
    return StepOutput(token_ids, host, recorded_event(packed), routed_host)
