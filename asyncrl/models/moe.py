"""The sparse mixture-of-experts MLP of Qwen3-MoE and Mixtral: a router and `num_experts` SwiGLU experts.

    block = SparseMoE(config, layer_index)
    output = block(hidden, routing)        # hidden (..., hidden); routing: a `Routing` or None

For each token the router's softmax over experts (fp32, as `transformers` computes it) picks the top
`num_experts_per_tok`; the output is the sum of those experts' outputs, each weighted by its probability
(renormalised over the chosen ones when `norm_topk_prob`). With routing replay (`Routing.replay_ids`) the
chosen ids come from the record instead, and the weights are still the router's probabilities at those ids,
so the router keeps receiving gradients.

Parameter names are HF's: Qwen3-MoE `mlp.gate.weight`, `mlp.experts.<e>.{gate,up,down}_proj.weight`;
Mixtral `block_sparse_moe.gate.weight`, `block_sparse_moe.experts.<e>.w{1,3,2}.weight` (gate, up, down).

`per_expert_forward` is the readable path: one gather, SwiGLU and scatter-add per expert, in expert order
(the order `transformers` adds them in). Every expert runs, also on zero tokens, so each one gets a gradient
(zero when unused) in every backward: FSDP reduces every rank's gradients together, and a rank whose batch
left an expert unused must still take part. A faster path (grouped matrix products on CUDA) is installed per
block by the engine's kernel selector (`engine/kernels/grouped_moe.py`) through `experts_forward`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from asyncrl.models.layers import SwiGLU
from asyncrl.models.model_config import TransformerConfig
from asyncrl.models.routing import Routing

# tokens (M, hidden), expert ids (M, k) int64, their weights (M, k) fp32, the experts -> output (M, hidden)
ExpertsForward = Callable[[Tensor, Tensor, Tensor, nn.ModuleList], Tensor]


class MixtralExpert(nn.Module):
    """A SwiGLU expert under Mixtral's names: w1 is the gate, w3 the up and w2 the down projection."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.w2 = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.w3 = nn.Linear(hidden_size, intermediate_size, bias=False)

    # The names every expert answers to (the grouped path stacks them).
    @property
    def gate_proj(self) -> nn.Linear:
        return self.w1

    @property
    def up_proj(self) -> nn.Linear:
        return self.w3

    @property
    def down_proj(self) -> nn.Linear:
        return self.w2

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def per_expert_forward(tokens: Tensor, expert_ids: Tensor, weights: Tensor, experts: nn.ModuleList) -> Tensor:
    """tokens (M, hidden), expert_ids (M, k), weights (M, k) -> (M, hidden): each expert over its tokens."""
    output = torch.zeros_like(tokens)
    for index, expert in enumerate(experts):
        rows, slots = torch.nonzero(expert_ids == index, as_tuple=True)  # (n_e,) each
        contribution = expert(tokens[rows]) * weights[rows, slots, None]  # (n_e, hidden)
        output.index_add_(0, rows, contribution.to(output.dtype))
    return output


class SparseMoE(nn.Module):
    """Router `gate` (Linear(hidden, E), no bias) and the `experts`; see the module docstring."""

    def __init__(self, config: TransformerConfig, layer_index: int) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.num_experts = config.num_experts
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        expert = MixtralExpert if config.model_type == "mixtral" else SwiGLU
        self.experts = nn.ModuleList(expert(config.hidden_size, config.moe_intermediate_size)
                                     for _ in range(config.num_experts))
        self.experts_forward: ExpertsForward = per_expert_forward

    def forward(self, hidden: Tensor, routing: Routing | None = None) -> Tensor:
        tokens = hidden.reshape(-1, hidden.shape[-1])  # (M, hidden)
        router_logits = self.gate(tokens)  # (M, E) in the model dtype, as HF
        replay_ids = None if routing is None else routing.replay_for(self.layer_index, tokens.shape[0])
        expert_ids, weights, router_ids = self.route(router_logits, replay_ids)
        if routing is not None:
            routing.record(self.layer_index, expert_ids, router_ids, router_logits)
        output = self.experts_forward(tokens, expert_ids, weights, self.experts)
        return output.view_as(hidden)

    def route(self, router_logits: Tensor, replay_ids: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """(M, k) int64 expert ids used, (M, k) fp32 weights, and (M, k) the router's own top-k: the ids used are
        the router's top-k, or the replayed ids where recorded (a token-layer pair whose k ids are all below
        num_experts)."""
        probabilities = torch.softmax(router_logits.float(), dim=-1)  # (M, E)
        _, router_ids = torch.topk(probabilities, self.top_k, dim=-1)  # (M, k)
        expert_ids = router_ids
        if replay_ids is not None:
            recorded = (replay_ids < self.num_experts).all(dim=-1, keepdim=True)  # (M, 1)
            expert_ids = torch.where(recorded, replay_ids.clamp(max=self.num_experts - 1), router_ids)
        weights = probabilities.gather(1, expert_ids)  # (M, k)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return expert_ids, weights.to(router_logits.dtype), router_ids
