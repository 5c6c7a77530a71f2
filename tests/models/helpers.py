"""Helpers for the model tests: tiny HF folders with random (not default) weights for each supported family."""

from __future__ import annotations

from pathlib import Path

import torch

from asyncrl.models import build_tiny_model, load_model, save_model

LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    # Small on purpose: with head_dim 16 and theta 5e5 this puts frequencies in all three llama3 bands.
    "original_max_position_embeddings": 64,
}

# One entry per feature the HF comparison must cover.
FAMILY_CASES = {
    "llama_output_bias": dict(family="llama", tie_word_embeddings=False, attention_bias=True),
    "llama3_scaled_untied": dict(family="llama", tie_word_embeddings=False, rope_theta=500000.0,
                                 rope_scaling=LLAMA3_SCALING),
    "qwen2_bias_tied": dict(family="qwen2", tie_word_embeddings=True, rope_theta=1000000.0),
    "qwen3_qk_norm": dict(family="qwen3", tie_word_embeddings=True, head_dim=32),
}


def randomize_norms(model: torch.nn.Module, seed: int) -> None:
    """Norm weights default to 1 in tiny models; random ones make a missing or misplaced norm visible."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.copy_(1.0 + 0.3 * torch.randn(tuple(parameter.shape), generator=generator))


def build_random_folder(folder: Path, case: str, seed: int = 0) -> Path:
    """A tiny model folder whose every weight (norms included) is random and large enough to matter."""
    build_tiny_model(folder, seed=seed, init_std=0.2, **FAMILY_CASES[case])
    model = load_model(folder)
    randomize_norms(model, seed)
    save_model(model, folder, tokenizer_folder=folder)
    return folder


def right_padded_batch(lengths: list[int], vocab_size: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """input_ids, positions (B, T) and a 0/1 attention mask (B, T) for right-padded rows of `lengths`."""
    generator = torch.Generator().manual_seed(seed)
    max_length = max(lengths)
    input_ids = torch.randint(0, vocab_size, (len(lengths), max_length), generator=generator)
    attention_mask = (torch.arange(max_length)[None, :] < torch.tensor(lengths)[:, None]).long()
    input_ids = input_ids * attention_mask  # pad id 0 after each row's end
    positions = torch.arange(max_length).expand(len(lengths), max_length)
    return input_ids, positions, attention_mask
