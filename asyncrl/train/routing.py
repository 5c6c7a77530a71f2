"""Mixture-of-experts routing in the trainer's forward: replay of the rollout's experts, the load-balancing loss
and the routing metrics of one micro-batch.

    routing = trainer_routing(model, micro, replay=spec.routing_replay)   # None for a dense model
    log_probs, entropy = response_log_probs(model, micro, temperature, True, token_index, routing)
    terms = router_terms(routing, micro, model.config.num_experts)
    loss = policy_loss + coef * terms.aux_loss * rows / num_seqs;  terms.record(sums, log_probs, micro)

With replay the forward uses `micro.routed_experts` (the engine's experts per input token and layer) where they
were recorded and routes a token itself where not (a prompt token of a backend that records nothing, a tool
token, padding). The trainer's router still computes its probabilities, which weight the replayed experts, so
the router trains. The routing mismatch rate compares the trainer router's own top-k with the record, with or
without replay: it says how often replay changes the forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from asyncrl.algos import RoutingStatistics, balance_coefficient, load_balancing_loss, routing_statistics
from asyncrl.models import CausalLM
from asyncrl.models.routing import Routing
from asyncrl.train.batch import TrainBatch
from asyncrl.train.metric_sums import MetricSums


def trainer_routing(model: CausalLM, batch: TrainBatch, replay: bool) -> Routing | None:
    """The routing record of one forward of an MoE `model` over `batch` (replaying its `routed_experts` when
    `replay` and the batch has them); None for a dense model."""
    if not model.config.is_moe:
        return None
    return Routing(replay_ids=batch.routed_experts if replay else None, keep_logits=True)


def token_mask(batch: TrainBatch) -> Tensor:
    """(B * T,) bool: the input positions that hold a prompt or response token (not padding)."""
    columns = torch.arange(batch.input_ids.shape[1], device=batch.input_ids.device)
    return (columns[None, :] < (batch.prompt_lengths + batch.response_lengths)[:, None]).reshape(-1)


@dataclass
class RouterTerms:
    aux_loss: Tensor                 # () load-balancing loss over the micro-batch's tokens (with autograd)
    statistics: RoutingStatistics

    def record(self, sums: MetricSums, log_probs: Tensor, batch: TrainBatch, num_rows: int) -> None:
        """Adds the routing metrics (`actor/moe/...` once finished) and the log-prob mismatch with the rollout."""
        stats = self.statistics
        sums.add_token_mean("moe/aux_loss", self.aux_loss.detach(), num_rows)
        sums.add_token_mean("moe/routing_mismatch_rate", stats.num_mismatched_pairs
                            / stats.num_recorded_pairs.clamp_min(1), stats.num_recorded_pairs)
        sums.add_token_mean("moe/recorded_fraction", stats.num_recorded_pairs / stats.num_pairs.clamp_min(1),
                            stats.num_pairs)
        sums.add_token_mean("moe/router_entropy", stats.entropy_sum / stats.num_pairs.clamp_min(1), stats.num_pairs)
        slots = stats.slots_per_expert  # (L, E)
        fractions = slots / slots.sum(-1, keepdim=True).clamp_min(1)
        sums.add_token_mean("moe/balance_coefficient", balance_coefficient(slots), stats.num_pairs)
        sums.add_token_mean("moe/expert_load_max", fractions.max(-1).values.mean(), stats.num_pairs)
        sums.add_token_mean("moe/expert_load_min", fractions.min(-1).values.mean(), stats.num_pairs)
        if batch.rollout_log_probs is not None:
            mask = batch.response_mask > 0
            difference = (log_probs.detach() - batch.rollout_log_probs).abs()
            num_tokens = mask.sum()
            sums.add_token_mean("moe/rollout_log_prob_abs_diff", difference[mask].sum() / num_tokens.clamp_min(1),
                                num_tokens)


def router_terms(routing: Routing, batch: TrainBatch, num_experts: int) -> RouterTerms:
    """The load-balancing loss and routing statistics of a forward that filled `routing`."""
    valid = token_mask(batch)
    router_logits = routing.stacked_router_logits()  # (L, M, E)
    expert_ids = routing.stacked_expert_ids()  # (M, L, k)
    recorded = None
    if batch.routed_experts is not None:
        recorded = batch.routed_experts.reshape(-1, *batch.routed_experts.shape[2:])
    statistics = routing_statistics(router_logits, expert_ids, routing.stacked_router_ids(), recorded, num_experts,
                                    valid)
    return RouterTerms(load_balancing_loss(router_logits, expert_ids, num_experts, valid), statistics)
