"""LoRA: low-rank adapters on the attention and MLP projections of the shared transformer.

    spec = LoRASpec(rank=8, alpha=16.0, target_modules=("all-linear",))
    add_adapters(model, spec)                 # q/k/v/o/gate/up/down become LoRALinear; only adapters train
    with adapters_disabled(model):            # the same weights as the base model: the KL reference
        ref_hidden = model(input_ids, positions)

A targeted projection computes, as PEFT's `lora.Linear` does,

    y = x W^T (+ b) + scale * B(A(dropout(x)))      # A (r, in), B (out, r), scale = alpha / r

Parameter names follow PEFT's saved names (`...q_proj.lora_A.weight`, `...q_proj.lora_B.weight`; the base
weight keeps its HF name `...q_proj.weight`), so exporting an adapter is a save without renames and a weight
sync moves the adapters by name like any other tensor.

The adapters stay unmerged in the engine too: it runs this very forward, so a token's rollout log-prob
equals the trainer's (docs/lora.md has the measurement behind that choice).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from asyncrl.config.schema import LORA_PROJECTIONS, AsyncRLConfig

PROJECTIONS = LORA_PROJECTIONS
ALL_LINEAR = "all-linear"
LoRAInit = Literal["gaussian", "kaiming"]
LORA_INITS: tuple[str, ...] = ("gaussian", "kaiming")


@dataclass(frozen=True)
class LoRASpec:
    """What `add_adapters` builds. `target_modules`: projection names, or ("all-linear",) for all seven.
    `init`: A ~ N(0, 1/r) ("gaussian", PEFT's init_lora_weights="gaussian") or kaiming-uniform ("kaiming",
    PEFT's default); B is zero either way, so a fresh adapter leaves the model's outputs unchanged. `seed`
    fixes A, so every process that builds the adapters (trainer ranks, engines) starts from the same ones."""
    rank: int
    alpha: float
    target_modules: tuple[str, ...] = (ALL_LINEAR,)
    dropout: float = 0.0
    init: LoRAInit = "gaussian"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rank <= 0:
            raise ValueError(f"model.lora_rank must be positive to build adapters, got {self.rank}")
        if self.alpha <= 0:
            raise ValueError(f"model.lora_alpha must be positive, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.lora_dropout must be in [0, 1), got {self.dropout}")
        if self.init not in LORA_INITS:
            raise ValueError(f"model.lora_init must be one of {LORA_INITS}, got {self.init!r}")
        resolve_targets(self.target_modules)

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @property
    def targets(self) -> tuple[str, ...]:
        return resolve_targets(self.target_modules)


def lora_spec(config: AsyncRLConfig) -> LoRASpec | None:
    """The policy's adapters as the run's config asks for them (None: model.lora_rank = 0, no LoRA). Seeded by
    trainer.seed, so the trainer ranks and every engine build the same initial adapters."""
    model = config.model
    if model.lora_rank == 0:
        return None
    return LoRASpec(rank=model.lora_rank, alpha=model.lora_alpha, target_modules=tuple(model.target_modules),
                    dropout=model.lora_dropout, init=model.lora_init, seed=config.trainer.seed)


def resolve_targets(target_modules: Sequence[str]) -> tuple[str, ...]:
    """("all-linear",) -> the seven projections; otherwise the names as given, each checked."""
    if list(target_modules) == [ALL_LINEAR]:
        return PROJECTIONS
    unknown = [name for name in target_modules if name not in PROJECTIONS]
    if unknown or not target_modules:
        raise ValueError(f"model.target_modules must be '{ALL_LINEAR}' or a non-empty list of {list(PROJECTIONS)}, "
                         f"got {list(target_modules)}")
    return tuple(name for name in PROJECTIONS if name in target_modules)


class LoRALinear(nn.Linear):
    """nn.Linear (the base weight, frozen) plus a rank-r adapter: `lora_A` (r, in), `lora_B` (out, r)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, rank: int, scale: float, dropout: float,
                 device: torch.device | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.lora_A = nn.Linear(in_features, rank, bias=False, device=device, dtype=dtype)
        self.lora_B = nn.Linear(rank, out_features, bias=False, device=device, dtype=dtype)
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.scale = scale
        # Off inside `adapters_disabled`: the layer is its base Linear (the reference policy's forward).
        self.adapters_enabled = True

    def forward(self, x: Tensor) -> Tensor:
        return self.add_adapter(F.linear(x, self.weight, self.bias), x)

    def adapter_output(self, x: Tensor) -> Tensor:
        """scale * B(A(dropout(x))), (..., out); in PEFT's order of operations."""
        return self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scale

    def add_adapter(self, base_output: Tensor, x: Tensor) -> Tensor:
        return base_output + self.adapter_output(x) if self.adapters_enabled else base_output


def add_fused_adapters(fused: Tensor, x: Tensor, projections: Sequence[nn.Linear]) -> Tensor:
    """`fused` = x times the stacked weights of `projections` (q/k/v, or gate/up), (..., sum of out);
    returns it plus each adapted projection's adapter output in its columns. Unchanged when none is adapted
    (or adapters are disabled)."""
    adapted = [isinstance(projection, LoRALinear) and projection.adapters_enabled for projection in projections]
    if not any(adapted):
        return fused
    updates = [projection.adapter_output(x) if is_adapted
               else x.new_zeros((*x.shape[:-1], projection.out_features))
               for projection, is_adapted in zip(projections, adapted)]
    return fused + torch.cat(updates, dim=-1)


def add_adapters(model: nn.Module, spec: LoRASpec) -> list[str]:
    """Replaces every targeted projection of `model` with a `LoRALinear` holding the same weight (and bias)
    Parameters, initialises the adapters from `spec.seed`, and freezes everything else. Returns the adapted
    module names. Call it before FSDP sharding, fused projections or compilation."""
    targets = spec.targets
    adapted: list[str] = []
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            if child_name not in targets or isinstance(child, LoRALinear):
                continue
            if is_expert_name(parent_name):
                check_expert_target(spec, f"{parent_name}.{child_name}")
                continue
            if type(child) is not nn.Linear:
                raise TypeError(f"LoRA target {parent_name}.{child_name} is a {type(child).__name__}, not a Linear")
            layer = LoRALinear(child.in_features, child.out_features, child.bias is not None, spec.rank, spec.scale,
                               spec.dropout, device=child.weight.device, dtype=child.weight.dtype)
            layer.weight = child.weight
            layer.bias = child.bias
            setattr(parent, child_name, layer)
            adapted.append(f"{parent_name}.{child_name}" if parent_name else child_name)
    if not adapted:
        raise ValueError(f"model.target_modules {list(spec.target_modules)} matched no projection of the model")
    for parameter_name, parameter in model.named_parameters():
        parameter.requires_grad_(is_adapter_name(parameter_name))
    reset_adapters(model, spec)
    return adapted


def is_expert_name(module_name: str) -> bool:
    """Whether a module is (inside) one expert of a mixture-of-experts layer (`...mlp.experts.3`)."""
    return ".experts." in f".{module_name}."


def check_expert_target(spec: LoRASpec, name: str) -> None:
    """LoRA adapts the attention projections of a mixture-of-experts model: 'all-linear' leaves its experts alone,
    an expert projection named in model.target_modules is refused. Adapters on E experts per layer would need a
    grouped adapter product in the engine and PEFT's names for fused expert tensors, which do not exist yet."""
    if list(spec.target_modules) != [ALL_LINEAR]:
        raise ValueError(f"model.target_modules {list(spec.target_modules)} adapts {name}, an expert of a "
                         f"mixture-of-experts model: LoRA adapts the attention projections of such a model (q_proj, "
                         f"k_proj, v_proj, o_proj; 'all-linear' means those), see docs/moe.md")


def reset_adapters(model: nn.Module, spec: LoRASpec) -> None:
    """A from `spec.init` and `spec.seed` (the same values in every process, on any device), B zero."""
    generator = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for module in adapter_layers(model):
            a = module.lora_A.weight
            if a.is_meta:  # a model of shapes only (a transfer plan): nothing to fill
                continue
            if spec.init == "gaussian":
                values = torch.randn(tuple(a.shape), generator=generator) / spec.rank
            else:  # kaiming-uniform with a = sqrt(5), as nn.Linear and PEFT initialise
                bound = 1.0 / math.sqrt(a.shape[1])
                values = torch.rand(tuple(a.shape), generator=generator) * (2 * bound) - bound
            a.copy_(values.to(a.dtype))
            module.lora_B.weight.zero_()


def adapter_layers(model: nn.Module) -> Iterator[LoRALinear]:
    return (module for module in model.modules() if isinstance(module, LoRALinear))


def has_adapters(model: nn.Module) -> bool:
    return any(True for _ in adapter_layers(model))


def is_adapter_name(name: str) -> bool:
    """Whether a parameter name (HF/PEFT layout) is an adapter's: `....lora_A.weight` or `....lora_B.weight`."""
    return ".lora_A." in name or ".lora_B." in name


@contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """Inside, every adapted projection computes its base Linear alone: the base model, with no copy of it."""
    layers = list(adapter_layers(model))
    for layer in layers:
        layer.adapters_enabled = False
    try:
        yield
    finally:
        for layer in layers:
            layer.adapters_enabled = True


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts; tied Parameters count once."""
    unique = {id(parameter): parameter for parameter in model.parameters()}.values()
    return (sum(parameter.numel() for parameter in unique if parameter.requires_grad),
            sum(parameter.numel() for parameter in unique))


def merge_adapters(named_tensors: dict[str, Tensor], spec: LoRASpec) -> dict[str, Tensor]:
    """An HF state dict without adapters: each adapted weight becomes W + scale * B @ A (computed in fp32,
    cast back), the adapter tensors leave. For a plain HF folder of the trained policy (a server that
    reloads folders, or a model to share)."""
    merged = {name: tensor for name, tensor in named_tensors.items() if not is_adapter_name(name)}
    for name, tensor in named_tensors.items():
        if not name.endswith(".lora_A.weight"):
            continue
        prefix = name[:-len(".lora_A.weight")]
        b = named_tensors[f"{prefix}.lora_B.weight"]
        weight = merged[f"{prefix}.weight"]
        delta = spec.scale * (b.float() @ tensor.float())
        merged[f"{prefix}.weight"] = (weight.float() + delta).to(weight.dtype)
    return merged
