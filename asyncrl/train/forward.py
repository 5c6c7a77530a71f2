"""Forward passes over a (micro-)batch: per-response-token log-probs, entropies and values.

The token at input position p is predicted by the hidden state at p - 1, so response column j of row i
is read at position `prompt_lengths[i] + j - 1`. Log-probs use `log_softmax(logits / temperature)`, the
very distribution the engine samples from and reports. Only the valid response tokens (response_mask > 0) go
through the LM head, a chunk of tokens at a time (`lm_head.py`), so (B, R, V) logits never exist. The graphed
update's forward over packed micro-batches is `fast/packed_forward.py`.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from asyncrl.models import CausalLM, ValueModel
from asyncrl.models.routing import Routing
from asyncrl.train.batch import TrainBatch, move_tensor
from asyncrl.train.fast.selection import lm_head_kernels
from asyncrl.train.lm_head import token_log_probs_and_entropy
from asyncrl.train.micro_batches import micro_batches, scatter_rows


def dense_positions(input_ids: Tensor) -> Tensor:
    """(B, T) positions 0..T-1 of left-aligned rows."""
    return torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)


def predictor_positions(batch: TrainBatch) -> Tensor:
    """(B, R) position whose hidden state predicts each response token."""
    return batch.response_positions() - 1


def response_token_index(response_mask: Tensor) -> Tensor:
    """(N, 2) row and column of each response token that trains (response_mask > 0)."""
    return torch.nonzero(response_mask > 0)


def with_token_index(micro: TrainBatch, device: torch.device) -> tuple[TrainBatch, Tensor]:
    """The micro-batch on `device` and its `response_token_index`, found on the host, where the mask still
    is: `torch.nonzero` of a GPU tensor blocks the host until every queued kernel has run (the previous
    micro-batch's backward), so the GPU would idle while the host then queues this micro-batch's work."""
    return micro.to(device), move_tensor(response_token_index(micro.response_mask), device)


def response_log_probs(model: CausalLM, batch: TrainBatch, temperature: float, with_entropy: bool,
                       token_index: Optional[Tensor] = None,
                       routing: Optional[Routing] = None) -> tuple[Tensor, Optional[Tensor]]:
    """log-probs (B, R) of the response tokens (0 in padding columns) and, if asked, entropies (B, R).
    `token_index` is the batch's `response_token_index` when the caller has it (`with_token_index`). `routing`
    (MoE, `train/routing.py`): the experts to replay, and where the layers record theirs."""
    hidden = model(batch.input_ids, dense_positions(batch.input_ids), routing=routing)  # (B, T, H)
    if token_index is None:
        token_index = response_token_index(batch.response_mask)
    rows, columns = token_index.unbind(1)  # (N,) each
    positions = predictor_positions(batch)[rows, columns]  # (N,)
    token_log_probs, token_entropy = token_log_probs_and_entropy(
        hidden[rows, positions], model.lm_head.weight, batch.response_ids()[rows, columns], temperature,
        with_entropy, fused_kernels=lm_head_kernels(model, hidden.device))  # (N,) each
    shape = batch.response_mask.shape
    log_probs = token_log_probs.new_zeros(shape).index_put((rows, columns), token_log_probs)
    if token_entropy is None:
        return log_probs, None
    return log_probs, token_entropy.new_zeros(shape).index_put((rows, columns), token_entropy)


def response_values(model: ValueModel, batch: TrainBatch) -> Tensor:
    """Critic values (B, R) of the state before each response token (0 in padding columns)."""
    values = model(batch.input_ids, dense_positions(batch.input_ids))  # (B, T)
    values = torch.gather(values, 1, predictor_positions(batch))
    return torch.where(batch.response_mask > 0, values, torch.zeros_like(values))


@torch.no_grad()
def batched_log_probs(model: CausalLM, batch: TrainBatch, temperature: float, micro_batch_size: int,
                      max_tokens: Optional[int], with_entropy: bool, device: torch.device,
                      routing_replay: bool = False) -> tuple[Tensor, Optional[Tensor]]:
    """Log-probs (and entropies) (B, R) of a whole batch on the host, computed micro-batch by micro-batch;
    `routing_replay`: an MoE model uses the batch's `routed_experts`."""
    log_prob_parts, entropy_parts = [], []
    for rows, micro in micro_batches(batch, micro_batch_size, max_tokens, device):
        on_device, token_index = with_token_index(micro, device)
        routing = Routing(replay_ids=on_device.routed_experts) if routing_replay and model.config.is_moe else None
        log_probs, entropy = response_log_probs(model, on_device, temperature, with_entropy, token_index, routing)
        log_prob_parts.append((rows, log_probs))
        if entropy is not None:
            entropy_parts.append((rows, entropy))
    width = batch.max_response_length
    log_probs = scatter_rows(log_prob_parts, batch.num_rows, width)
    return log_probs, scatter_rows(entropy_parts, batch.num_rows, width) if with_entropy else None


@torch.no_grad()
def batched_values(model: ValueModel, batch: TrainBatch, micro_batch_size: int, max_tokens: Optional[int],
                   device: torch.device) -> Tensor:
    parts = [(rows, response_values(model, micro.to(device)))
             for rows, micro in micro_batches(batch, micro_batch_size, max_tokens, device)]
    return scatter_rows(parts, batch.num_rows, batch.max_response_length)
