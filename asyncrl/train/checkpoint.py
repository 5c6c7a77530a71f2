"""Save and restore everything a trainer rank needs to continue exactly: its shards of the model and optimizer
states, LR schedulers, RNG states, and counters, in data-only files (no pickle: loading a checkpoint can never
run code).

    save_trainer_state(folder, {"actor": (model, optimizer, scheduler)}, extra={"num_skipped_steps": 0})
    extra = load_trainer_state(folder, {"actor": (model, optimizer, scheduler)})

    folder/rank_0.safetensors   every tensor of rank 0's state (its local shards), named by its path in the state
    folder/rank_0.json          the rest of the state (numbers, strings, lists), tensors as {"tensor": name}

Each rank writes its own shards; loading needs the same number of trainer ranks (the shards are not
re-split). Loading fills the tensors a fresh model and optimizer already have, in place, and refuses a
checkpoint whose tensors do not match them one to one, naming the file and the tensor.
"""

from __future__ import annotations

import json
import random
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)
from torch.distributed.tensor import DTensor

from asyncrl.models.checkpoint_io import check_finite
from asyncrl.train.parallel import rank

# Frozen parameters (a LoRA policy's base weights) are the model folder's, never trained: a checkpoint holds the
# trainable ones (the adapters) and a resume reloads the base from the folder.
TRAINABLE = StateDictOptions(ignore_frozen_params=True)
TRAINABLE_LOAD = StateDictOptions(ignore_frozen_params=True, strict=False)

Component = tuple[nn.Module, Optional[torch.optim.Optimizer], Optional[torch.optim.lr_scheduler.LRScheduler]]

FORMAT_VERSION = 1
# Files earlier versions wrote (pickles: torch.save, and torch.distributed.checkpoint's metadata and shards).
PICKLED_NAMES = ("rank_*.pt", "shards/.metadata", "shards/*.distcp")
SAFETENSORS_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                      torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
                      torch.uint8: "U8", torch.bool: "BOOL"}


class CheckpointFormatError(ValueError):
    """A checkpoint file that is not what asyncrl writes (a pickle, a damaged file, another model's state)."""


def sharded_state(components: dict[str, Component]) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for name, (model, optimizer, _) in components.items():
        state[f"{name}.model"] = get_model_state_dict(model, options=TRAINABLE)
        if optimizer is not None:
            with gradients_aside(model):
                state[f"{name}.optimizer"] = get_optimizer_state_dict(model, optimizer)
    return state


@contextmanager
def gradients_aside(model: nn.Module) -> Iterator[None]:
    """No parameter has a `.grad` inside the block; after it, each has the very tensor it had before.

    torch's state-dict helpers build an optimizer's empty state (a fresh process about to load a checkpoint)
    with a zero-lr step, but only when no parameter has a gradient (otherwise the state stays empty and the
    load restores nothing), and then drop every gradient. Gradients kept at fixed addresses (`ComputeWeights`,
    which a captured CUDA graph adds into) must survive both."""
    gradients = [(parameter, parameter.grad) for parameter in model.parameters()]
    for parameter, _ in gradients:
        parameter.grad = None
    try:
        yield
    finally:
        for parameter, gradient in gradients:
            parameter.grad = gradient


def save_trainer_state(folder: str | Path, components: dict[str, Component], extra: dict[str, Any]) -> None:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    numpy_rng = np.random.get_state()
    local = {
        "sharded": sharded_state(components),
        "schedulers": {name: scheduler.state_dict() for name, (_, _, scheduler) in components.items()
                       if scheduler is not None},
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                "numpy": [numpy_rng[0], torch.from_numpy(numpy_rng[1].astype(np.int64)), *numpy_rng[2:]],
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
        "extra": extra,
    }
    tensors: dict[str, Tensor] = {}
    skeleton = to_skeleton(local, (), tensors)
    write_safetensors(folder / f"rank_{rank()}.safetensors", tensors)
    (folder / f"rank_{rank()}.json").write_text(json.dumps({"format_version": FORMAT_VERSION, "state": skeleton}))


