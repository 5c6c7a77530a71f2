"""TransformerConfig <-> HF config.json dicts: round trips, both RoPE spellings, and error messages."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from asyncrl.models import TransformerConfig, tiny_config

from .helpers import LLAMA3_SCALING

# config.json of Qwen2.5-0.5B-Instruct (transformers 4.x era) and of Llama-3.2-1B-Instruct, as published.
QWEN25_HALF_B = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
    "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 21, "model_type": "qwen2",
    "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.1", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}
LLAMA32_1B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009], "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": False,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True,
    "vocab_size": 128256,
}


def test_reads_published_qwen25_config():
    config = TransformerConfig.from_hf_dict(QWEN25_HALF_B)
    assert (config.model_type, config.hidden_size, config.num_hidden_layers) == ("qwen2", 896, 24)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (14, 2, 64)
    assert config.rope_theta == 1e6 and config.rope_scaling is None
    assert config.attention_bias and not config.output_bias and not config.use_qk_norm
    assert config.tie_word_embeddings and config.eos_token_ids == [151645]


def test_reads_published_llama32_config_and_both_rope_spellings():
    config = TransformerConfig.from_hf_dict(LLAMA32_1B)
    assert config.rope_theta == 500000.0
    assert config.rope_scaling == {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    assert config.eos_token_ids == [128001, 128008, 128009]
    # transformers 5 spelling: everything inside rope_parameters.
    v5_style = {key: value for key, value in LLAMA32_1B.items() if key not in ("rope_scaling", "rope_theta")}
    v5_style["rope_parameters"] = {**LLAMA32_1B["rope_scaling"], "rope_theta": 500000.0}
    assert TransformerConfig.from_hf_dict(v5_style) == config
    # Older 4.x files name the type "type".
    legacy = {**LLAMA32_1B, "rope_scaling": {**LLAMA32_1B["rope_scaling"]}}
    legacy["rope_scaling"]["type"] = legacy["rope_scaling"].pop("rope_type")
    assert TransformerConfig.from_hf_dict(legacy) == config


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("rope_scaling", [None, LLAMA3_SCALING])
def test_round_trip_through_hf_dict(family, rope_scaling):
    config = tiny_config(family, rope_scaling=rope_scaling, tie_word_embeddings=family != "llama", head_dim=24)
    for kind in ("causal_lm", "value"):
        assert TransformerConfig.from_hf_dict(config.to_hf_dict(kind=kind)) == config


def test_hf_dict_names_architecture_and_dtype():
    hf = tiny_config("qwen3").to_hf_dict(kind="value", dtype=torch.bfloat16)
    assert hf["architectures"] == ["Qwen3ForTokenClassification"]
    assert hf["dtype"] == "bfloat16" and hf["id2label"] == {"0": "LABEL_0"}
    assert tiny_config("llama").to_hf_dict()["architectures"] == ["LlamaForCausalLM"]


def test_qwen3_defaults_head_dim_to_128_like_transformers():
    hf = tiny_config("qwen3").to_hf_dict()
    del hf["head_dim"]
    assert TransformerConfig.from_hf_dict(hf).head_dim == 128


@pytest.mark.parametrize("change, expected", [
    ({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3"}, r"architectures=\['DeepseekV3ForCausalLM'\] is not supported; supported: .*Qwen2ForCausalLM"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}}, r"rope_parameters.rope_type='yarn' is not supported; supported: \['default', 'llama3'\]"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}, "rope_parameters": None}, r"rope_scaling.rope_type='linear' is not supported"),
    ({"use_sliding_window": True}, r"use_sliding_window=True is not supported"),
    ({"num_key_value_heads": 3}, r"num_key_value_heads must divide num_attention_heads, got 3 and 4"),
    ({"hidden_act": "gelu"}, r"hidden_act='gelu' is not supported"),
    ({"num_experts": 8}, r"num_experts=8 \(mixture of experts\) is not supported"),
    ({"model_type": "llama"}, r"model_type='llama' does not match architectures=\['Qwen2ForCausalLM'\]"),
])
def test_unsupported_or_invalid_configs_name_the_key(change, expected):
    hf = {**tiny_config("qwen2").to_hf_dict(), **change}
    with pytest.raises(ValueError, match=expected) as error:
        TransformerConfig.from_hf_dict(hf, source="ckpt/config.json")
    assert str(error.value).startswith("ckpt/config.json")


def test_missing_required_key_is_named():
    hf = tiny_config("llama").to_hf_dict()
    del hf["hidden_size"]
    with pytest.raises(ValueError, match="required key 'hidden_size' is missing"):
        TransformerConfig.from_hf_dict(hf)


def test_direct_construction_validates_invariants():
    config = tiny_config("qwen2")
    with pytest.raises(ValueError, match="attention_bias must be True for model_type 'qwen2'"):
        dataclasses.replace(config, attention_bias=False)
    with pytest.raises(ValueError, match=r"use_qk_norm must be True exactly for model_type in \('qwen3', 'qwen3_moe'\)"):
        dataclasses.replace(config, use_qk_norm=True)
    with pytest.raises(ValueError, match="head_dim must be even for RoPE, got 15"):
        dataclasses.replace(config, head_dim=15)
    with pytest.raises(ValueError, match="rope_scaling.high_freq_factor must exceed low_freq_factor"):
        dataclasses.replace(config, rope_scaling={**LLAMA3_SCALING, "high_freq_factor": 1.0})
