"""The configuration of our transformer, read from and written to HF `config.json` dicts.

One `TransformerConfig` describes Llama (1/2/3/3.x), Qwen2 / Qwen2.5 and Qwen3 dense models, and the
mixture-of-experts families Qwen3-MoE and Mixtral. The families differ only in flags: Qwen2 always has a
q/k/v bias, Qwen3 and Qwen3-MoE have per-head q/k RMSNorm, Llama 3 may scale RoPE frequencies, and the MoE
families replace every layer's MLP by `num_experts` expert MLPs of width `moe_intermediate_size`, of which
a router picks `num_experts_per_tok` per token (`models/moe.py`). `from_hf_dict` accepts both RoPE spellings used by `transformers` (top-level `rope_theta`
+ `rope_scaling` in 4.x files, `rope_parameters` in 5.x files); `to_hf_dict` writes both so that either
major version loads the folder.

    config = TransformerConfig.from_hf_dict(json.load(open("config.json")), source="folder/config.json")
    json.dump(config.to_hf_dict(kind="causal_lm", dtype=torch.bfloat16), open("config.json", "w"))
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

FAMILIES = ("llama", "qwen2", "qwen3", "qwen3_moe", "mixtral")
MOE_FAMILIES = ("qwen3_moe", "mixtral")
QK_NORM_FAMILIES = ("qwen3", "qwen3_moe")
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
    ("qwen3_moe", "causal_lm"): "Qwen3MoeForCausalLM",
    ("qwen3_moe", "value"): "Qwen3MoeForTokenClassification",
    ("qwen3_moe", "reward"): "Qwen3MoeForSequenceClassification",
    ("mixtral", "causal_lm"): "MixtralForCausalLM",
    ("mixtral", "value"): "MixtralForTokenClassification",
    ("mixtral", "reward"): "MixtralForSequenceClassification",
}
SUPPORTED_ROPE_TYPES = ("default", "llama3")
LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")

# Defaults `transformers` applies when config.json omits a key; keeping the same ones means a minimal
# config.json means the same model to us and to `transformers`.
DEFAULT_ROPE_THETA = 10000.0
DEFAULT_RMS_NORM_EPS = 1e-6
QWEN3_DEFAULT_HEAD_DIM = 128
# `transformers`' defaults of the MoE keys (Qwen3MoeConfig, MixtralConfig).
DEFAULT_ROUTER_AUX_LOSS_COEF = 0.001
QWEN3_MOE_DEFAULT_NUM_EXPERTS = 128
QWEN3_MOE_DEFAULT_EXPERTS_PER_TOKEN = 8
QWEN3_MOE_DEFAULT_EXPERT_SIZE = 768
MIXTRAL_DEFAULT_NUM_EXPERTS = 8
MIXTRAL_DEFAULT_EXPERTS_PER_TOKEN = 2


@dataclasses.dataclass
class TransformerConfig:
    """Shape and flavour of a decoder-only transformer (Llama / Qwen2 / Qwen2.5 / Qwen3; Qwen3-MoE / Mixtral)."""

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
    # Mixture of experts (0 experts: a dense model). Every layer is sparse: `num_experts` SwiGLU experts of
    # width `moe_intermediate_size`, a router (Linear(hidden, num_experts), no bias) that picks
    # `num_experts_per_tok` of them per token by softmax probability, their outputs summed with those
    # probabilities, renormalised over the chosen ones when `norm_topk_prob` (always for Mixtral).
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    router_aux_loss_coef: float = 0.0  # the load-balancing loss weight config.json gives (actor.router_aux_loss_coef's default)

    def __post_init__(self) -> None:
        self.validate()

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

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
        if self.use_qk_norm != (self.model_type in QK_NORM_FAMILIES):
            raise ValueError(
                f"use_qk_norm must be True exactly for model_type in {QK_NORM_FAMILIES}, got use_qk_norm="
                f"{self.use_qk_norm} with model_type {self.model_type!r}")
        if self.rope_scaling is not None:
            _check_llama3_scaling(self.rope_scaling, "rope_scaling")
        self._validate_experts()

    def _validate_experts(self) -> None:
        if self.model_type not in MOE_FAMILIES:
            if self.is_moe:
                raise ValueError(f"num_experts must be 0 for the dense model_type {self.model_type!r}, got "
                                 f"{self.num_experts}; mixture-of-experts families: {MOE_FAMILIES}")
            return
        for key in ("num_experts", "num_experts_per_tok", "moe_intermediate_size"):
            value = getattr(self, key)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{key} must be a positive integer for model_type {self.model_type!r}, got {value!r}")
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(f"num_experts_per_tok must be at most num_experts, got {self.num_experts_per_tok} and "
                             f"{self.num_experts}")
        if self.model_type == "mixtral" and not self.norm_topk_prob:
            raise ValueError("norm_topk_prob must be True for model_type 'mixtral' (Mixtral renormalises the chosen "
                             "experts' probabilities)")
        if self.model_type == "mixtral" and self.attention_bias:
            raise ValueError("attention_bias must be False for model_type 'mixtral'")
        if self.router_aux_loss_coef < 0:
            raise ValueError(f"router_aux_loss_coef must be >= 0, got {self.router_aux_loss_coef}")

    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any], source: str = "config.json") -> TransformerConfig:
        """Reads an HF config.json dict; `source` names the file in error messages."""
        model_type, _ = architecture_of(hf, source)
        _reject_unsupported_features(hf, model_type, source)
        num_attention_heads = _require(hf, "num_attention_heads", source)
        hidden_size = _require(hf, "hidden_size", source)
        # Qwen3's config class defaults head_dim to 128; Qwen3-MoE's has no such field (hidden / heads).
        default_head_dim = QWEN3_DEFAULT_HEAD_DIM if model_type == "qwen3" else hidden_size // num_attention_heads
        rope_theta, rope_scaling = _read_rope(hf, source)
        num_key_value_heads = hf.get("num_key_value_heads")
        experts = _read_experts(hf, model_type, source)
        try:
            return cls(
                model_type=model_type,
                vocab_size=_require(hf, "vocab_size", source),
                hidden_size=hidden_size,
                intermediate_size=_require(hf, "intermediate_size", source) if model_type != "qwen3_moe"
                else hf.get("intermediate_size", 6144),
                num_hidden_layers=_require(hf, "num_hidden_layers", source),
                num_attention_heads=num_attention_heads,
                num_key_value_heads=num_key_value_heads or num_attention_heads,
                head_dim=hf.get("head_dim") or default_head_dim,
                rms_norm_eps=float(hf.get("rms_norm_eps", DEFAULT_RMS_NORM_EPS)),
                rope_theta=rope_theta,
                rope_scaling=rope_scaling,
                max_position_embeddings=hf.get("max_position_embeddings", 2048),
                attention_bias=True if model_type == "qwen2" else bool(hf.get("attention_bias", False)),
                use_qk_norm=model_type in QK_NORM_FAMILIES,
                tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
                bos_token_id=hf.get("bos_token_id"),
                eos_token_id=hf.get("eos_token_id"),
                pad_token_id=hf.get("pad_token_id"),
                **experts,
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
        elif self.model_type in ("qwen2", "qwen3"):
            hf.update(use_sliding_window=False, sliding_window=None, max_window_layers=self.num_hidden_layers,
                      layer_types=["full_attention"] * self.num_hidden_layers)
        if self.model_type in QK_NORM_FAMILIES:
            hf["attention_bias"] = self.attention_bias
        hf.update(self._experts_hf_dict())
        if kind in ("value", "reward"):
            hf.update(id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
        return hf


    def _experts_hf_dict(self) -> dict[str, Any]:
        """The MoE keys in each family's own spelling (Qwen3-MoE's hub files say num_experts, Mixtral's
        num_local_experts; Mixtral's intermediate_size is its experts' width)."""
        shared = {"num_experts_per_tok": self.num_experts_per_tok, "router_aux_loss_coef": self.router_aux_loss_coef,
                  "output_router_logits": False}
        if self.model_type == "qwen3_moe":
            return {**shared, "num_experts": self.num_experts, "moe_intermediate_size": self.moe_intermediate_size,
                    "norm_topk_prob": self.norm_topk_prob, "decoder_sparse_step": 1, "mlp_only_layers": [],
                    "use_sliding_window": False, "sliding_window": None}
        if self.model_type == "mixtral":
            return {**shared, "num_local_experts": self.num_experts, "intermediate_size": self.moe_intermediate_size,
                    "router_jitter_noise": 0.0, "sliding_window": None}
        return {}


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
                f"(Llama / Qwen2 / Qwen2.5 / Qwen3, Qwen3-MoE / Mixtral; no sliding window)")
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


def _read_experts(hf: dict[str, Any], model_type: str, source: str) -> dict[str, Any]:
    """The MoE fields of a Qwen3-MoE or Mixtral config.json ({} for a dense family), with `transformers`'
    defaults for absent keys."""
    if model_type == "qwen3_moe":
        return dict(num_experts=hf.get("num_experts", hf.get("num_local_experts", QWEN3_MOE_DEFAULT_NUM_EXPERTS)),
                    num_experts_per_tok=hf.get("num_experts_per_tok", QWEN3_MOE_DEFAULT_EXPERTS_PER_TOKEN),
                    moe_intermediate_size=hf.get("moe_intermediate_size", QWEN3_MOE_DEFAULT_EXPERT_SIZE),
                    norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
                    router_aux_loss_coef=float(hf.get("router_aux_loss_coef", DEFAULT_ROUTER_AUX_LOSS_COEF)))
    if model_type == "mixtral":
        return dict(num_experts=hf.get("num_local_experts", MIXTRAL_DEFAULT_NUM_EXPERTS),
                    num_experts_per_tok=hf.get("num_experts_per_tok", MIXTRAL_DEFAULT_EXPERTS_PER_TOKEN),
                    moe_intermediate_size=_require(hf, "intermediate_size", source), norm_topk_prob=True,
                    router_aux_loss_coef=float(hf.get("router_aux_loss_coef", DEFAULT_ROUTER_AUX_LOSS_COEF)))
    return {}


def _reject_unsupported_features(hf: dict[str, Any], model_type: str, source: str) -> None:
    """Keys that would change the network in ways our transformer does not implement."""
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{source}: hidden_act={hf['hidden_act']!r} is not supported; supported: 'silu'")
    if hf.get("mlp_bias", False):
        raise ValueError(f"{source}: mlp_bias=True is not supported; supported: mlp_bias=False")
    if hf.get("use_sliding_window", False):
        raise ValueError(f"{source}: use_sliding_window=True is not supported; supported: full attention only")
    if model_type == "mixtral" and hf.get("sliding_window") is not None:
        raise ValueError(f"{source}: sliding_window={hf['sliding_window']} is not supported; supported: "
                         f"sliding_window=null (full attention only)")
    if model_type == "qwen3_moe" and (hf.get("decoder_sparse_step", 1) != 1 or hf.get("mlp_only_layers")):
        raise ValueError(f"{source}: decoder_sparse_step={hf.get('decoder_sparse_step', 1)}, mlp_only_layers="
                         f"{hf.get('mlp_only_layers')} (dense layers between sparse ones) is not supported; "
                         f"supported: every layer sparse (decoder_sparse_step=1, mlp_only_layers=[])")
    for key in ("num_experts", "num_local_experts", "moe_intermediate_size"):
        if model_type not in MOE_FAMILIES and hf.get(key):
            raise ValueError(f"{source}: {key}={hf[key]} (mixture of experts) is not supported for model_type "
                             f"{model_type!r}; mixture-of-experts families: {list(MOE_FAMILIES)}")
    if hf.get("router_jitter_noise", 0.0):
        raise ValueError(f"{source}: router_jitter_noise={hf['router_jitter_noise']} is not supported; supported: "
                         f"0.0 (routing noise would break the rollout/trainer agreement routing replay relies on)")
    layer_types = hf.get("layer_types") or []
    if any(layer_type != "full_attention" for layer_type in layer_types):
        raise ValueError(f"{source}: layer_types={layer_types} is not supported; supported: 'full_attention' only")


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
