"""Tiny model folders: complete, loadable by us and transformers, deterministic in the seed."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from asyncrl.models import build_tiny_model, char_vocab_size, iter_named_tensors, load_model, tiny_config


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_folder_is_complete_and_loads_everywhere(tmp_path, family):
    folder = build_tiny_model(tmp_path / family, family=family)
    names = {path.name for path in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json"} <= names
    model = load_model(folder)
    assert model.config == tiny_config(family)
    assert model.config.vocab_size == char_vocab_size()
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert type(reference).__name__ == json.loads((folder / "config.json").read_text())["architectures"][0]
    generation = transformers.GenerationConfig.from_pretrained(folder)
    assert (generation.eos_token_id, generation.pad_token_id) == (1, 0)


def test_weights_are_a_function_of_the_seed(tmp_path):
    first = dict(iter_named_tensors(load_model(build_tiny_model(tmp_path / "a", seed=7))))
    second = dict(iter_named_tensors(load_model(build_tiny_model(tmp_path / "b", seed=7))))
    other = dict(iter_named_tensors(load_model(build_tiny_model(tmp_path / "c", seed=8))))
    assert all(torch.equal(first[name], second[name]) for name in first)
    assert not torch.equal(first["model.embed_tokens.weight"], other["model.embed_tokens.weight"])
    assert torch.equal(first["model.norm.weight"], torch.ones(64))
    assert abs(first["model.layers.0.mlp.up_proj.weight"].std().item() - 0.02) < 0.002


def test_vocab_smaller_than_the_tokenizer_is_rejected(tmp_path):
    with pytest.raises(ValueError, match=r"vocab_size must be at least the tokenizer's 103 tokens, got 50"):
        build_tiny_model(tmp_path, vocab_size=50)
