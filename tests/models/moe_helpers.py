"""Tiny mixture-of-experts folders made by `transformers`' own classes (random weights, norms included)."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from asyncrl.models.tokenizer import save_char_tokenizer

# One entry per MoE feature the HF comparison must cover: Qwen3-MoE's q/k norm and both of its top-k
# weightings (raw probabilities, renormalised), Mixtral's names and GQA.
MOE_CASES = {
    "qwen3_moe_raw_topk": dict(family="qwen3_moe", norm_topk_prob=False, tie_word_embeddings=False),
    "qwen3_moe_normalized_tied": dict(family="qwen3_moe", norm_topk_prob=True, tie_word_embeddings=True),
    "mixtral": dict(family="mixtral", tie_word_embeddings=False),
}


def transformers_config(family: str, norm_topk_prob: bool = True, tie_word_embeddings: bool = False,
                        vocab_size: int = 128) -> transformers.PretrainedConfig:
    shared = dict(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, num_experts_per_tok=2, tie_word_embeddings=tie_word_embeddings,
                  initializer_range=0.2, max_position_embeddings=256, pad_token_id=0, eos_token_id=1)
    if family == "qwen3_moe":
        return transformers.Qwen3MoeConfig(**shared, head_dim=8, intermediate_size=64, moe_intermediate_size=24,
                                           num_experts=4, norm_topk_prob=norm_topk_prob, rope_theta=1e6)
    return transformers.MixtralConfig(**shared, intermediate_size=24, num_local_experts=4)


def build_transformers_moe(folder: Path, case: str, seed: int = 0) -> Path:
    """An HF folder written by `save_pretrained` of a randomly initialised Qwen3MoeForCausalLM or
    MixtralForCausalLM (std 0.2, random norm weights), plus our character tokenizer."""
    torch.manual_seed(seed)
    config = transformers_config(**MOE_CASES[case])
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.copy_(1.0 + 0.3 * torch.randn(tuple(parameter.shape), generator=generator))
    model.save_pretrained(folder)
    save_char_tokenizer(folder)
    return folder
