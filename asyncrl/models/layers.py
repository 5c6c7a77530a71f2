"""Building blocks without attention: RMSNorm and the SwiGLU MLP."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from asyncrl.models.linear_into import linear_into
from asyncrl.models.lora import add_fused_adapters


class RMSNorm(nn.Module):
    """y = weight * x / sqrt(mean(x^2) + eps), the statistics in fp32 like `transformers`.

    The normalised activations are cast back to the input dtype before the weight multiply, exactly as HF
    does, so bf16 runs round at the same place.
    """

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        input_dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.eps)
        return self.weight * x.to(input_dtype)


class MLPGradients(NamedTuple):
    """Where `SwiGLU`'s backward adds its weights' gradients (float32, each its weight's shape)."""
    gate: Tensor
    up: Tensor
    down: Tensor


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)); parameter names match HF's `mlp.{gate,up,down}_proj`."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        # Set by `fuse_projections` (inference only): (2 x intermediate, hidden), gate rows then up rows; the
        # gate/up Parameters are views into it.
        self.gate_up_weight: Tensor | None = None

    def forward(self, x: Tensor, grads_into: MLPGradients | None = None) -> Tensor:
        """`grads_into`: float32 tensors that backward adds the three weights' gradients into (`linear_into`)
        instead of returning them (the trainer's graphed step, into the fp32 masters)."""
        if grads_into is not None:
            return linear_into(F.silu(linear_into(x, self.gate_proj.weight, grads_into.gate))
                               * linear_into(x, self.up_proj.weight, grads_into.up),
                               self.down_proj.weight, grads_into.down)
        if self.gate_up_weight is None:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        gate_up = add_fused_adapters(F.linear(x, self.gate_up_weight), x, (self.gate_proj, self.up_proj))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)
