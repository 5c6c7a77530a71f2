"""The policy as an engine holds it: the base HF folder, plus LoRA adapters when the run trains them.

    model = load_policy(folder, lora_spec(config), dtype, device)   # adapters fresh (B = 0) until a sync
"""

from __future__ import annotations

from pathlib import Path

import torch

from asyncrl.models.checkpoint_io import load_model
from asyncrl.models.lora import LoRASpec, add_adapters
from asyncrl.models.transformer import CausalLM


def load_policy(folder: str | Path, spec: LoRASpec | None, dtype: torch.dtype, device: torch.device) -> CausalLM:
    """A CausalLM from `folder`, with the adapters of `spec` (None: none) initialised as the trainer's are."""
    model = load_model(folder, dtype=dtype, device=device)
    if spec is not None:
        add_adapters(model, spec)
        model.requires_grad_(False)  # an engine never trains
    return model
