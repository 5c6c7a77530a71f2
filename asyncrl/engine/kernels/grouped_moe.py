"""The engine's grouped path for mixture-of-experts layers: tokens sorted by expert, two grouped matrix products.

    install_grouped_experts(model)      # once, in `select_kernels`, after the weights are on their device

The readable path (`models/moe.py: per_expert_forward`) gathers each expert's tokens with a `nonzero` per expert,
E small products and E scatter-adds. Here the (token, slot) pairs are sorted by expert once, each expert's
rows are a contiguous run, and `torch._grouped_mm` multiplies every run by its expert's stacked weights in one
call (gate and up together, then down); the weighted outputs are added back per token with one `index_add_`.
The stacked weights are the parameters' own storage (each expert's Linear weights become views of them, as
`models/compile.fuse_projections` does for q/k/v), so in-place weight updates reach them.

Inference only (the views are not sharded or trained). Sums over a token's k experts run in another order than
the readable path's, so results agree to rounding, not bitwise. On CUDA `torch._grouped_mm` needs bf16 (and a
Hopper-class GPU); elsewhere the same dispatch runs one product per expert run.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from asyncrl.models.compile import stack_as_views
from asyncrl.models.moe import SparseMoE
from asyncrl.models.transformer import CausalLM


class GroupedExperts:
    """`SparseMoE.experts_forward` over stacked weights: gate_up (E, 2I, H), down (E, H, I)."""

    def __init__(self, gate_up: Tensor, down: Tensor, use_grouped_mm: bool) -> None:
        self.gate_up = gate_up
        self.down = down
        self.use_grouped_mm = use_grouped_mm

    def __call__(self, tokens: Tensor, expert_ids: Tensor, weights: Tensor, experts: nn.ModuleList) -> Tensor:
        num_experts, top_k = self.gate_up.shape[0], expert_ids.shape[1]
        flat = expert_ids.reshape(-1)  # (M * k,)
        order = torch.argsort(flat, stable=True)  # pairs grouped by expert
        rows = order // top_k  # (M * k,) the token of each sorted pair
        counts = torch.bincount(flat, minlength=num_experts)  # (E,)
        hidden = self._products(tokens[rows], counts)  # (M * k, H)
        hidden = hidden * weights.reshape(-1)[order, None].to(hidden.dtype)
        output = torch.zeros_like(tokens)
        return output.index_add_(0, rows, hidden.to(output.dtype))

    def _products(self, sorted_tokens: Tensor, counts: Tensor) -> Tensor:
        if self.use_grouped_mm:
            offsets = counts.cumsum(0).to(torch.int32)
            gate, up = torch._grouped_mm(sorted_tokens, self.gate_up.transpose(1, 2), offs=offsets).chunk(2, dim=-1)
            return torch._grouped_mm(F.silu(gate) * up, self.down.transpose(1, 2), offs=offsets)
        parts = []
        for expert, run in enumerate(sorted_tokens.split(counts.tolist())):
            gate, up = (run @ self.gate_up[expert].T).chunk(2, dim=-1)
            parts.append((F.silu(gate) * up) @ self.down[expert].T)
        return torch.cat(parts)


def install_grouped_experts(model: CausalLM) -> None:
    """Stacks every MoE layer's expert weights (their Linear weights become views) and sets the layer's
    `experts_forward` to the grouped path."""
    parameter = next(model.parameters())
    use_grouped_mm = not parameter.is_cuda or parameter.dtype == torch.bfloat16
    with torch.no_grad():
        for layer in model.model.layers:
            block: SparseMoE = layer.sparse_mlp
            experts = list(block.experts)
            gate_up = stack_as_views([linear for expert in experts for linear in (expert.gate_proj, expert.up_proj)],
                                     "weight")
            down = stack_as_views([expert.down_proj for expert in experts], "weight")
            num_experts = len(experts)
            block.experts_forward = GroupedExperts(gate_up.view(num_experts, -1, gate_up.shape[-1]),
                                                   down.view(num_experts, -1, down.shape[-1]), use_grouped_mm)
