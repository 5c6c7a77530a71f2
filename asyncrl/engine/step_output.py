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


def start_download(token_ids: Tensor, log_probs: Tensor) -> StepOutput:
    """The step's only device-to-host copy: ids and log-prob bit patterns packed into one int32 tensor, copied
    without blocking into pinned memory, so the host can launch the next step before this one ends."""
    packed = torch.stack([token_ids.to(torch.int32), log_probs.to(torch.float32).view(torch.int32)], dim=1)
    if not packed.is_cuda:
        return StepOutput(token_ids, packed, None)
    host = torch.empty(packed.shape, dtype=torch.int32, pin_memory=True)
    host.copy_(packed, non_blocking=True)
    return StepOutput(token_ids, host, recorded_event(packed))
