"""A discriminative reward model in this process: an HF *ForSequenceClassification folder, batches of samples in,
one score each.

    model = DiscriminativeRewardModel("my-rm", device="cpu", micro_batch_size=16)
    results = model.score([RewardRequest(data_source, response, ground_truth, extra_info, messages), ...])

The model sees what it was trained on: the conversation (the prompt's messages and the response as the
assistant's turn) through its own tokenizer's chat template, or "role: content" lines when the tokenizer has
none. The score is read at the last token (`asyncrl.models.RewardModel`); an input longer than `max_length`
keeps its last tokens, so the response and that token stay in it. `RewardModelWorker` serves one in a Ray actor.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from asyncrl.data.chat_template import plain_template
from asyncrl.models import RewardModel, load_model, load_tokenizer
from asyncrl.rewards.protocol import RewardRequest, RewardResult


def conversation_text(tokenizer: Any, request: RewardRequest) -> str:
    """The prompt's messages and the response as an assistant turn, in the tokenizer's chat template."""
    messages = [*request.messages, {"role": "assistant", "content": request.solution_str}]
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template(messages, tokenize=False)
    return plain_template(list(request.messages)) + request.solution_str


class DiscriminativeRewardModel:
    """A RewardModel and its tokenizer, scoring right-padded micro-batches without gradients."""

    def __init__(self, path: str, device: str = "cpu", dtype: torch.dtype = torch.float32,
                 micro_batch_size: int = 16, max_length: Optional[int] = None):
        self.model: RewardModel = load_model(path, dtype=dtype, device=device, kind="reward").eval()
        self.tokenizer = load_tokenizer(path)
        self.device = torch.device(device)
        self.micro_batch_size = micro_batch_size
        model_length = self.model.config.max_position_embeddings
        self.max_length = min(max_length or model_length, model_length)
        self.pad_id = self.model.config.pad_token_id or 0

    def encode(self, request: RewardRequest) -> list[int]:
        """The conversation's ids (the template placed the special tokens), its last `max_length` of them."""
        ids = self.tokenizer.encode(conversation_text(self.tokenizer, request), add_special_tokens=False)
        return list(ids[-self.max_length:])

    @torch.no_grad()
    def score(self, requests: Sequence[RewardRequest]) -> list[RewardResult]:
        encoded = [self.encode(request) for request in requests]
        scores: list[float] = []
        for start in range(0, len(encoded), self.micro_batch_size):
            scores.extend(self.score_ids(encoded[start:start + self.micro_batch_size]))
        return [RewardResult(score=score) for score in scores]

    def score_ids(self, rows: list[list[int]]) -> list[float]:
        """One forward pass over right-padded rows (each at least one token)."""
        lengths = torch.tensor([max(1, len(row)) for row in rows])
        input_ids = torch.full((len(rows), int(lengths.max())), self.pad_id, dtype=torch.long)
        for index, row in enumerate(rows):
            input_ids[index, :len(row)] = torch.tensor(row, dtype=torch.long)
        positions = torch.arange(input_ids.shape[1]).expand_as(input_ids)
        scores = self.model(input_ids.to(self.device), positions.to(self.device), lengths.to(self.device))  # (B,)
        return scores.cpu().tolist()
