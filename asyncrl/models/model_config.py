"""The configuration of our dense transformer, read from and written to HF `config.json` dicts.

One `TransformerConfig` describes Llama (1/2/3/3.x), Qwen2 / Qwen2.5 and Qwen3 dense models. The families
differ only in flags: Qwen2 always has a q/k/v bias, Qwen3 has per-head q/k RMSNorm, Llama 3 may scale
RoPE frequencies. `from_hf_dict` accepts both RoPE spellings used by `transformers` (top-level `rope_theta`
+ `rope_scaling` in 4.x files, `rope_parameters` in 5.x files); `to_hf_dict` writes both so that either
major version loads the folder.

    config = TransformerConfig.from_hf_dict(json.load(open("config.json")), source="folder/config.json")
    json.dump(config.to_hf_dict(kind="causal_lm", dtype=torch.bfloat16), open("config.json", "w"))
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

FAMILIES = ("llama", "qwen2", "qwen3")
MODEL_KINDS = ("causal_lm", "value", "reward")

# HF class names by (family, kind); a value model is HF's `*ForTokenClassification` with num_labels=1, a reward
# model its `*ForSequenceClassification` with num_labels=1.
ARCHITECTURES = {
    ("llama", "causal_lm"): "LlamaForCausalLM",
    ("qwen2", "causal_lm"): "Qwen2ForCausalLM",
    ("qwen3", "causal_lm"): "Qwen3ForCausalLM",
    ("llama", "value"): "LlamaForTokenClassification",
    ("qwen2", "value"): "Qwen2ForTokenClassification",
    ("qwen3", "value"): "Qwen3ForTokenClassification",
    ("llama", "reward"): "LlamaForSequenceClassification",
    ("qwen2", "reward"): "Qwen2ForSequenceClassification",
    ("qwen3", "reward"): "Qwen3ForSequenceClassification",
}
SUPPORTED_ROPE_TYPES = ("default", "llama3")
LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")

# Defaults `transformers` applies when config.json omits a key; keeping the same ones means a minimal
# config.json means the same model to us and to `transformers`.
DEFAULT_ROPE_THETA = 10000.0
DEFAULT_RMS_NORM_EPS = 1e-6
QWEN3_DEFAULT_HEAD_DIM = 128


@dataclasses.dataclass
class TransformerConfig:
    """Shape and flavour of a dense decoder-only transformer (Llama / Qwen2 / Qwen2.5 / Qwen3)."""

    model_type: str  # one of FAMILIES
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = DEFAULT_RMS_NORM_EPS
    rope_theta: float = DEFAULT_ROPE_THETA
    # None, or Llama-3 scaling: {"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
    # "original_max_position_embeddings"}.
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 2048
    # q/k/v projections carry a bias. Qwen2 always does; for Llama and Qwen3 `transformers` then also puts
    # a bias on o_proj (see `output_bias`).
    attention_bias: bool = False
    use_qk_norm: bool = False  # per-head RMSNorm on q and k before RoPE (Qwen3)
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        self.validate()

    @property
    def output_bias(self) -> bool:
        """Whether o_proj has a bias: `transformers` ties it to attention_bias for Llama/Qwen3, never for Qwen2."""
        return self.attention_bias and self.model_type != "qwen2"

    @property
    def eos_token_ids(self) -> list[int]:
        """All end-of-sequence ids (Llama 3 instruct lists several)."""
        if self.eos_token_id is None:
            return []
        if isinstance(self.eos_token_id, int):
            return [self.eos_token_id]
        return list(self.eos_token_id)

    def validate(self) -> None:
        """Raises ValueError naming the key and value of the first broken invariant."""
        if self.model_type not in FAMILIES:
            raise ValueError(f"model_type must be one of {FAMILIES}, got {self.model_type!r}")
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, key)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{key} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"num_key_value_heads must divide num_attention_heads, got "
                f"{self.num_key_value_heads} and {self.num_attention_heads}")
        if self.head_dim % 2 != 0:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.rms_norm_eps <= 0 or self.rope_theta <= 0:
            raise ValueError(
                f"rms_norm_eps and rope_theta must be positive, got {self.rms_norm_eps} and {self.rope_theta}")
        if self.model_type == "qwen2" and not self.attention_bias:
            raise ValueError("attention_bias must be True for model_type 'qwen2' (Qwen2 always has a q/k/v bias)")
        if self.use_qk_norm != (self.model_type == "qwen3"):
            raise ValueError(
                f"use_qk_norm must be True exactly for model_type 'qwen3', got use_qk_norm={self.use_qk_norm} "
                f"with model_type {self.model_type!r}")
        if self.rope_scaling is not None:
            _check_llama3_scaling(self.rope_scaling, "rope_scaling")

    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any], source: str = "config.json") -> TransformerConfig:
        """Reads an HF config.json dict; `source` names the file in error messages."""
        model_type, _ = architecture_of(hf, source)
        _reject_unsupported_features(hf, source)
        num_attention_heads = _require(hf, "num_attention_heads", source)
        hidden_size = _require(hf, "hidden_size", source)
        default_head_dim = QWEN3_DEFAULT_HEAD_DIM if model_type == "qwen3" else hidden_size // num_attention_heads
        rope_theta, rope_scaling = _read_rope(hf, source)
        num_key_value_heads = hf.get("num_key_value_heads")
        try:
            return cls(
                model_type=model_type,
                vocab_size=_require(hf, "vocab_size", source),
                hidden_size=hidden_size,
                intermediate_size=_require(hf, "intermediate_size", source),
                num_hidden_layers=_require(hf, "num_hidden_layers", source),
                num_attention_heads=num_attention_heads,
                num_key_value_heads=num_key_value_heads or num_attention_heads,
                head_dim=hf.get("head_dim") or default_head_dim,
                rms_norm_eps=float(hf.get("rms_norm_eps", DEFAULT_RMS_NORM_EPS)),
                rope_theta=rope_theta,
                rope_scaling=rope_scaling,
                max_position_embeddings=hf.get("max_position_embeddings", 2048),
                attention_bias=True if model_type == "qwen2" else bool(hf.get("attention_bias", False)),
                use_qk_norm=model_type == "qwen3",
                tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
                bos_token_id=hf.get("bos_token_id"),
                eos_token_id=hf.get("eos_token_id"),
                pad_token_id=hf.get("pad_token_id"),
            )
        except ValueError as error:
            raise ValueError(f"{source}: {error}") from None

    def to_hf_dict(self, kind: str = "causal_lm", dtype: torch.dtype = torch.float32) -> dict[str, Any]:
        """The config.json dict `transformers` 4.x and 5.x load as `kind` ("causal_lm", "value" or "reward")."""
        if kind not in MODEL_KINDS:
            raise ValueError(f"kind must be one of {MODEL_KINDS}, got {kind!r}")
        rope_parameters = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling is not None:
            rope_parameters = {**self.rope_scaling, "rope_type": "llama3", "rope_theta": self.rope_theta}
        dtype_name = str(dtype).removeprefix("torch.")
        hf: dict[str, Any] = {
            "architectures": [ARCHITECTURES[(self.model_type, kind)]],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_parameters": rope_parameters,
            # 4.x readers take RoPE from these two keys instead of rope_parameters.
            "rope_theta": self.rope_theta,
            "rope_scaling": None if self.rope_scaling is None else dict(rope_parameters),
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id,
            "attention_dropout": 0.0,
            "initializer_range": 0.02,
            "dtype": dtype_name,
        }
        if self.model_type == "llama":
            hf.update(attention_bias=self.attention_bias, mlp_bias=False)
        else:
            hf.update(use_sliding_window=False, sliding_window=None, max_window_layers=self.num_hidden_layers,
                      layer_types=["full_attention"] * self.num_hidden_layers)
        if self.model_type == "qwen3":
            hf["attention_bias"] = self.attention_bias
        if kind in ("value", "reward"):
            hf.update(id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
        return hf


def architecture_of(hf: dict[str, Any], source: str = "config.json") -> tuple[str, str]:
    """(family, kind) of an HF config dict, from `architectures` (or `model_type` when that is absent)."""
    supported = sorted(ARCHITECTURES.values())
    architectures = hf.get("architectures") or []
    model_type = hf.get("model_type")
    if len(architectures) > 1:
        raise ValueError(f"{source}: architectures={architectures} lists several classes; expected one of {supported}")
    if architectures:
        by_name = {name: key for key, name in ARCHITECTURES.items()}
        if architectures[0] not in by_name:
            raise ValueError(
                f"{source}: architectures={architectures} is not supported; supported: {supported} "
                f"(dense Llama / Qwen2 / Qwen2.5 / Qwen3; no MoE, no sliding window)")
        family, kind = by_name[architectures[0]]
        if model_type is not None and model_type != family:
            raise ValueError(f"{source}: model_type={model_type!r} does not match architectures={architectures}")
        return family, kind
    if model_type not in FAMILIES:
        raise ValueError(f"{source}: model_type={model_type!r} is not supported; supported: {list(FAMILIES)}")
    return model_type, "causal_lm"


def _require(hf: dict[str, Any], key: str, source: str) -> Any:
    if key not in hf:
        raise ValueError(f"{source}: required key {key!r} is missing")
    return hf[key]


def _reject_unsupported_features(hf: dict[str, Any], source: str) -> None:
    """Keys that would change the network in ways our transformer does not implement."""
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{source}: hidden_act={hf['hidden_act']!r} is not supported; supported: 'silu'")
    if hf.get("mlp_bias", False):
        raise ValueError(f"{source}: mlp_bias=True is not supported; supported: mlp_bias=False")
    if hf.get("use_sliding_window", False):
        raise ValueError(f"{source}: use_sliding_window=True is not supported; supported: full attention only")
    layer_types = hf.get("layer_types") or []
    if any(layer_type != "full_attention" for layer_type in layer_types):
        raise ValueError(f"{source}: layer_types={layer_types} is not supported; supported: 'full_attention' only")
    for key in ("num_experts", "num_local_experts", "moe_intermediate_size"):
        if hf.get(key):
            raise ValueError(f"{source}: {key}={hf[key]} (mixture of experts) is not supported; dense models only")


def _read_rope(hf: dict[str, Any], source: str) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, llama3 scaling or None) from `rope_parameters` (5.x) or `rope_theta`/`rope_scaling` (4.x)."""
    key = "rope_parameters" if hf.get("rope_parameters") else "rope_scaling"
    parameters = dict(hf.get(key) or {})
    rope_theta = float(parameters.get("rope_theta", hf.get("rope_theta", DEFAULT_ROPE_THETA)))
    # 4.x files spell the type "type" in older checkpoints.
    rope_type = parameters.get("rope_type", parameters.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"{source}: {key}.rope_type={rope_type!r} is not supported; supported: {list(SUPPORTED_ROPE_TYPES)}")
    if parameters.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError(f"{source}: partial_rotary_factor != 1.0 is not supported")
    if rope_type == "default":
        return rope_theta, None
    parameters.setdefault("original_max_position_embeddings", hf.get("max_position_embeddings"))
    scaling = {"rope_type": "llama3"}
    scaling.update({name: parameters.get(name) for name in LLAMA3_ROPE_KEYS})
    _check_llama3_scaling(scaling, f"{source}: {key}")
    return rope_theta, scaling


def _check_llama3_scaling(scaling: dict[str, Any], where: str) -> None:
    if scaling.get("rope_type") != "llama3":
        raise ValueError(f"{where}.rope_type must be 'llama3', got {scaling.get('rope_type')!r}")
    for name in LLAMA3_ROPE_KEYS:
        value = scaling.get(name)
        if not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"{where}.{name} must be a positive number, got {value!r}")
    if scaling["high_freq_factor"] <= scaling["low_freq_factor"]:
        raise ValueError(
            f"{where}.high_freq_factor must exceed low_freq_factor, got "
            f"{scaling['high_freq_factor']} and {scaling['low_freq_factor']}")
