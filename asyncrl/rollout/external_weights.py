"""Weights for external rollout servers: the policy written as an HF folder that a server reloads, and a checksum
that tells whether a server holds exactly those weights.

    folder = write_policy(trainers, weights_dir, version=3)    # weights_dir/v3, the previous version's removed
    weights_checksum(model.named_parameters(), torch.bfloat16) == server_reply["sha256"]

The checksum is sha256 over the parameters in name order: each name, then its values cast to the server's dtype
and widened to float32. A trainer's fp32 folder and a server's bf16 engine agree exactly when the server loaded
that folder, since both sides round the same fp32 values to bf16 the same way.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import Tensor

from asyncrl.models import iter_named_tensors, load_model
from asyncrl.rollout.registry import TrainerRanks

VERSION_PREFIX = "v"


def weights_checksum(named_tensors: Iterable[tuple[str, Tensor]], dtype: torch.dtype) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(named_tensors, key=lambda pair: pair[0]):
        digest.update(name.encode("utf-8"))
        values = tensor.detach().to("cpu").to(dtype).to(torch.float32).contiguous()
        digest.update(values.numpy().tobytes())
    return digest.hexdigest()


def folder_checksum(folder: str | Path, dtype: torch.dtype) -> str:
    """The checksum a server that loaded `folder` in `dtype` reports."""
    model = load_model(folder, dtype=torch.float32, device="cpu")
    return weights_checksum(iter_named_tensors(model), dtype)


def write_policy(trainers: TrainerRanks, weights_dir: str | Path, version: int) -> Path:
    """The trainer's policy as an HF folder `weights_dir/v<version>` (written whole before any server reads
    it); older versions' folders are removed, so the disk holds at most two policies during a sync."""
    root = Path(weights_dir)
    folder = root / f"{VERSION_PREFIX}{version}"
    if folder.exists():
        shutil.rmtree(folder)
    trainers.export_policy(str(folder))
    for old in root.glob(f"{VERSION_PREFIX}*"):
        if old != folder and old.is_dir() and old.name[len(VERSION_PREFIX):].isdigit():
            shutil.rmtree(old, ignore_errors=True)
    return folder
