"""Random-weight models of real sizes for benchmarks, built from a config (nothing to download).

    config = qwen2_config("qwen2.5-0.5b")                 # or "cpu-3m": a CPU benchmark's model
    model = random_model(config, torch.bfloat16, "cuda")
    folder = write_random_model("qwen2.5-0.5b", "/tmp/qwen0.5b")   # an HF folder for trainer workers
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from asyncrl.models import CausalLM, TransformerConfig, save_char_tokenizer, save_model, tiny_config
from asyncrl.models.tokenizer import EOS_TOKEN, PAD_TOKEN, SPECIAL_TOKENS

# Qwen2.5 shapes (hidden, layers, heads, kv heads, intermediate); vocabulary 151936, tied embeddings.
QWEN2_SHAPES = {
    "qwen2.5-0.5b": (896, 24, 14, 2, 4864),
    "qwen2.5-1.5b": (1536, 28, 12, 2, 8960),
    "tiny-test": (64, 2, 4, 2, 128),  # for CPU smoke tests of the benchmark scripts
}
# Qwen2-style shapes with the character tokenizer's vocabulary (`tiny_config`), for CPU benchmarks: "cpu-3m" (2.9M
# parameters) is the model of the side by side with TRL (benchmarks/trl_side_by_side.py, workload "issue").
CHAR_VOCAB_SHAPES = {
    "cpu-3m": (256, 4, 4, 2, 688),
}
BENCH_MODEL_NAMES = (*QWEN2_SHAPES, *CHAR_VOCAB_SHAPES)


def qwen2_config(name: str) -> TransformerConfig:
    """The TransformerConfig of a Qwen2.5 size in QWEN2_SHAPES, or of a CPU shape in CHAR_VOCAB_SHAPES."""
    if name in CHAR_VOCAB_SHAPES:
        hidden, num_layers, num_heads, num_kv_heads, intermediate = CHAR_VOCAB_SHAPES[name]
        return tiny_config("qwen2", hidden_size=hidden, num_layers=num_layers, num_heads=num_heads,
                           num_kv_heads=num_kv_heads, intermediate_size=intermediate, max_position_embeddings=4096)
    if name not in QWEN2_SHAPES:
        raise ValueError(f"model name must be one of {sorted(BENCH_MODEL_NAMES)} or an HF folder, got {name!r}")
    hidden, num_layers, num_heads, num_kv_heads, intermediate = QWEN2_SHAPES[name]
    return TransformerConfig(
        model_type="qwen2", vocab_size=151936, hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        head_dim=hidden // num_heads, rope_theta=1000000.0, max_position_embeddings=32768, attention_bias=True,
        tie_word_embeddings=True, eos_token_id=151643, pad_token_id=151643)


def random_model(config: TransformerConfig, dtype: torch.dtype, device: str, seed: int = 0) -> CausalLM:
    """Random weights (N(0, 0.02), norms 1) initialised directly on `device`."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = CausalLM(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.fill_(1.0)
            else:
                parameter.normal_(0.0, 0.02)
    return model.to(dtype).eval()


def write_random_model(name: str, folder: str | Path, seed: int = 0, with_char_tokenizer: bool = False) -> Path:
    """An HF folder (fp32 safetensors) with random weights of a `qwen2_config` size; no tokenizer, or the
    character tokenizer (its ids are valid in any vocabulary) with the model's EOS and pad ids set to the
    tokenizer's, as a run's pre-flight checks require."""
    config = qwen2_config(name)
    if with_char_tokenizer:
        config = dataclasses.replace(config, eos_token_id=SPECIAL_TOKENS.index(EOS_TOKEN),
                                     pad_token_id=SPECIAL_TOKENS.index(PAD_TOKEN))
    folder = save_model(random_model(config, torch.float32, "cpu", seed), folder)
    return save_char_tokenizer(folder) if with_char_tokenizer else folder
