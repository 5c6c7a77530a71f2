"""What the mixture-of-experts layers of one forward read and write: experts to replay, and the routing made.

    routing = Routing(replay_ids=recorded)          # (..., L, k) ids aligned with the tokens; None: route freely
    hidden = model(input_ids, positions, routing=routing)
    routing.stacked_expert_ids()                    # (M, L, k) int64: the experts each layer used, token by token
    routing.router_logits[layer]                    # (M, E): the router's logits (kept when keep_logits)

Routing replay: a recorded id list per token and layer replaces the router's own top-k choice, while the
router's probabilities are still computed and weight the chosen experts' outputs, so its weights keep
learning. An id >= num_experts means "not recorded": that token routes itself in that layer (a prompt
token no engine recorded, a tool token, padding). The compact dtypes of records (`routing_dtype`) hold
ids in uint8 up to 255 experts and int16 beyond; their largest value is the "not recorded" mark.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor


def routing_dtype(num_experts: int) -> np.dtype:
    """The smallest dtype that holds every expert id and a "not recorded" mark above them."""
    if num_experts < np.iinfo(np.uint8).max:
        return np.dtype(np.uint8)
    if num_experts < np.iinfo(np.int16).max:
        return np.dtype(np.int16)
    raise ValueError(f"num_experts={num_experts} does not fit the routing records (at most "
                     f"{np.iinfo(np.int16).max - 1} experts)")


def not_recorded(num_experts: int) -> int:
    """The id that marks a token-layer pair without a recorded choice, in `routing_dtype(num_experts)`."""
    return int(np.iinfo(routing_dtype(num_experts)).max)


class Routing:
    """One forward's routing: `replay_ids` (..., L, k) in the layout of the tokens (B, T or N), any integer
    dtype, ids >= num_experts route themselves; `keep_logits`: keep each layer's router logits (the
    load-balancing loss and the routing metrics read them). Filled per layer index, so a forward recomputed
    by activation checkpointing overwrites rather than appends.

    A plain class, not a dataclass: FSDP2 rebuilds dataclass (and dict) arguments of a forward when it casts their
    tensors, and the layers would then record into copies."""

    def __init__(self, replay_ids: Tensor | None = None, keep_logits: bool = False) -> None:
        self.replay_ids = replay_ids
        self.keep_logits = keep_logits
        self.expert_ids: dict[int, Tensor] = {}     # layer -> (M, k) int64, the experts used
        self.router_ids: dict[int, Tensor] = {}     # layer -> (M, k) int64, the router's own top-k
        self.router_logits: dict[int, Tensor] = {}  # layer -> (M, E), when keep_logits

    def replay_for(self, layer_index: int, num_tokens: int) -> Tensor | None:
        """(M, k) int64 recorded ids of one layer for the M tokens of the forward, or None."""
        if self.replay_ids is None:
            return None
        ids = self.replay_ids.reshape(num_tokens, *self.replay_ids.shape[-2:])  # (M, L, k)
        return ids[:, layer_index].long()

    def record(self, layer_index: int, expert_ids: Tensor, router_ids: Tensor, router_logits: Tensor) -> None:
        self.expert_ids[layer_index] = expert_ids
        self.router_ids[layer_index] = router_ids
        if self.keep_logits:
            self.router_logits[layer_index] = router_logits

    def stacked_expert_ids(self) -> Tensor:
        """(M, L, k) int64: the experts every MoE layer used for each token, layers in order."""
        return torch.stack([self.expert_ids[index] for index in sorted(self.expert_ids)], dim=1)

    def stacked_router_ids(self) -> Tensor:
        """(M, L, k) int64: the experts every MoE layer's router would pick (equal to the used ones without replay)."""
        return torch.stack([self.router_ids[index] for index in sorted(self.router_ids)], dim=1)

    def stacked_router_logits(self) -> Tensor:
        """(L, M, E) float32: every MoE layer's router logits."""
        return torch.stack([self.router_logits[index].float() for index in sorted(self.router_logits)])


def pack_routing_records(records: Sequence[np.ndarray | None], width: int) -> np.ndarray | None:
    """(B, width, L, k): each row's record (n, L, k) (an MoE engine's `routed_experts`) then the not-recorded mark;
    a row without a record (a trajectory, a backend that records nothing) is all marks. None when no row has one."""
    first = next((record for record in records if record is not None), None)
    if first is None:
        return None
    routed = np.full((len(records), width, *first.shape[1:]), np.iinfo(first.dtype).max, dtype=first.dtype)
    for row, record in enumerate(records):
        if record is not None:
            routed[row, :record.shape[0]] = record
    return routed
