"""A discriminative reward model: HF's `*ForSequenceClassification` with one label, on our transformer.

    model = load_model("Skywork-Reward-Llama-3.1-8B", kind="reward")    # or a folder save_pretrained wrote
    scores = model(input_ids, positions, lengths)                        # (B, T) right-padded -> (B,) fp32

The folder `transformers`' `AutoModelForSequenceClassification.save_pretrained` writes holds the backbone
(`model.*`) and a `score` head, Linear(hidden, num_labels, bias=False). The reward is the head's output at the
last real token of each row: `transformers` finds it as the rightmost token that is not the pad id; here each
row's length says it, so a pad id inside a text cannot move it.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from asyncrl.models.model_config import TransformerConfig
from asyncrl.models.transformer import TransformerModel


class RewardModel(nn.Module):
    """Backbone `.model` plus a `.score` head Linear(hidden, 1, bias=False), named as in `transformers`."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.model = TransformerModel(config)
        self.score = nn.Linear(config.hidden_size, 1, bias=False)
        self.is_compiled = False  # set by `compile_decoder_layers`

    def forward(self, input_ids: Tensor, positions: Tensor, lengths: Tensor) -> Tensor:
        """input_ids, positions (B, T), right-padded; lengths (B,) real tokens per row (>= 1) -> rewards (B,) fp32."""
        if lengths.shape != input_ids.shape[:1] or int(lengths.min()) < 1 or int(lengths.max()) > input_ids.shape[1]:
            raise ValueError(f"lengths must be (B,) = ({input_ids.shape[0]},) with values in [1, "
                             f"{input_ids.shape[1]}], got shape {tuple(lengths.shape)} and values {lengths.tolist()}")
        hidden = self.model(input_ids, positions)                                          # (B, T, hidden)
        last = hidden[torch.arange(hidden.shape[0], device=hidden.device), lengths.to(hidden.device) - 1]  # (B, hidden)
        return self.score(last).squeeze(-1).float()
