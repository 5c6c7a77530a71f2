"""Adapters in PEFT's folder format: `adapter_config.json` + `adapter_model.safetensors`.

    save_peft_adapter(folder, adapter_tensors, spec, base_model_path)   # peft.PeftModel.from_pretrained reads it
    spec, tensors = load_peft_adapter(folder)                           # back to our names and LoRASpec

PEFT saves a causal LM's adapter tensors as `base_model.model.<HF name>` with the adapter name dropped
(`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`); our names are the HF part already.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from asyncrl.models.lora import LoRASpec, is_adapter_name

PEFT_PREFIX = "base_model.model."
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"


def peft_adapter_config(spec: LoRASpec, base_model_path: str) -> dict:
    """The adapter_config.json PEFT writes for a LoRA on a causal LM (the keys its loader needs)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_path,
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "lora_dropout": spec.dropout,
        "target_modules": list(spec.targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True if spec.init == "kaiming" else "gaussian",
        "modules_to_save": None,
        "inference_mode": True,
    }


def save_peft_adapter(folder: str | Path, named_tensors: dict[str, Tensor], spec: LoRASpec,
                      base_model_path: str) -> Path:
    """Writes the adapter tensors of `named_tensors` (other names are skipped) as a PEFT adapter folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {PEFT_PREFIX + name: tensor.detach().to("cpu").contiguous()
               for name, tensor in named_tensors.items() if is_adapter_name(name)}
    if not tensors:
        raise ValueError(f"save_peft_adapter({folder}): no adapter tensors (names with .lora_A./.lora_B.) given")
    save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    (folder / CONFIG_FILE).write_text(json.dumps(peft_adapter_config(spec, base_model_path), indent=2) + "\n")
    return folder


def load_peft_adapter(folder: str | Path) -> tuple[LoRASpec, dict[str, Tensor]]:
    """A PEFT LoRA folder's spec and tensors, named as our model names them (the prefix removed)."""
    folder = Path(folder)
    config_path = folder / CONFIG_FILE
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path}: no {CONFIG_FILE}; not a PEFT adapter folder")
    config = json.loads(config_path.read_text())
    if config.get("peft_type") != "LORA":
        raise ValueError(f"{config_path}: peft_type {config.get('peft_type')!r}, only LORA adapters load")
    spec = LoRASpec(rank=int(config["r"]), alpha=float(config["lora_alpha"]),
                    target_modules=tuple(config["target_modules"]), dropout=float(config["lora_dropout"]),
                    init="kaiming" if config.get("init_lora_weights", True) is True else "gaussian")
    tensors = {}
    for name, tensor in load_file(str(folder / WEIGHTS_FILE)).items():
        if not name.startswith(PEFT_PREFIX):
            raise ValueError(f"{folder / WEIGHTS_FILE}: tensor {name} lacks PEFT's {PEFT_PREFIX!r} prefix")
        tensors[name[len(PEFT_PREFIX):]] = tensor.to(torch.float32) if tensor.is_floating_point() else tensor
    return spec, tensors
