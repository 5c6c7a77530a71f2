"""Speed-ups of the shared transformer that leave its numbers and parameter names alone.

    compile_decoder_layers(model)     # trainer and engine on CUDA: torch.compile around the attention kernel
    fuse_projections(model)           # engine only: q/k/v and gate/up as one matrix product each

Why. On an H200 a 0.5B model's layer is a few short matrix products and ~30 small elementwise kernels
(RMSNorm's fp32 statistics, rotary, SiLU x up, residual adds), each a launch and a trip through memory.
The trainer measured ~150 kernels per layer and was host-bound; the engine's decode step spent more
time in elementwise kernels than in attention. Inductor fuses each half of the layer (before and after
the attention kernel) into a handful of kernels, forward and backward. On the trainer's dense batches the
whole layer, causal SDPA included, is one graph: one compiled call per layer forward and one backward
(the host's per-call cost set the pace of a small model's update).

Every layer shares the same compiled graphs (dynamo treats a layer's parameters as inputs), so compile
time does not grow with depth. Shapes are symbolic from the start (micro-batches, prefills and decode
buckets all differ), so a run compiles a handful of times at start (with and without autograd, and for
the sizes 0/1 that dynamo always specialises), not per shape.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from asyncrl.models.transformer import CausalLM, TransformerModel, ValueModel

# Grad modes x specialised sizes x dense (B, T) or flattened (N,) layouts: above the default of 8
# recompiles per function, past which dynamo silently falls back to eager.
_RECOMPILE_LIMIT = 32


def compile_decoder_layers(model: CausalLM | ValueModel, backend: str = "inductor") -> None:
    """Replaces every layer's `dense_forward` (the trainer's whole layer) and `attention_inputs` /
    `attention_outputs` (the halves around an attention backend), and the backbone's `embed` and `final_norm`
    (the engine's ends of the forward), with compiled versions, in place, and marks
    the model `is_compiled` (on CUDA the trainer's chunked LM head then runs its fused Triton kernels too).

    Call it before FSDP wrapping or CUDA-graph capture (their hooks and captures then see the compiled
    functions). `backend="aot_eager"` traces forward and backward without code generation (CPU tests)."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, _RECOMPILE_LIMIT)
    model.is_compiled = True
    backbone = model.model
    for name in ("embed", "final_norm"):
        setattr(backbone, name, torch.compile(getattr(backbone, name), backend=backend, fullgraph=True, dynamic=True))
    for layer in model.model.layers:
        # An MoE layer's expert dispatch has data-dependent shapes (tokens per expert), which a full graph cannot
        # hold: its MLP half stays eager, and its dense forward calls its (compiled) attention half.
        names = ("attention_inputs",) if layer.is_moe else ("dense_forward", "attention_inputs", "attention_outputs")
        for name in names:
            setattr(layer, name, torch.compile(getattr(layer, name), backend=backend, fullgraph=True, dynamic=True))


def fuse_projections(backbone: TransformerModel) -> None:
    """Stacks each layer's q/k/v weights (and biases) into one matrix and gate/up into another, and turns
    the original Parameters into views of the stacked ones, so names, `state_dict` reads and in-place
    updates (`copy_` into `...q_proj.weight`) keep working and reach the stacked matrix.

    Inference only: the views must never be re-assigned, resized or sharded (FSDP would shard each view
    separately). Call it once, after the weights are on their device and before CUDA-graph capture."""
    with torch.no_grad():
        for layer in backbone.layers:
            attention = layer.self_attn
            projections = [attention.q_proj, attention.k_proj, attention.v_proj]
            attention.qkv_weight = stack_as_views(projections, "weight")
            if attention.q_proj.bias is not None:
                attention.qkv_bias = stack_as_views(projections, "bias")
            if not layer.is_moe:  # experts keep their own products (a grouped kernel stacks them itself)
                layer.mlp.gate_up_weight = stack_as_views([layer.mlp.gate_proj, layer.mlp.up_proj], "weight")


def stack_as_views(modules: list[nn.Linear], name: str) -> Tensor:
    """Concatenates `module.<name>` along dim 0 and re-registers each as a Parameter viewing its rows."""
    stacked = torch.cat([getattr(module, name) for module in modules], dim=0)
    # A plain tensor attribute, not a Parameter: compiled with dynamic=True its sizes would be symbolic, and
    # Inductor's kernels would divide indices by a run-time size (SiLU x up took 5.5 instead of 3.1 us on an
    # H200 decode step). Static like the Parameters, only the token count stays symbolic.
    torch._dynamo.mark_static(stacked)
    offset = 0
    for module in modules:
        rows = getattr(module, name).shape[0]
        setattr(module, name, nn.Parameter(stacked[offset:offset + rows], requires_grad=False))
        offset += rows
    return stacked
