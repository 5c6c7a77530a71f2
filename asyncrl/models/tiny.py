"""Tiny models for CPU tests and demos: a complete HF folder built from a config, no download needed.

    path = build_tiny_model("/tmp/tiny", family="qwen3", seed=0)   # config.json, model.safetensors,
    model = load_model(path)                                       # tokenizer files, generation_config.json

The weights are a deterministic function of (config, seed, init_std); the tokenizer is the character-level
one from `asyncrl.models.tokenizer`, and the vocabulary size defaults to its size, so every id decodes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from asyncrl.models.checkpoint_io import save_model
from asyncrl.models.model_config import (DEFAULT_ROUTER_AUX_LOSS_COEF, FAMILIES, MOE_FAMILIES, QK_NORM_FAMILIES,
                                         TransformerConfig)
from asyncrl.models.tokenizer import EOS_TOKEN, PAD_TOKEN, SPECIAL_TOKENS, char_vocab_size, save_char_tokenizer
from asyncrl.models.transformer import CausalLM


def tiny_config(family: str = "qwen2", vocab_size: int | None = None, hidden_size: int = 64, num_layers: int = 2,
                num_heads: int = 4, num_kv_heads: int = 2, intermediate_size: int | None = None,
                max_position_embeddings: int = 512, tie_word_embeddings: bool = True, rope_theta: float = 10000.0,
                rope_scaling: dict[str, Any] | None = None, attention_bias: bool | None = None,
                head_dim: int | None = None, num_experts: int = 4, num_experts_per_tok: int = 2,
                moe_intermediate_size: int | None = None, norm_topk_prob: bool = True,
                router_aux_loss_coef: float = DEFAULT_ROUTER_AUX_LOSS_COEF) -> TransformerConfig:
    """A small TransformerConfig of `family` (one of FAMILIES) with the character tokenizer's special ids.
    Defaults: vocab = the character tokenizer's size, intermediate = 4 * hidden, head_dim = hidden / heads,
    attention_bias = True only for qwen2 (which requires it). The MoE families ("qwen3_moe", "mixtral") get
    `num_experts` experts of width `moe_intermediate_size` (default: intermediate / num_experts_per_tok, so a
    token computes as much as in the dense model), `num_experts_per_tok` per token; the expert arguments are
    ignored for dense families."""
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    if hidden_size % num_heads != 0 and head_dim is None:
        raise ValueError(f"num_heads must divide hidden_size when head_dim is not given, got {num_heads} and {hidden_size}")
    intermediate = intermediate_size if intermediate_size is not None else 4 * hidden_size
    return TransformerConfig(
        model_type=family,
        vocab_size=vocab_size if vocab_size is not None else char_vocab_size(),
        hidden_size=hidden_size,
        intermediate_size=intermediate,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim if head_dim is not None else hidden_size // num_heads,
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        max_position_embeddings=max_position_embeddings,
        attention_bias=attention_bias if attention_bias is not None else family == "qwen2",
        use_qk_norm=family in QK_NORM_FAMILIES,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=None,
        eos_token_id=SPECIAL_TOKENS.index(EOS_TOKEN),
        pad_token_id=SPECIAL_TOKENS.index(PAD_TOKEN),
        **_experts(family, intermediate, num_experts, num_experts_per_tok, moe_intermediate_size, norm_topk_prob,
                   router_aux_loss_coef),
    )


def _experts(family: str, intermediate_size: int, num_experts: int, num_experts_per_tok: int,
             moe_intermediate_size: int | None, norm_topk_prob: bool, router_aux_loss_coef: float) -> dict[str, Any]:
    if family not in MOE_FAMILIES:
        return {}
    return dict(num_experts=num_experts, num_experts_per_tok=num_experts_per_tok,
                moe_intermediate_size=moe_intermediate_size or max(intermediate_size // num_experts_per_tok, 1),
                norm_topk_prob=norm_topk_prob or family == "mixtral", router_aux_loss_coef=router_aux_loss_coef)


def init_weights(model: nn.Module, seed: int, init_std: float = 0.02) -> None:
    """Deterministic init in parameter-name order: norm weights 1, everything else N(0, init_std^2).

    Draws on the CPU from one generator, so the result does not depend on the device or on global RNG state.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.fill_(1.0)
            else:
                values = torch.randn(tuple(parameter.shape), generator=generator) * init_std
                parameter.copy_(values)


def build_tiny_model(out_dir: str | Path, family: str = "qwen2", seed: int = 0, init_std: float = 0.02,
                     **overrides: Any) -> Path:
    """Writes a complete HF folder (config.json, model.safetensors, tokenizer files, generation_config.json)
    for a causal LM; `overrides` are `tiny_config` arguments. Returns the folder."""
    config = tiny_config(family, **overrides)
    if config.vocab_size < char_vocab_size():
        raise ValueError(f"vocab_size must be at least the tokenizer's {char_vocab_size()} tokens, got {config.vocab_size}")
    model = CausalLM(config)
    init_weights(model, seed, init_std)
    out_dir = Path(out_dir)
    save_model(model, out_dir)
    save_char_tokenizer(out_dir, model_max_length=config.max_position_embeddings)
    generation_config = {"eos_token_id": config.eos_token_id, "pad_token_id": config.pad_token_id}
    (out_dir / "generation_config.json").write_text(json.dumps(generation_config, indent=2) + "\n")
    return out_dir
