"""The transformer shared by trainer and generation engine, HF checkpoint I/O, tokenizers and tiny models.

    from asyncrl.models import build_tiny_model, load_model, load_tokenizer
    path = build_tiny_model("/tmp/tiny", family="qwen2")
    model, tokenizer = load_model(path), load_tokenizer(path)
    hidden = model(input_ids, positions)        # (B, T) right-padded rows -> (B, T, hidden)
    logits = model.compute_logits(hidden)       # (B, T, V) fp32
    scorer = load_model(folder, kind="reward")  # a *ForSequenceClassification folder: scorer(ids, positions, lengths)
"""

from asyncrl.models.attention import (AttentionBackend, FixedCapacityPackedAttention, PackedCausalAttention,
                                     avoid_per_shape_attention_plans, causal_attention)
from asyncrl.models.checkpoint_io import (
    check_model_folder,
    copy_tokenizer_files,
    iter_named_tensors,
    load_model,
    load_named_tensors,
    read_config,
    save_model,
)
from asyncrl.models.compile import compile_decoder_layers, fuse_projections
from asyncrl.models.model_config import ARCHITECTURES, FAMILIES, TransformerConfig, architecture_of
from asyncrl.models.tiny import build_tiny_model, init_weights, tiny_config
from asyncrl.models.tokenizer import (
    CHAT_TEMPLATE,
    build_char_tokenizer,
    char_vocab_size,
    check_tokenizer_fits_model,
    load_tokenizer,
    save_char_tokenizer,
)
from asyncrl.models.sequence_classification import RewardModel
from asyncrl.models.transformer import CausalLM, TransformerModel, ValueModel

__all__ = [
    "ARCHITECTURES",
    "AttentionBackend",
    "CHAT_TEMPLATE",
    "CausalLM",
    "FAMILIES",
    "FixedCapacityPackedAttention",
    "PackedCausalAttention",
    "RewardModel",
    "TransformerConfig",
    "TransformerModel",
    "ValueModel",
    "architecture_of",
    "avoid_per_shape_attention_plans",
    "build_char_tokenizer",
    "build_tiny_model",
    "causal_attention",
    "char_vocab_size",
    "compile_decoder_layers",
    "check_model_folder",
    "check_tokenizer_fits_model",
    "copy_tokenizer_files",
    "fuse_projections",
    "init_weights",
    "iter_named_tensors",
    "load_model",
    "load_named_tensors",
    "load_tokenizer",
    "read_config",
    "save_char_tokenizer",
    "save_model",
    "tiny_config",
]
