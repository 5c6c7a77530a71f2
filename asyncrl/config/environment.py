"""What a config asks of the machine that runs the driver, checked before Ray starts: a CUDA device for
`trainer.device=cuda`, and the checkpoint folder `trainer.resume` names.

    check_environment(config, has_ray_cluster=ray.is_initialized())   # raises ConfigError; call before start_ray

Kept apart from `load_config`, which decides from the input alone: `asyncrl config show` of a GPU config on a
laptop must still print it. The model, tokenizer and dataset files are checked by the launch pre-flight
(`asyncrl/launch/preflight.py`) and by the datasets, also before Ray.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from asyncrl.config.errors import ConfigError
from asyncrl.config.schema import AsyncRLConfig


def check_environment(config: AsyncRLConfig, has_ray_cluster: bool = False) -> None:
    """`has_ray_cluster`: this process is already connected to a Ray cluster (a notebook, a test session), whose
    nodes may have devices this one lacks, as a cluster joined through `ray.address` may."""
    check_device(config, has_ray_cluster)
    check_resume_folder(config)


def check_device(config: AsyncRLConfig, has_ray_cluster: bool) -> None:
    """trainer.device=cuda on a driver without a CUDA device fails here when the run starts its own local
    cluster (its workers see what the driver sees). On a cluster joined through ray.address the workers' nodes
    decide, and each worker checks its own device when it starts."""
    if config.trainer.device != "cuda" or config.ray.address or has_ray_cluster or torch.cuda.is_available():
        return
    raise ConfigError(f"trainer.device=cuda, but this machine has no CUDA device that torch can use "
                      f"({cuda_absence_reason()}); use trainer.device=cpu (or auto: cuda where available), or set "
                      f"ray.address to a cluster whose nodes have GPUs")


def cuda_absence_reason() -> str:
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is built without CUDA"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return f"CUDA_VISIBLE_DEVICES={visible!r} hides every device"
    return "torch.cuda.is_available() is False: no GPU, or its driver is not loaded"


def check_resume_folder(config: AsyncRLConfig) -> None:
    """A checkpoint folder given by path exists (trainer.resume=auto finds none without an error: the run starts
    from scratch). Without this, a typo surfaces after Ray and every worker started."""
    setting = config.trainer.resume
    if setting in ("auto", "disable"):
        return
    folder = Path(setting)
    if not folder.exists():
        raise ConfigError(f"trainer.resume: checkpoint folder {folder} does not exist; give an existing one "
                          f"(<trainer.output_dir>/checkpoints/step_N), auto to resume from the newest under "
                          f"trainer.output_dir, or disable")
    if not folder.is_dir():
        raise ConfigError(f"trainer.resume: {folder} is a file, not a checkpoint folder (<trainer.output_dir>/"
                          f"checkpoints/step_N)")
    steps = sorted((child.name for child in folder.glob("step_*") if child.is_dir()), key=step_number)
    if steps:
        raise ConfigError(f"trainer.resume: {folder} holds checkpoints ({', '.join(steps)}) rather than being one; "
                          f"give one of them, e.g. trainer.resume={folder / steps[-1]}")


def step_number(name: str) -> int:
    """'step_12' -> 12; a name without a number sorts first."""
    digits = name.removeprefix("step_")
    return int(digits) if digits.isdigit() else -1
