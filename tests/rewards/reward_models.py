"""Tiny reward models and judges for the tests, built here (no download), each encoding a known preference.

- `build_brevity_reward_model`: a *ForSequenceClassification folder whose weights are set by hand so that its
  score falls with the fraction of digits in the conversation: for one prompt, every digit more in the
  response lowers it, so it prefers shorter answers on the arithmetic task.
- `build_tail_judge`: a tiny causal LM taught by SFT to answer "1" when a response does not end with a repeated
  character (the warm policy's stutter, "122" -> "1222", always does) and "0" when it does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from asyncrl.models import RewardModel, build_tiny_model, save_char_tokenizer, save_model, tiny_config
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.train.sft import SFTSettings, run_sft

CONSTANT, DIGIT, FRACTION = 0, 1, 2    # residual channels of the hand-set reward model
VALUE_SCALE, SCORE_SCALE = 0.05, 10.0
JUDGE_TEMPLATE = "{response}"


def build_brevity_reward_model(folder: Path) -> Path:
    """One layer: attention with zero queries and keys averages its values over the prefix, and the values are
    the digit indicator, so at the last token the residual holds the fraction of digits in the conversation;
    the MLP adds nothing; the score head reads that channel with a negative weight. Every other weight is 0."""
    config = tiny_config("qwen2", hidden_size=64, num_layers=1, num_heads=4, num_kv_heads=2,
                         max_position_embeddings=64)
    model = RewardModel(config)
    vocabulary = build_char_tokenizer().get_vocab()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.fill_(1.0 if name.endswith("norm.weight") else 0.0)
        embedding = model.model.embed_tokens.weight
        embedding[:, CONSTANT] = 1.0
        for digit in "0123456789":
            embedding[vocabulary[digit], DIGIT] = 1.0
        attention = model.model.layers[0].self_attn
        attention.v_proj.weight[0, DIGIT] = VALUE_SCALE          # kv head 0, dimension 0: the digit indicator
        attention.o_proj.weight[FRACTION, 0] = 1.0               # query head 0 (on kv head 0), dimension 0
        model.score.weight[0, FRACTION] = -SCORE_SCALE
    save_model(model, folder)
    save_char_tokenizer(folder, model_max_length=config.max_position_embeddings)
    return folder


def is_preferred_by_judge(response: str) -> bool:
    return len(response) < 2 or response[-1] != response[-2]


def judge_examples(count: int, seed: int) -> list[str]:
    """Responses like the policy's: sums of two 2-digit numbers, half of them stuttered, and some short or
    random digit strings, so the judge has seen both answers on every kind of text."""
    rng = np.random.default_rng(seed)
    texts = []
    for _ in range(count):
        kind = rng.random()
        if kind < 0.7:
            text = str(int(rng.integers(20, 199)))
            text += text[-1] if rng.random() < 0.5 else ""
        else:
            text = "".join(rng.choice(list("0123456789"), size=int(rng.integers(1, 6))))
        texts.append(text)
    return texts


def build_tail_judge(root: Path, num_examples: int = 3000, epochs: float = 6.0) -> Path:
    """SFT of a tiny model on (JUDGE_TEMPLATE filled with a response) -> "1" / "0"; returns its folder."""
    rows = [{"data_source": "judge", "prompt": [{"role": "user", "content": JUDGE_TEMPLATE.format(response=text)}],
             "reward_model": {"style": "rule", "ground_truth": str(int(is_preferred_by_judge(text)))},
             "extra_info": {"answer": str(int(is_preferred_by_judge(text)))}}
            for text in judge_examples(num_examples, seed=0)]
    root.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(root / "judge_train.parquet")
    model = build_tiny_model(root / "judge_init", family="qwen2", seed=1, hidden_size=64, num_layers=2, num_heads=4,
                             num_kv_heads=2, max_position_embeddings=64)
    return run_sft(model, [str(root / "judge_train.parquet")], root / "judge", SFTSettings(epochs=epochs, seed=0))

