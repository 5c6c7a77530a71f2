"""What a LoRA policy leaves the trainer as, and the sizes a run reports.

    tensors = export_lora_policy(full_tensors, spec, base_path, folder / "adapter")   # PEFT folder written
    save(merge(...))                                                                   # the caller's HF folder
    metrics |= size_metrics(model, optimizer, reference, sync_names, sync_dtype)

The exported policy is two things: the adapter in PEFT's format (`peft.PeftModel.from_pretrained(base,
folder/adapter)`, a few megabytes), and the merged weights (W + scale B A) as a plain HF folder for anyone
who loads folders (transformers, an inference server, `rollout.backend=external`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
from torch import Tensor, nn

from asyncrl.models.lora import LoRASpec, merge_adapters
from asyncrl.models.peft_io import save_peft_adapter
from asyncrl.train.parallel import local_shard


def export_lora_policy(tensors: dict[str, Tensor], spec: LoRASpec, base_model_path: str,
                       adapter_folder: Path) -> dict[str, Tensor]:
    """Writes the PEFT adapter folder and returns the merged HF state dict (no adapter names left)."""
    save_peft_adapter(adapter_folder, tensors, spec, base_model_path)
    return merge_adapters(tensors, spec)


def size_metrics(model: nn.Module, optimizer: torch.optim.Optimizer, reference: Optional[nn.Module],
                 sync_names: list[str], sync_dtype: torch.dtype) -> dict[str, float]:
    """Trainable parameters (whole-model counts), the bytes one weight sync moves in the engine's dtype, and
    this rank's trainer state: parameter shards, a gradient per trainable one, the optimizer's state and the
    reference model's shards (none with LoRA: the actor with its adapters off is the reference)."""
    parameters = dict(model.named_parameters())
    trainable = [parameter for parameter in parameters.values() if parameter.requires_grad]
    itemsize = torch.empty((), dtype=sync_dtype).element_size()
    state_bytes = sum(tensor_bytes(parameter) for parameter in parameters.values())
    state_bytes += sum(tensor_bytes(parameter) for parameter in trainable)  # gradients, in the masters' dtype
    state_bytes += sum(tensor_bytes(value) for state in optimizer.state.values() for value in state.values()
                       if isinstance(value, Tensor))
    if reference is not None:
        state_bytes += sum(tensor_bytes(parameter) for parameter in reference.parameters())
    metrics = {"actor/trainable_params": float(sum(parameter.numel() for parameter in trainable)),
               "weight_sync/bytes": float(sum(parameters[name].numel() for name in sync_names) * itemsize),
               "trainer/state_bytes": float(state_bytes)}
    if len(trainable) < len(parameters):
        metrics["lora/trainable_params"] = metrics["actor/trainable_params"]
    return metrics


def tensor_bytes(tensor: Tensor) -> int:
    """Bytes this rank holds of a (possibly sharded) tensor."""
    local = local_shard(tensor)
    return local.numel() * local.element_size()
