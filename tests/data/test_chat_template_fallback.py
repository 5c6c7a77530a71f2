"""A tokenizer without a chat template is an error naming its folder, before any prompt is encoded, unless a
fallback is chosen; the tiny models' tokenizer carries its own template, so the demo needs none."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from asyncrl.data import DatasetError
from asyncrl.data.dataset import PromptDataset
from asyncrl.models import build_tiny_model, load_tokenizer

from .helpers import data_config, row, write_jsonl


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("fallback") / "tiny")


def without_template(model_folder, destination):
    """The model's tokenizer files with chat_template removed from tokenizer_config.json."""
    destination.mkdir()
    for name in ("tokenizer.json", "special_tokens_map.json"):
        shutil.copy(model_folder / name, destination / name)
    config = json.loads((model_folder / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (destination / "tokenizer_config.json").write_text(json.dumps(config))
    return load_tokenizer(destination)


def test_a_missing_chat_template_is_an_error_naming_the_tokenizer_folder(model_folder, tmp_path):
    tokenizer = without_template(model_folder, tmp_path / "bare")
    path = write_jsonl(tmp_path / "p.jsonl", [row("1+1=")])
    with pytest.raises(DatasetError, match=re.escape(
            f"tokenizer {tmp_path / 'bare'} has no chat template (no chat_template in its tokenizer_config.json, no "
            "chat_template.jinja): copy the template of the model's release into the folder, set "
            "data.chat_template_fallback=plain to format prompts as 'user: ...' lines, or "
            "data.apply_chat_template=false to join the messages' text")):
        PromptDataset.from_files([str(path)], tokenizer, data_config())


def test_a_chosen_fallback_or_no_template_at_all_formats_the_prompts(model_folder, tmp_path):
    tokenizer = without_template(model_folder, tmp_path / "bare")
    path = write_jsonl(tmp_path / "p.jsonl", [row("1+1=", system="Add.")])
    plain = PromptDataset.from_files([str(path)], tokenizer, data_config("data.chat_template_fallback=plain"))
    assert tokenizer.decode(plain[0].prompt_ids) == "system: Add.\nuser: 1+1=\nassistant: "
    joined = PromptDataset.from_files([str(path)], tokenizer, data_config("data.apply_chat_template=false"))
    assert tokenizer.decode(joined[0].prompt_ids) == "Add.\n1+1="


def test_the_tiny_model_tokenizer_has_its_own_template(model_folder, tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [row("12+34=")])
    dataset = PromptDataset.from_files([str(path)], load_tokenizer(model_folder), data_config())
    assert load_tokenizer(model_folder).decode(dataset[0].prompt_ids) == "<|user|>12+34=<|assistant|>"
