"""The character tokenizer through transformers: ids, chat template, round trips; damaged files are named."""

from __future__ import annotations

import json
import re
import shutil
import string

import pytest

from asyncrl.models import build_tiny_model, char_vocab_size, load_tokenizer, save_char_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return load_tokenizer(save_char_tokenizer(tmp_path_factory.mktemp("tokenizer")))


def test_special_ids_and_vocab_size(tokenizer):
    assert tokenizer.pad_token == "<|pad|>" and tokenizer.pad_token_id == 0
    assert tokenizer.eos_token == "<|endoftext|>" and tokenizer.eos_token_id == 1
    assert len(tokenizer) == char_vocab_size() == 103
    assert tokenizer.convert_tokens_to_ids(["<|system|>", "<|user|>", "<|assistant|>"]) == [3, 4, 5]


def test_one_token_per_character_and_round_trip(tokenizer):
    text = string.printable.replace("\r", "").replace("\x0b", "").replace("\x0c", "") + "  two  spaces\n"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == len(text)
    assert tokenizer.decode(ids) == text
    assert tokenizer.encode(tokenizer.decode(ids), add_special_tokens=False) == ids
    assert tokenizer.encode("ab", add_special_tokens=False) == [6 + 2 + ord("a") - 32, 6 + 2 + ord("b") - 32]


def test_special_tokens_are_single_ids_and_unknown_chars_map_to_unk(tokenizer):
    assert tokenizer.encode("<|user|>hi<|assistant|>", add_special_tokens=False) == [
        4, tokenizer.convert_tokens_to_ids("h"), tokenizer.convert_tokens_to_ids("i"), 5]
    assert tokenizer.encode("é", add_special_tokens=False) == [tokenizer.unk_token_id]
    assert tokenizer.decode([4, 1], skip_special_tokens=True) == ""


def test_compact_chat_template(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3="}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt == "<|system|>Be brief.<|user|>2+3=<|assistant|>"
    without_prompt = tokenizer.apply_chat_template(messages[1:], add_generation_prompt=False, tokenize=False)
    assert without_prompt == "<|user|>2+3="
    conversation = messages[1:] + [{"role": "assistant", "content": "5"}]
    assert tokenizer.apply_chat_template(conversation, tokenize=False) == "<|user|>2+3=<|assistant|>5<|endoftext|>"
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    assert len(prompt_ids) == 3 + len("Be brief.") + len("2+3=")  # one token of markup per turn
    with pytest.raises(Exception, match="unknown chat role: function"):
        tokenizer.apply_chat_template([{"role": "function", "content": "x"}], tokenize=False)


def test_compact_chat_template_renders_tool_calls_and_results_in_the_hermes_format(tokenizer):
    call = {"type": "function", "function": {"name": "calc", "arguments": {"expr": "12*34"}}}
    conversation = [{"role": "user", "content": "12*34="}, {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "content": "408"}, {"role": "tool", "content": "1"},
                    {"role": "assistant", "content": "408"}]
    assert tokenizer.apply_chat_template(conversation, tokenize=False) == (
        '<|user|>12*34=<|assistant|><tool_call>{"name": "calc", "arguments": {"expr": "12*34"}}</tool_call>'
        '<|endoftext|><|user|><tool_response>408</tool_response><tool_response>1</tool_response>'
        '<|assistant|>408<|endoftext|>')  # consecutive results share one user turn
    with_tools = tokenizer.apply_chat_template([{"role": "system", "content": "S"}, conversation[0]],
                                               tools=[{"name": "calc"}], add_generation_prompt=True, tokenize=False)
    assert with_tools == '<|system|>S\n<tools>\n{"name": "calc"}\n</tools><|user|>12*34=<|assistant|>'


def test_load_tokenizer_names_a_folder_without_files(tmp_path):
    with pytest.raises(ValueError, match=f"tokenizer folder {tmp_path} lacks tokenizer files"):
        load_tokenizer(tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        load_tokenizer(tmp_path / "absent")


def test_a_model_folder_loads_the_character_tokenizer_as_saved(tmp_path):
    """A qwen2 folder: transformers' AutoTokenizer would rebuild the tokenizer as Qwen2Tokenizer from config.json's
    model_type, which drops spaces, tabs, newlines and every non-ASCII character."""
    tokenizer = load_tokenizer(build_tiny_model(tmp_path / "qwen2", family="qwen2"))
    text = "3 5\t7\n-> 22 é"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == len(text)
    assert ids[1] == tokenizer.convert_tokens_to_ids(" ") and ids[-1] == tokenizer.unk_token_id
    assert tokenizer.decode(ids) == "3 5\t7\n-> 22 <|unk|>"
    assert tokenizer.chat_template is not None and tokenizer.eos_token == "<|endoftext|>"


def copy_with(source, destination, file_name, content: bytes):
    shutil.copytree(source, destination)
    (destination / file_name).write_bytes(content)
    return destination


def test_a_damaged_tokenizer_file_is_named(tmp_path):
    source = save_char_tokenizer(tmp_path / "good")
    good_json = (source / "tokenizer.json").read_bytes()
    truncated = copy_with(source, tmp_path / "truncated", "tokenizer.json", good_json[:500])
    with pytest.raises(ValueError, match=(
            rf"{re.escape(str(truncated / 'tokenizer.json'))} is not a tokenizer file the tokenizers library can "
            r"read \(EOF while parsing .* at line \d+ column \d+\); restore the file, or upgrade tokenizers")):
        load_tokenizer(truncated)
    unknown_model = json.loads(good_json)
    unknown_model["model"]["type"] = "FutureModel"
    newer = copy_with(source, tmp_path / "newer", "tokenizer.json", json.dumps(unknown_model).encode())
    with pytest.raises(ValueError, match=rf"{re.escape(str(newer / 'tokenizer.json'))} is not a tokenizer file"):
        load_tokenizer(newer)
    config = copy_with(source, tmp_path / "config", "tokenizer_config.json", b'{\n  "eos_token": "<|endof')
    with pytest.raises(ValueError, match=(
            rf"{re.escape(str(config / 'tokenizer_config.json'))} is not valid JSON \(line 2, column 16: "
            r"Unterminated string starting at\); restore the file")):
        load_tokenizer(config)
    latin1 = copy_with(source, tmp_path / "latin1", "special_tokens_map.json", '{"x": "é"}'.encode("latin-1"))
    with pytest.raises(ValueError, match=(rf"{re.escape(str(latin1 / 'special_tokens_map.json'))} is not UTF-8 text "
                                          r"\(byte 0xe9 at offset 7\)")):
        load_tokenizer(latin1)
    listed = copy_with(source, tmp_path / "listed", "tokenizer_config.json", b"[]")
    with pytest.raises(ValueError, match=rf"{re.escape(str(listed / 'tokenizer_config.json'))} must hold a JSON "
                                         r"object, got list"):
        load_tokenizer(listed)
