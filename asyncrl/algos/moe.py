"""Mixture-of-experts terms over one forward's routing: the load-balancing loss and the routing statistics.

Shapes: L = MoE layers, M = tokens of the forward (flattened), E = experts, k = experts per token.

    loss = load_balancing_loss(router_logits, expert_ids, num_experts, valid)       # (L, M, E), (M, L, k), (M,)
    stats = routing_statistics(router_logits, expert_ids, router_ids, recorded_ids, num_experts, valid)

`load_balancing_loss` is the Switch-Transformer loss as `transformers` computes it for Mixtral and Qwen3-MoE
(`load_balancing_loss_func`): over the valid tokens of every layer taken together, the fraction of token slots
sent to each expert `f_e` (no gradient: it counts choices) times the mean router probability `P_e`, summed over
experts and multiplied by E. It is k for a uniform router and uniform choices and grows as the load concentrates on few experts
`expert_ids` are the experts the forward used: the router's top-k, or the replayed ones.

`routing_statistics` returns sums (so micro-batches and ranks add up exactly): the routing mismatch (token-layer
pairs whose set of k experts differs between what the trainer's router chose and what the rollout recorded),
token slots per expert, and the router's entropy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def load_balancing_loss(router_logits: Tensor, expert_ids: Tensor, num_experts: int, valid: Tensor) -> Tensor:
    """router_logits (L, M, E), expert_ids (M, L, k) int, valid (M,) bool -> scalar loss (0 without valid tokens)."""
    probabilities = torch.softmax(router_logits.float(), dim=-1)  # (L, M, E)
    weights = valid.to(probabilities.dtype)  # (M,)
    num_valid = weights.sum() * router_logits.shape[0]  # token-layer pairs
    if float(num_valid) == 0:
        return probabilities.sum() * 0.0
    # (M, L, k, E) one-hot of the choices, summed over k: each token-layer pair counts once per chosen expert.
    chosen = torch.nn.functional.one_hot(expert_ids.long(), num_experts).to(probabilities.dtype).sum(dim=2)
    slots_per_expert = (chosen * weights[:, None, None]).sum(dim=(0, 1)) / num_valid  # (E,) summing to k
    probability_per_expert = (probabilities * weights[None, :, None]).sum(dim=(0, 1)) / num_valid  # (E,)
    return num_experts * (slots_per_expert.detach() * probability_per_expert).sum()


@dataclass(frozen=True)
class RoutingStatistics:
    """Sums over one forward's valid tokens (add them over micro-batches and ranks, then divide)."""

    num_pairs: Tensor              # () valid token-layer pairs
    num_recorded_pairs: Tensor     # () of those, pairs the rollout recorded (comparable)
    num_mismatched_pairs: Tensor   # () recorded pairs whose k experts differ as a set from the trainer router's
    slots_per_expert: Tensor       # (L, E) token slots sent to each expert (the experts used)
    entropy_sum: Tensor            # () router entropy (nats) summed over valid pairs


def routing_statistics(router_logits: Tensor, expert_ids: Tensor, router_ids: Tensor, recorded_ids: Tensor | None,
                       num_experts: int, valid: Tensor) -> RoutingStatistics:
    """router_logits (L, M, E); expert_ids (M, L, k) the experts used; router_ids (M, L, k) the trainer router's own
    top-k; recorded_ids (M, L, k) the rollout's record (ids >= num_experts: not recorded) or None; valid (M,)."""
    with torch.no_grad():
        valid = valid.bool()
        num_layers = router_logits.shape[0]
        probabilities = torch.softmax(router_logits.float(), dim=-1)  # (L, M, E)
        entropy = -(probabilities * torch.log(probabilities.clamp_min(1e-30))).sum(-1)  # (L, M)
        chosen = torch.nn.functional.one_hot(expert_ids.long(), num_experts).sum(dim=2)  # (M, L, E)
        slots = (chosen * valid[:, None, None]).sum(dim=0).float()  # (L, E)
        num_pairs = valid.sum() * num_layers
        if recorded_ids is None:
            recorded = torch.zeros_like(valid)[:, None].expand(-1, num_layers)
            mismatched = recorded
        else:
            recorded_ids = recorded_ids.long()
            recorded = (recorded_ids < num_experts).all(dim=-1) & valid[:, None]  # (M, L)
            mismatched = (recorded_ids.sort(dim=-1).values != router_ids.long().sort(dim=-1).values).any(-1) & recorded
        return RoutingStatistics(num_pairs.float(), recorded.sum().float(), mismatched.sum().float(), slots,
                                 (entropy.T * valid[:, None]).sum())


def balance_coefficient(slots_per_expert: Tensor) -> Tensor:
    """slots_per_expert (L, E) -> () E * sum_e f_e^2 averaged over layers, f_e the fraction of a layer's slots
    at expert e: 1 when every expert gets the same load, E when one expert gets all of it."""
    fractions = slots_per_expert / slots_per_expert.sum(dim=-1, keepdim=True).clamp_min(1)
    return (slots_per_expert.shape[-1] * (fractions ** 2).sum(-1)).mean()
