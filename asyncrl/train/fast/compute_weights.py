"""Compute-dtype copies of a model's fp32 master weights that never move: mixed precision without FSDP.

    weights = ComputeWeights(model, torch.bfloat16)
    weights.refresh()                              # copies := masters (after every write to the masters)
    with weights.applied():                        # the model's parameters are the copies while inside
        loss = ...
    weights.accumulate(torch.autograd.grad(loss, weights.trainable))   # master.grad += grad, in fp32
    weights.gradient_of(copy)                      # a master's fp32 gradient, for ops that add into it directly

Why. A CUDA graph replays kernels on the addresses it captured. FSDP gathers its compute-dtype copies into
fresh memory at every step, so a trainer rank that replays its micro-batch step from a graph (one rank,
`actor.cuda_graphs`) keeps its own copies instead, at fixed addresses, refreshed in place. The numbers are
FSDP's on one rank: forward and backward in the compute dtype, gradients summed in fp32 on the masters.

The trainable masters are moved into one buffer and their copies into another. Their `.grad` tensors lie in a
third, allocated once, zeroed in place (`zero_grads`) and never set to None: a captured step adds into them at
fixed addresses too (checkpointing sets them aside and back: `checkpoint.gradients_aside`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from asyncrl.models.attention import SelfAttention


_ALIGNMENT = 64  # elements


class ComputeWeights:
    def __init__(self, model: nn.Module, dtype: Optional[torch.dtype], compile_accumulation: bool = False) -> None:
        """`compile_accumulation` (a model whose layers are compiled: CUDA) runs `accumulate` as compiled foreach
        kernels."""
        self.masters = list(model.parameters())  # unique: a tied LM head is the embedding's Parameter
        self.trainable_masters = [master for master in self.masters if master.requires_grad]
        dtypes = {master.dtype for master in self.trainable_masters}
        if len(dtypes) > 1:
            raise ValueError(f"trainable master weights must share one dtype, got {sorted(map(str, dtypes))}")
        master_dtype = dtypes.pop() if dtypes else torch.float32
        device = self.masters[0].device
        shapes = [master.shape for master in self.trainable_masters]
        # The trainable masters, their gradients and their compute copies each lie in one buffer (`carve`), at the
        # same offsets: zeroing the gradients is one kernel (a foreach zero of a 0.5B model's 290 tensors took 3.2
        # ms of host time on an H200 machine), the refresh is one copy, and an optimizer can update the masters in
        # one pass over flat memory (`FlatAdamW`).
        self.flat_masters, master_parts = carve(shapes, master_dtype, device)
        self.flat_grads, grads = carve(shapes, master_dtype, device)
        self.flat_copies, copy_parts = carve(shapes, dtype or master_dtype, device)
        with torch.no_grad():
            self.flat_grad_parts = grads
            for master, part, grad, copy in zip(self.trainable_masters, master_parts, grads, copy_parts):
                part.copy_(master)
                master.data = part  # the same Parameter object (modules, optimizers keep it), new memory
                master.grad = grad
                copy.copy_(master)
            self.frozen_masters = [master for master in self.masters if not master.requires_grad]
            frozen_copies = [master.detach().to(dtype or master.dtype, copy=True) for master in self.frozen_masters]
        copy_of = {id(master): copy.requires_grad_(True) for master, copy in zip(self.trainable_masters, copy_parts)}
        copy_of.update({id(master): copy for master, copy in zip(self.frozen_masters, frozen_copies)})
        self.copies = [copy_of[id(master)] for master in self.masters]
        self.frozen_copies = frozen_copies
        self.master_of = {id(copy): master for master, copy in zip(self.masters, self.copies)}
        # Every (module, name) slot holding a master, tied slots included, with the copy that replaces it.
        self.slots = [(module, name, parameter, copy_of[id(parameter)]) for module in model.modules()
                      for name, parameter in module._parameters.items() if parameter is not None]
        # Per attention layer, one compute copy of its stacked q/k/v weight (and bias), refreshed with the others:
        # the layer then multiplies by it directly instead of stacking its three copies in every micro-batch
        # (`SelfAttention.project`; two kernels per layer and micro-batch, ~1.2 ms of a 0.25 s 0.5B update on an
        # H200). Its gradient is split back into the three masters' gradients as it is accumulated.
        self.stacked: list[tuple[SelfAttention, Tensor, Optional[Tensor]]] = []
        self.stacked_blocks: list[list[_Block]] = []  # per stacked copy, in `trainable` order: its masters' rows
        for attention in (module for module in model.modules() if isinstance(module, SelfAttention)):
            projections = (attention.q_proj, attention.k_proj, attention.v_proj)
            if attention.qkv_weight is not None or not all(p.weight.requires_grad for p in projections):
                continue
            stacked_weight = self._stack([p.weight for p in projections], dtype)
            stacked_bias = None if attention.q_proj.bias is None else self._stack([p.bias for p in projections], dtype)
            self.stacked.append((attention, stacked_weight, stacked_bias))
        self.trainable = [copy for copy in self.copies if copy.requires_grad] + [
            tensor for _, weight, bias in self.stacked for tensor in (weight, bias) if tensor is not None]
        self.add = compiled_foreach_add() if compile_accumulation else torch._foreach_add_

    def _stack(self, masters: list[nn.Parameter], dtype: Optional[torch.dtype]) -> Tensor:
        """A compute-dtype leaf holding `masters` stacked along dim 0 (refreshed with the copies), whose
        gradient `accumulate` adds into theirs, row block by row block."""
        stacked = torch.cat([master.detach() for master in masters]).to(dtype or masters[0].dtype)
        # Static like the Parameters, so a compiled layer keeps only the token count symbolic.
        torch._dynamo.mark_static(stacked)
        stacked.requires_grad_(True)
        blocks, offset = [], 0
        for master in masters:
            rows = slice(offset, offset + master.shape[0])
            blocks.append(_Block(master, rows, stacked.detach()[rows]))
            offset += master.shape[0]
        self.stacked_blocks.append(blocks)
        return stacked

    def refresh(self) -> None:
        """Copies := masters (rounded to the compute dtype), in place."""
        with torch.no_grad():
            self.flat_copies.copy_(self.flat_masters)  # padding between the parts included: zeros both sides
            if self.frozen_masters:
                torch._foreach_copy_(self.frozen_copies, self.frozen_masters)
            if self.stacked_blocks:
                blocks = [block for stacked in self.stacked_blocks for block in stacked]
                torch._foreach_copy_([block.copy_rows for block in blocks], [block.master for block in blocks])

    @contextmanager
    def applied(self) -> Iterator[None]:
        """The model's parameter slots hold the copies inside the block, the masters again after it."""
        for module, name, _, copy in self.slots:
            module._parameters[name] = copy
        for attention, weight, bias in self.stacked:
            attention.qkv_weight, attention.qkv_bias = weight, bias
        try:
            yield
        finally:
            for module, name, master, _ in self.slots:
                module._parameters[name] = master
            for attention, _, _ in self.stacked:
                attention.qkv_weight = attention.qkv_bias = None

    def gradient_of(self, copy: Tensor) -> Optional[Tensor]:
        """The fp32 gradient of the master that `copy` stands in for (None when it does not train)."""
        master = self.master_of.get(id(copy))
        if master is None:
            raise ValueError(f"not one of these compute copies: a tensor of shape {tuple(copy.shape)}")
        return master.grad

    def accumulate(self, gradients: Sequence[Optional[Tensor]]) -> None:
        """master.grad += gradient (of the copy in `trainable` order: the masters' copies, then the stacked
        q/k/v copies, whose gradients go to their masters row block by row block), summed in fp32; None adds
        nothing."""
        num_copies = len(self.trainable_masters)
        pairs = [(master.grad, gradient) for master, gradient in zip(self.trainable_masters, gradients[:num_copies])
                 if gradient is not None]
        for blocks, gradient in zip(self.stacked_blocks, gradients[num_copies:]):
            if gradient is not None:
                pairs.extend((block.master.grad, gradient[block.rows]) for block in blocks)
        if pairs:
            # Mixed dtypes: each add reads the compute-dtype gradient and sums in fp32, no fp32 copy of it.
            self.add([grad for grad, _ in pairs], [gradient for _, gradient in pairs])

    def zero_grads(self) -> None:
        """Zeroes the masters' gradients in place."""
        self.flat_grads.zero_()


