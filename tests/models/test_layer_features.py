"""The layer flags fast paths are checked against (`asyncrl/models/layer_features.py`): every field of the model
config is classified, so a new one cannot reach a fast path unnoticed, and each family's flags are what its layer
computes beyond the base one."""

from dataclasses import fields

import pytest

from asyncrl.models import FAMILIES, TransformerConfig
from asyncrl.models.layer_features import FLAG_FIELDS, FUSED_DECODE_LAYERS, SHAPE_FIELDS, layer_flags
from asyncrl.models.tiny import tiny_config


def test_every_model_config_field_is_a_shape_or_decides_a_flag():
    names = {field.name for field in fields(TransformerConfig)}
    assert not SHAPE_FIELDS & FLAG_FIELDS
    assert names - SHAPE_FIELDS - FLAG_FIELDS == set(), "classify the new field in asyncrl/models/layer_features.py"
    assert (SHAPE_FIELDS | FLAG_FIELDS) - names == set()


@pytest.mark.parametrize(("family", "overrides", "expected"), [
    ("llama", {}, set()),
    ("llama", {"attention_bias": True}, {"q/k/v bias", "o_proj bias"}),
    ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 128}},
     {"llama3 rope scaling"}),
    ("qwen2", {}, {"q/k/v bias"}),
    ("qwen3", {}, {"per-head q/k norm"}),
    ("qwen3_moe", {}, {"per-head q/k norm", "mixture of experts", "renormalised top-k routing"}),
    ("qwen3_moe", {"norm_topk_prob": False}, {"per-head q/k norm", "mixture of experts"}),
    ("mixtral", {}, {"mixture of experts", "renormalised top-k routing"}),
])
def test_each_family_has_the_flags_its_layer_computes(family, overrides, expected):
    assert layer_flags(tiny_config(family, **overrides)) == expected


def test_the_fused_decode_layers_run_only_listed_families_without_other_flags():
    runnable = {family for family in FAMILIES if FUSED_DECODE_LAYERS.unsupported_reason(tiny_config(family)) is None}
    assert runnable == {"llama", "qwen2"}
