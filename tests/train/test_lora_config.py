"""The model.lora_* keys: parsed in verl's vocabulary, turned into the adapters' spec, and refused before any
worker exists where a fast path would skip the adapters."""

from __future__ import annotations

import pytest

from asyncrl.config import ConfigError, load_config
from asyncrl.models.lora import PROJECTIONS, lora_spec


def test_lora_keys_become_the_adapter_spec():
    assert lora_spec(load_config(None, [])) is None  # lora_rank 0: no LoRA
    config = load_config(None, ["model.lora_rank=8", "model.lora_alpha=32", "model.target_modules=[q_proj,v_proj]",
                                "model.lora_init=kaiming", "model.lora_dropout=0.05", "trainer.seed=7"])
    spec = lora_spec(config)
    assert (spec.rank, spec.scale, spec.targets, spec.init, spec.dropout, spec.seed) == \
        (8, 4.0, ("q_proj", "v_proj"), "kaiming", 0.05, 7)
    assert lora_spec(load_config(None, ["model.lora_rank=4", "model.target_modules=all-linear"])).targets == PROJECTIONS


@pytest.mark.parametrize("overrides, message", [
    (["model.lora_rank=8", "model.target_modules=[q_proj,qkv_proj]"], r"model.target_modules: .*qkv_proj"),
    (["model.lora_rank=8", "actor.cuda_graphs=true"], r"model.lora_rank > 0 with actor.cuda_graphs=true"),
    (["model.lora_rank=8", "rollout.decode_products=fused"], r"model.lora_rank > 0 with rollout.decode_products=fused"),
    (["model.lora_rank=-1"], r"model.lora_rank"),
    (["model.lora_dropout=1.0"], r"model.lora_dropout"),
    (["model.lora_init=zeros"], r"model.lora_init"),
])
def test_lora_settings_refused_before_ray(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)