@dataclass(frozen=True)
class _Block:
    """A master's rows in a stacked compute copy."""
    master: nn.Parameter
    rows: slice
    copy_rows: Tensor  # the stacked copy's rows (a view, no autograd), which `refresh` writes


def carve(shapes: Sequence[torch.Size], dtype: torch.dtype, device: torch.device) -> tuple[Tensor, list[Tensor]]:
    """One zeroed buffer and, for each shape, a tensor over its own part of it.

    Each part starts at a multiple of 64 elements: vectorised kernels (Inductor's, the fused AdamW's) want aligned
    tensors, and Inductor copies a misaligned input it mutates, in and back out, at every call.

    The parts share the buffer's memory but are not autograd views of it (`set_`, not slicing): a view shares its
    base's version counter, so adding into one part would count as modifying every part, and a compiled layer's
    backward, which saves the part it adds its MLP weight gradients into (`linear_into`), would then fail its
    saved-tensor check after a later layer's backward had added into a different part."""
    offsets = [0]
    for shape in shapes:
        offsets.append(offsets[-1] + -(-math.prod(shape) // _ALIGNMENT) * _ALIGNMENT)
    buffer = torch.zeros(offsets[-1], dtype=dtype, device=device)
    parts = [torch.empty(0, dtype=dtype, device=device).set_(buffer.untyped_storage(), offset, shape)
             for offset, shape in zip(offsets, shapes)]
    return buffer, parts


def _foreach_add(accumulators: list[Tensor], values: list[Tensor]) -> None:
    torch._foreach_add_(accumulators, values)


@functools.cache
def compiled_foreach_add() -> Callable[[list[Tensor], list[Tensor]], None]:
    """`torch._foreach_add_` compiled by Inductor, one function per process. Eager, mixed-dtype foreach adds fall
    back to one unvectorised kernel per tensor: 21 ms of a 0.29 s 0.5B update on an H200 (8 micro-batches x 290
    parameters, ~1.9 TB/s). Inductor lowers the same call to foreach kernels that add many tensors per launch with
    vectorised loads. It compiles at its first call (every later call passes the same parameters' gradients); a
    captured step replays its kernels. Built on first use: `torch.compile` imports dynamo, and with it triton."""
    return torch.compile(_foreach_add, fullgraph=True, dynamic=False)