def load_trainer_state(folder: str | Path, components: dict[str, Component]) -> dict[str, Any]:
    folder = Path(folder)
    refuse_pickles(folder)
    skeleton_path, tensors_path = folder / f"rank_{rank()}.json", folder / f"rank_{rank()}.safetensors"
    for path in (skeleton_path, tensors_path):
        if not path.is_file():
            raise FileNotFoundError(f"trainer checkpoint {folder} has no {path.name} (saved with another "
                                    f"number of trainer ranks, or incomplete)")
    try:
        skeleton = json.loads(skeleton_path.read_text())
    except (OSError, ValueError) as error:
        raise CheckpointFormatError(f"trainer checkpoint file {skeleton_path} is not a readable JSON file: {error}") from error
    if not isinstance(skeleton, dict) or skeleton.get("format_version") != FORMAT_VERSION:
        raise CheckpointFormatError(f"trainer checkpoint file {skeleton_path} is not a format-{FORMAT_VERSION} "
                                    f"trainer state (no matching format_version)")
    target = {"sharded": sharded_state(components)}
    try:
        with safe_open(str(tensors_path), framework="pt", device="cpu") as tensors:
            local = from_skeleton(skeleton["state"], (), target, TensorSource(tensors, tensors_path))
    except SafetensorError as error:
        raise CheckpointFormatError(f"trainer checkpoint file {tensors_path} is not a readable safetensors file: "
                                    f"{error}") from error
    for name, (model, optimizer, _) in components.items():
        for key, value in local["sharded"][f"{name}.model"].items():
            try:
                check_finite(value, f"trainer checkpoint file {tensors_path}: {name} tensor {key}")
            except ValueError as error:
                raise CheckpointFormatError(str(error)) from None
        set_model_state_dict(model, local["sharded"][f"{name}.model"], options=TRAINABLE_LOAD)
        if optimizer is not None:
            with gradients_aside(model):
                set_optimizer_state_dict(model, optimizer, local["sharded"][f"{name}.optimizer"])
    for name, (_, _, scheduler) in components.items():
        if scheduler is not None:
            scheduler.load_state_dict(local["schedulers"][name])
    torch.set_rng_state(local["rng"]["torch"])
    name, key, *rest = local["rng"]["numpy"]
    np.random.set_state((name, key.numpy().astype(np.uint32), *rest))
    random.setstate(local["rng"]["python"])
    if local["rng"]["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(local["rng"]["cuda"])
    return local["extra"]


def refuse_pickles(folder: Path) -> None:
    """Earlier versions (and nobody else) put pickles here; unpickling one can run any code, so none is read."""
    for pattern in PICKLED_NAMES:
        for path in sorted(folder.glob(pattern)):
            raise CheckpointFormatError(
                f"trainer checkpoint file {path} is a pickle (torch.save or torch.distributed.checkpoint format, "
                f"written by asyncrl before checkpoints held only data, or planted); asyncrl never unpickles "
                f"checkpoint files, since loading a pickle can run any code. Resume from a checkpoint this version "
                f"wrote, or start the run again")


# ---- the state as JSON with tensor references ---------------------------------------------------------------
def to_skeleton(value: Any, path: tuple[str, ...], tensors: dict[str, Tensor]) -> Any:
    """JSON-able form of a state tree; each tensor (a DTensor's local shard) goes to `tensors` under its path."""
    if isinstance(value, Tensor):
        name = "/".join(path)
        if name in tensors:
            raise ValueError(f"two tensors of the trainer state have the path {name}")
        tensors[name] = value.to_local() if isinstance(value, DTensor) else value
        return {"tensor": name}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        items = [to_skeleton(item, (*path, str(index)), tensors) for index, item in enumerate(value)]
        return items if isinstance(value, list) else {"tuple": items}
    if isinstance(value, dict):
        # Keys may be ints (a torch optimizer's own state) or strings: pairs keep the key's type.
        return {"dict": [[key if isinstance(key, (int, str)) else _refuse(key, path),
                          to_skeleton(item, (*path, str(key)), tensors)] for key, item in value.items()]}
    return _refuse(value, path)


def _refuse(value: Any, path: tuple[str, ...]) -> Any:
    raise TypeError(f"the trainer state holds {type(value).__name__} at {'/'.join(path)}; a checkpoint holds "
                    f"only tensors, numbers, strings, lists and dicts")


class TensorSource:
    def __init__(self, handle: Any, path: Path):
        self.handle, self.path = handle, path
        self.names = set(handle.keys())
        self.used: set[str] = set()

    def read(self, name: Any) -> Tensor:
        if not isinstance(name, str) or name not in self.names:
            raise CheckpointFormatError(f"trainer checkpoint file {self.path} has no tensor {name!r}, which the "
                                        f"state file next to it refers to")
        self.used.add(name)
        return self.handle.get_tensor(name)


def from_skeleton(value: Any, path: tuple[str, ...], target: Any, source: TensorSource) -> Any:
    """The state a skeleton describes. Where `target` (the fresh state) has a tensor, the saved one is copied
    into it (a DTensor's local shard), so the result lives where training expects it."""
    if isinstance(value, list):
        targets = target if isinstance(target, (list, tuple)) and len(target) == len(value) else [None] * len(value)
        return [from_skeleton(item, (*path, str(index)), goal, source)
                for index, (item, goal) in enumerate(zip(value, targets))]
    if not isinstance(value, dict):
        return value
    if set(value) == {"tuple"}:
        return tuple(from_skeleton(value["tuple"], path, target, source))
    if set(value) == {"tensor"}:
        return fill_tensor(source.read(value["tensor"]), target, "/".join(path), source.path)
    if set(value) == {"dict"} and isinstance(value["dict"], list):
        targets = target if isinstance(target, dict) else {}
        loaded = {key: from_skeleton(item, (*path, str(key)), targets.get(key), source) for key, item in value["dict"]}
        if targets and set(targets) - set(loaded) and path[:1] == ("sharded",):
            missing = sorted(map(str, set(targets) - set(loaded)))[:3]
            raise CheckpointFormatError(f"trainer checkpoint file {source.path} lacks {'/'.join(path)}/{missing[0]} "
                                        f"(and {len(set(targets) - set(loaded)) - 1} more) that this model has")
        return loaded
    raise CheckpointFormatError(f"trainer checkpoint state next to {source.path} has an unknown entry at "
                                f"{'/'.join(path)}: {sorted(value)}")


def fill_tensor(saved: Tensor, target: Any, name: str, path: Path) -> Tensor:
    if target is None:
        return saved
    if not isinstance(target, Tensor):
        raise CheckpointFormatError(f"trainer checkpoint file {path} has a tensor {name}, where this model's "
                                    f"state has {type(target).__name__}")
    local = target.to_local() if isinstance(target, DTensor) else target
    if local.shape != saved.shape:
        raise CheckpointFormatError(f"trainer checkpoint file {path}: tensor {name} has shape {tuple(saved.shape)}, "
                                    f"this model's has {tuple(local.shape)} (another model, or another number of "
                                    f"trainer ranks)")
    with torch.no_grad():
        local.copy_(saved)
    return target


def write_safetensors(path: Path, tensors: dict[str, Tensor]) -> None:
    """A safetensors file written one tensor at a time, so no second copy of the whole state is ever held (a
    GPU tensor visits the host one at a time; views of one buffer are written apart)."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, tensor in tensors.items():
        if tensor.dtype not in SAFETENSORS_DTYPES:
            raise TypeError(f"trainer state tensor {name} has dtype {tensor.dtype}, which the checkpoint cannot hold")
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": SAFETENSORS_DTYPES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(encoded)))
        file.write(encoded)
        for tensor in tensors.values():
            if tensor.numel():
                host = tensor.detach().to("cpu").contiguous().reshape(-1)
                file.write(host.view(torch.uint8).numpy().tobytes())
