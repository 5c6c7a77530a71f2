"""Tiny reward models and judges for the tests, built here (no download), each encoding a known preference.

- `build_brevity_reward_model`: a *ForSequenceClassification folder whose weights are set by hand so that its
  score falls with the fraction of digits in the conversation: for one prompt, every digit more in the
  response lowers it, so it prefers shorter answers on the arithmetic task.
- `build_brevity_judge`: a causal LM judge, set by hand the same way, whose greedy answer is "1" for a response of
  at most 3 digits and "0" for a longer one (the warm policy's stutter, "122" -> "1222", makes them longer).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from asyncrl.models import CausalLM, RewardModel, save_char_tokenizer, save_model, tiny_config
from asyncrl.models.tokenizer import build_char_tokenizer

CONSTANT, DIGIT, FRACTION = 0, 1, 2    # residual channels of the hand-set models
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
        set_digit_fraction_layer(model.model, vocabulary)
        model.score.weight[0, FRACTION] = -SCORE_SCALE
    save_model(model, folder)
    save_char_tokenizer(folder, model_max_length=config.max_position_embeddings)
    return folder


def set_digit_fraction_layer(backbone: torch.nn.Module, vocabulary: dict[str, int]) -> None:
    """Embeddings: a constant channel, and a digit indicator. Layer 0's attention has zero queries and keys, so
    it averages its values over the prefix; its value is the digit indicator, written into the fraction
    channel. At each position the residual then holds the fraction of digits up to it."""
    embedding = backbone.embed_tokens.weight
    embedding[:, CONSTANT] = 1.0
    for digit in "0123456789":
        embedding[vocabulary[digit], DIGIT] = 1.0
    attention = backbone.layers[0].self_attn
    attention.v_proj.weight[0, DIGIT] = VALUE_SCALE          # kv head 0, dimension 0: the digit indicator
    attention.o_proj.weight[FRACTION, 0] = 1.0               # query head 0 (on kv head 0), dimension 0


def build_brevity_judge(folder: Path, max_digits: int = 3) -> Path:
    """A causal LM judge with hand-set weights: asked `JUDGE_TEMPLATE` about a response, its greedy first token
    is "1" when the response has at most `max_digits` digits and "0" otherwise. The same one-layer digit-fraction
    feature as `build_brevity_reward_model`, read by the LM head: the "1" logit is proportional to (threshold -
    fraction), the "0" logit to its negative, every other logit 0. The judge's user turn
    '<|user|>{response}<|assistant|>' holds r digits of r + 2 tokens; the threshold sits between r = max_digits
    and max_digits + 1."""
    config = tiny_config("qwen2", hidden_size=64, num_layers=1, num_heads=4, num_kv_heads=2,
                         max_position_embeddings=64, tie_word_embeddings=False)
    model = CausalLM(config)
    vocabulary = build_char_tokenizer().get_vocab()
    fractions = [digits / (digits + 2) for digits in (max_digits, max_digits + 1)]
    # The fraction channel after the layer holds VALUE_SCALE x (normalised digit indicator) x fraction.
    threshold = VALUE_SCALE * math.sqrt(config.hidden_size / 2) * sum(fractions) / 2
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.fill_(1.0 if name.endswith("norm.weight") else 0.0)
        set_digit_fraction_layer(model.model, vocabulary)
        model.lm_head.weight[vocabulary["1"], CONSTANT] = SCORE_SCALE * threshold
        model.lm_head.weight[vocabulary["1"], FRACTION] = -SCORE_SCALE
        model.lm_head.weight[vocabulary["0"]] = -model.lm_head.weight[vocabulary["1"]]
    save_model(model, folder)
    save_char_tokenizer(folder, model_max_length=config.max_position_embeddings)
    return folder
