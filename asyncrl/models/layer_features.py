"""What a model's decoder layer computes beyond the base layer, named, and what each fast path implements of it.

    layer_flags(config)                                   # {"q/k/v bias", "llama3 rope scaling"} for a Llama 3.1 with bias
    FUSED_DECODE_LAYERS.unsupported_reason(config)        # None, or why that fast path cannot run this model

The readable path (`transformer.py`, `layers.py`, `attention.py`) runs every family and flag. A fast path that
keeps its own copy of the layer's computation (the engine's fused decode layers) runs a model only where the
model's family and every one of its flags are on that path's allow-list, below: a family or a flag added later is
on no allow-list, so such a model runs the readable path until the fast path implements it and lists it here.
Every field of `TransformerConfig` is either a shape every path reads (`SHAPE_FIELDS`) or decides a flag
(`FLAG_FIELDS`): `tests/models/test_layer_features.py` fails on a field that is neither.
"""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.models.model_config import TransformerConfig

# Sizes, constants and token ids: every path reads them from the config, whatever their value.
SHAPE_FIELDS = frozenset({
    "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "max_position_embeddings", "bos_token_id",
    "eos_token_id", "pad_token_id", "tie_word_embeddings", "router_aux_loss_coef",
})
# The fields that decide the flags below.
FLAG_FIELDS = frozenset({"rope_scaling", "attention_bias", "use_qk_norm", "num_experts", "num_experts_per_tok",
                         "moe_intermediate_size", "norm_topk_prob"})


def layer_flags(config: TransformerConfig) -> frozenset[str]:
    """The computations of `config`'s decoder layer beyond the base one (RMSNorm, rotary attention with grouped
    K/V heads and no bias, a SwiGLU MLP)."""
    flags = {"q/k/v bias": config.attention_bias, "o_proj bias": config.output_bias,
             "per-head q/k norm": config.use_qk_norm, "llama3 rope scaling": config.rope_scaling is not None,
             "mixture of experts": config.is_moe,
             "renormalised top-k routing": config.is_moe and config.norm_topk_prob}
    return frozenset(name for name, is_on in flags.items() if is_on)


@dataclass(frozen=True)
class FastPathSupport:
    """A fast path's allow-list: the families and the layer flags it implements."""
    name: str
    families: frozenset[str]
    flags: frozenset[str]

    def unsupported_reason(self, config: TransformerConfig) -> str | None:
        """Why this path cannot run `config`'s layers (None: it can)."""
        if config.model_type not in self.families:
            return (f"{self.name} implement the {', '.join(sorted(self.families))} families, not "
                    f"{config.model_type}")
        missing = layer_flags(config) - self.flags
        if missing:
            return f"{self.name} do not implement {', '.join(sorted(missing))}"
        return None


# `engine/kernels/fused_decode.py`: four fused products per layer around the decode attention kernel, which rotates
# q and k with the model's own cos/sin tables (so any rotary scaling the model computes).
FUSED_DECODE_LAYERS = FastPathSupport("the fused decode layers", families=frozenset({"llama", "qwen2"}),
                                      flags=frozenset({"q/k/v bias", "llama3 rope scaling"}))
