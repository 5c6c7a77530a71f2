"""The training batch: padded tensors with documented shapes, passed between the core and trainer workers.

Layout. Row i holds one response: its prompt tokens, then its response tokens, left-aligned and
right-padded (`input_ids (B, T)`); `prompt_lengths[i]` and `response_lengths[i]` say where the parts
are. Per-response-token tensors are `(B, R)`, R = the longest response: column j of row i is response
token j, which sits at input position `prompt_lengths[i] + j`. The left-aligned layout lets the model
run plain causal attention (valid tokens never see the right padding), which is exact and, on GPU,
flash attention.

A mixture-of-experts rollout adds `routed_experts (B, T, L, k)`: per input token, layer and slot, the expert the
engine used (uint8 up to 254 experts, int16 beyond; the dtype's largest value marks a token it did not record,
e.g. padding), aligned with `input_ids` (see `asyncrl.models.routing`).

Fields stages add later are optional; a stage that needs one calls `batch.need("advantages", "update_actor")`
which fails with a message naming the stage that should have run first.

    batch = TrainBatch.from_sequences(prompts, responses, group_ids, pad_id)
    shards = batch.split(world_size)                   # data-parallel dispatch
    arrays = batch.to_numpy(); TrainBatch.from_numpy(arrays)   # across Ray: numpy pickles fast
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch
from torch import Tensor

# Fields laid out like input_ids (B, T, ...), cut and padded along T.
TOKEN_FIELDS = ("input_ids", "routed_experts")
OPTIONAL_RESPONSE_FIELDS = (
    "rollout_log_probs", "old_log_probs", "ref_log_probs", "values", "token_level_scores", "token_level_rewards",
    "advantages", "returns", "rollout_is_weights", "versions", "teacher_log_probs", "teacher_mask",
)


@dataclass
class TrainBatch:
    input_ids: Tensor                                # (B, T) int64: prompt then response, right-padded with 0
    prompt_lengths: Tensor                           # (B,) int64
    response_lengths: Tensor                         # (B,) int64
    response_mask: Tensor                            # (B, R) float32: 1 on response tokens that train
    group_ids: Tensor                                # (B,) int64: the responses of one prompt share an id
    rollout_log_probs: Optional[Tensor] = None       # (B, R) float32: log-probs the engine sampled with
    old_log_probs: Optional[Tensor] = None           # (B, R) float32: the PPO anchor (pi_old / pi_prox)
    ref_log_probs: Optional[Tensor] = None           # (B, R) float32: reference policy
    values: Optional[Tensor] = None                  # (B, R) float32: critic values
    token_level_scores: Optional[Tensor] = None      # (B, R) float32: reward on the last response token
    token_level_rewards: Optional[Tensor] = None     # (B, R) float32: scores minus the KL penalty
    advantages: Optional[Tensor] = None              # (B, R) float32
    returns: Optional[Tensor] = None                 # (B, R) float32
    rollout_is_weights: Optional[Tensor] = None      # (B, R) float32: off-policy importance weights
    versions: Optional[Tensor] = None                # (B, R) int64: policy version that sampled each token
    reward_baselines: Optional[Tensor] = None        # (B,) float32: reward of the prompt's greedy response (remax)
    routed_experts: Optional[Tensor] = None          # (B, T, L, k) uint8/int16: the rollout's experts per input token
    teacher_log_probs: Optional[Tensor] = None       # (B, R) float32: the distillation teacher's (0 where unscored)
    teacher_mask: Optional[Tensor] = None            # (B, R) float32: 1 on tokens the teacher scored

    def __post_init__(self) -> None:
        num_rows = self.input_ids.shape[0]
        for name in ("prompt_lengths", "response_lengths", "group_ids", "reward_baselines"):
            if getattr(self, name) is not None and getattr(self, name).shape != (num_rows,):
                raise ValueError(f"TrainBatch.{name} must have shape ({num_rows},), got {tuple(getattr(self, name).shape)}")
        response_shape = tuple(self.response_mask.shape)
        if response_shape[0] != num_rows:
            raise ValueError(f"TrainBatch.response_mask must have {num_rows} rows, got {response_shape}")
        for name in OPTIONAL_RESPONSE_FIELDS:
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != response_shape:
                raise ValueError(f"TrainBatch.{name} must have shape {response_shape}, got {tuple(value.shape)}")
        if self.routed_experts is not None and (self.routed_experts.dim() != 4
                                                or self.routed_experts.shape[:2] != self.input_ids.shape):
            raise ValueError(f"TrainBatch.routed_experts must have shape ({num_rows}, {self.input_ids.shape[1]}, L, k),"
                             f" got {tuple(self.routed_experts.shape)}")

    @classmethod
    def from_sequences(cls, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
                       group_ids: Sequence[int], pad_id: int = 0) -> "TrainBatch":
        """Pack token-id lists; the response mask is 1 on every response token."""
        num_rows = len(prompts)
        prompt_lengths = torch.tensor([len(prompt) for prompt in prompts], dtype=torch.int64)
        response_lengths = torch.tensor([len(response) for response in responses], dtype=torch.int64)
        total = int((prompt_lengths + response_lengths).max())
        max_response = max(int(response_lengths.max()), 1)
        ids = np.full((num_rows, total), pad_id, dtype=np.int64)   # numpy: per-row writes cost less than torch's
        for row, (prompt, response) in enumerate(zip(prompts, responses)):
            ids[row, :len(prompt)] = prompt
            ids[row, len(prompt):len(prompt) + len(response)] = response
        input_ids = torch.from_numpy(ids)
        columns = torch.arange(max_response)
        response_mask = (columns[None, :] < response_lengths[:, None]).float()
        return cls(input_ids, prompt_lengths, response_lengths, response_mask,
                   torch.as_tensor(list(group_ids), dtype=torch.int64))

    @property
    def num_rows(self) -> int:
        return self.input_ids.shape[0]

    @property
    def max_response_length(self) -> int:
        return self.response_mask.shape[1]

    def response_positions(self) -> Tensor:
        """(B, R) input position of each response token (clamped inside the row for padding columns)."""
        columns = torch.arange(self.max_response_length, device=self.input_ids.device)
        positions = self.prompt_lengths[:, None] + columns[None, :]
        return positions.clamp(max=self.input_ids.shape[1] - 1)

    def response_ids(self) -> Tensor:
        """(B, R) response token ids (0 in padding columns)."""
        ids = torch.gather(self.input_ids, 1, self.response_positions())
        columns = torch.arange(self.max_response_length, device=ids.device)
        valid = columns[None, :] < self.response_lengths[:, None]
        return torch.where(valid, ids, torch.zeros_like(ids))

    def need(self, field_name: str, stage: str) -> Tensor:
        """The optional field, or an error naming the stage that needed it."""
        value = getattr(self, field_name)
        if value is None:
            raise ValueError(f"{stage} needs TrainBatch.{field_name}, which no earlier stage filled in")
        return value

    def replace(self, **changes: Tensor) -> "TrainBatch":
        return dataclasses.replace(self, **changes)

    def select(self, rows: Tensor | Sequence[int]) -> "TrainBatch":
        """The given rows, with T and R trimmed to what those rows need."""
        index = torch.as_tensor(rows, dtype=torch.int64)
        prompt_lengths = self.prompt_lengths[index]
        response_lengths = self.response_lengths[index]
        total = max(int((prompt_lengths + response_lengths).max()), 1) if len(index) else 1
        max_response = max(int(response_lengths.max()), 1) if len(index) else 1
        values = {}
        for field in dataclasses.fields(self):
            tensor = getattr(self, field.name)
            if tensor is None:
                values[field.name] = None
            elif field.name in TOKEN_FIELDS:
                values[field.name] = tensor[index, :total]
            elif tensor.dim() == 2:
                values[field.name] = tensor[index, :max_response]
            else:
                values[field.name] = tensor[index]
        return TrainBatch(**values)

    def split(self, num_parts: int) -> list["TrainBatch"]:
        """Consecutive, equally sized parts (the row count must divide)."""
        if self.num_rows % num_parts:
            raise ValueError(f"cannot split {self.num_rows} rows into {num_parts} equal parts")
        size = self.num_rows // num_parts
        return [self.select(range(part * size, (part + 1) * size)) for part in range(num_parts)]

    @classmethod
    def concat(cls, batches: Sequence["TrainBatch"]) -> "TrainBatch":
        total = max(batch.input_ids.shape[1] for batch in batches)
        max_response = max(batch.max_response_length for batch in batches)
        values = {}
        for field in dataclasses.fields(cls):
            parts = [getattr(batch, field.name) for batch in batches]
            if any(part is None for part in parts):
                if not all(part is None for part in parts):
                    raise ValueError(f"TrainBatch.concat: {field.name} is set in some batches only")
                values[field.name] = None
                continue
            if field.name in TOKEN_FIELDS:
                parts = [pad_tokens(part, total) for part in parts]
            elif parts[0].dim() == 2:
                parts = [pad_columns(part, max_response) for part in parts]
            values[field.name] = torch.cat(parts)
        return cls(**values)

    def to(self, device: torch.device | str) -> "TrainBatch":
        device = torch.device(device)
        values = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        return TrainBatch(**{name: None if value is None else move_tensor(value, device)
                             for name, value in values.items()})

    def to_numpy(self) -> dict[str, np.ndarray]:
        return {field.name: getattr(self, field.name).cpu().numpy() for field in dataclasses.fields(self)
                if getattr(self, field.name) is not None}

    @classmethod
    def from_numpy(cls, arrays: dict[str, np.ndarray]) -> "TrainBatch":
        # A copy: arrays from Ray are read-only views of its object store.
        return cls(**{name: torch.from_numpy(np.array(array)) for name, array in arrays.items()})


def move_tensor(tensor: Tensor, device: torch.device) -> Tensor:
    """Host to GPU through pinned memory, without waiting: a copy from pageable memory first waits for every
    kernel already queued (the previous micro-batch's backward), which would stall the host each micro-batch."""
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def pad_tokens(tensor: Tensor, width: int) -> Tensor:
    """Right-pad a token field (B, W, ...) to (B, width, ...): input ids with 0, routed experts with the mark of
    a token not recorded (the dtype's largest value)."""
    if tensor.shape[1] >= width:
        return tensor
    fill = 0 if tensor.dim() == 2 else torch.iinfo(tensor.dtype).max
    padding = tensor.new_full((tensor.shape[0], width - tensor.shape[1], *tensor.shape[2:]), fill)
    return torch.cat([tensor, padding], dim=1)


def pad_columns(tensor: Tensor, width: int) -> Tensor:
    """Right-pad a (B, W) tensor with zeros to (B, width)."""
    if tensor.shape[1] >= width:
        return tensor
    return torch.nn.functional.pad(tensor, (0, width - tensor.shape[1]))
