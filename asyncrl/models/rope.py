"""Rotary position embeddings (RoPE), with optional Llama-3 frequency scaling.

The arithmetic follows `transformers` step by step (inverse frequencies in fp32, angles = position * inv_freq
in fp32, cos/sin cast to the activation dtype before rotating) so that our logits equal theirs bit for bit
in fp32 and round the same way in bf16.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from asyncrl.models.model_config import TransformerConfig


def compute_inv_freq(config: TransformerConfig, device: torch.device | str | None = None) -> Tensor:
    """Inverse frequencies (head_dim / 2,) in fp32: theta^(-2i/d), then Llama-3 scaling if configured."""
    dim = config.head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device=device).to(torch.float32) / dim
    inv_freq = 1.0 / (config.rope_theta ** exponents)
    if config.rope_scaling is None:
        return inv_freq
    return _scale_llama3(inv_freq, config.rope_scaling)


def _scale_llama3(inv_freq: Tensor, scaling: dict) -> Tensor:
    """Llama 3.1 scaling: long wavelengths divided by `factor`, short kept, the band between interpolated."""
    factor = scaling["factor"]
    low_freq_factor = scaling["low_freq_factor"]
    high_freq_factor = scaling["high_freq_factor"]
    old_context_length = scaling["original_max_position_embeddings"]
    low_freq_wavelength = old_context_length / low_freq_factor
    high_freq_wavelength = old_context_length / high_freq_factor
    wavelength = 2 * math.pi / inv_freq
    scaled = torch.where(wavelength > low_freq_wavelength, inv_freq / factor, inv_freq)
    smooth = (old_context_length / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelength < high_freq_wavelength) * ~(wavelength > low_freq_wavelength)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """Maps positions (any shape) to (cos, sin) of shape (*positions.shape, head_dim)."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        # Not persistent: it is derived from the config, and HF files do not carry it.
        self.register_buffer("inv_freq", compute_inv_freq(config), persistent=False)

    def _apply(self, fn, recurse=True):
        """Every `.to()`, `.cuda()` and `to_empty()` goes through here: recompute the frequencies in fp32
        afterwards, because `.to(torch.bfloat16)` would round them (shifting every position) and `to_empty`
        would leave them uninitialised."""
        module = super()._apply(fn, recurse)
        if self.inv_freq.device.type != "meta":
            self.inv_freq = compute_inv_freq(self.config, device=self.inv_freq.device)
        return module

    def forward(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        angles = positions[..., None].float() * self.inv_freq.float()  # (..., D/2)
        angles = torch.cat((angles, angles), dim=-1)  # (..., D)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) over the last dimension."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotates x (..., H, D) by cos/sin (..., D), broadcast over the head dimension."""
    cos = cos.unsqueeze(-2)
    sin = sin.unsqueeze(-2)
    return (x * cos) + (rotate_half(x) * sin)
