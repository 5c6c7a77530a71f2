"""Small dataset files for the data tests."""

from __future__ import annotations

import json
from pathlib import Path

from asyncrl.config import load_config
from asyncrl.config.schema import DataConfig


def row(content: str, system: str | None = None) -> dict:
    """A dataset row in verl's schema: one user message, after a system message when one is given."""
    messages = ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": "user", "content": content}]
    return {"prompt": messages, "data_source": "asyncrl/arithmetic", "reward_model": {"ground_truth": "2"}}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(item) + "\n" for item in rows))
    return path


def data_config(*overrides: str) -> DataConfig:
    return load_config(None, ["data.max_prompt_length=64", *overrides]).data


CHATML = ("{%- if messages[0]['role'] != 'system' -%}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
          "{%- endif -%}"
          "{%- for message in messages -%}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
          "{%- endfor -%}"
          "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}")


def chatml_tokenizer():
    """A byte-level BPE tokenizer with ChatML markers, like Qwen's, trained in memory on a few phrases."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(["You are a helpful assistant.", "system user assistant", "what is 1+1?"], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>"], chat_template=CHATML)
