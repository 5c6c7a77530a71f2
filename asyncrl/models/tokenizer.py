"""A character-level tokenizer for tiny CPU models, saved as HF tokenizer files; the tokenizer loader, and
the check that a tokenizer belongs to a model.

One token per character (printable ASCII, tab and newline) plus a few special tokens, and a compact chat
template (`<|user|>2+3=<|assistant|>`): CPU demos are sensitive to sequence length, so a turn costs one token
of markup instead of the five or so of ChatML.

    save_char_tokenizer("tiny_model/")
    tokenizer = load_tokenizer("tiny_model/")     # transformers under the hood; damaged files are named
    tokenizer.apply_chat_template([{"role": "user", "content": "2+3="}], add_generation_prompt=True,
                                  tokenize=False)  # '<|user|>2+3=<|assistant|>'
    check_tokenizer_fits_model(tokenizer, "tiny_model/", read_config("tiny_model/")[0], "tiny_model/")
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from asyncrl.models.model_config import TransformerConfig

PAD_TOKEN = "<|pad|>"
EOS_TOKEN = "<|endoftext|>"
UNK_TOKEN = "<|unk|>"
SYSTEM_TOKEN = "<|system|>"
USER_TOKEN = "<|user|>"
ASSISTANT_TOKEN = "<|assistant|>"
SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, UNK_TOKEN, SYSTEM_TOKEN, USER_TOKEN, ASSISTANT_TOKEN)
CHARACTERS = "\t\n" + "".join(chr(code) for code in range(32, 127))  # printable ASCII incl. space and digits

# An assistant turn ends with EOS so that a model learns to stop after answering. Tool calls follow the Hermes /
# Qwen2.5 format (one `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` per call, after the content);
# tool results sit in a user turn, consecutive ones sharing it, each in `<tool_response>...</tool_response>`;
# the tools' schemas, when given, open the conversation in a system turn, one JSON object per line.
CHAT_TEMPLATE = (
    "{%- if tools -%}" + SYSTEM_TOKEN +
    "{%- if messages[0]['role'] == 'system' -%}{{ messages[0]['content'] + '\\n' }}{%- endif -%}"
    "<tools>{%- for tool in tools -%}{{ '\\n' }}{{ tool | tojson }}{%- endfor -%}{{ '\\n' }}</tools>"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}{%- if not tools -%}" + SYSTEM_TOKEN + "{{ message['content'] }}{%- endif -%}"
    "{%- elif message['role'] == 'user' -%}" + USER_TOKEN + "{{ message['content'] }}"
    "{%- elif message['role'] == 'assistant' -%}" + ASSISTANT_TOKEN + "{{ message['content'] or '' }}"
    "{%- if message['tool_calls'] is defined and message['tool_calls'] -%}"
    "{%- for call in message['tool_calls'] -%}"
    "{%- set function = call['function'] if call['function'] is defined else call -%}"
    "<tool_call>{\"name\": \"{{ function['name'] }}\", \"arguments\": {{ function['arguments'] | tojson }}}</tool_call>"
    "{%- endfor -%}"
    "{%- endif -%}" + EOS_TOKEN +
    "{%- elif message['role'] == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}" + USER_TOKEN + "{%- endif -%}"
    "<tool_response>{{ message['content'] }}</tool_response>"
    "{%- else -%}{{ raise_exception('unknown chat role: ' + message['role']) }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}" + ASSISTANT_TOKEN + "{%- endif -%}"
)
TOKENIZER_FILE_NAMES = ("tokenizer.json", "tokenizer_config.json")
# JSON files of a tokenizer folder that transformers reads; tokenizer.json is checked by the tokenizers library.
TOKENIZER_JSON_FILES = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "chat_template.json",
                        "vocab.json")
# Declared classes that mean "tokenizer.json as it is"; None is a folder without a declared class.
GENERIC_TOKENIZER_CLASSES = (None, "PreTrainedTokenizerFast", "TokenizersBackend")


def char_vocab_size() -> int:
    """Number of tokens of the character tokenizer (special tokens first, then characters)."""
    return len(SPECIAL_TOKENS) + len(CHARACTERS)


def build_char_tokenizer() -> Tokenizer:
    """The `tokenizers.Tokenizer`: ids 0..5 are SPECIAL_TOKENS, then one id per character of CHARACTERS."""
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + tuple(CHARACTERS))}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    # Every character is its own pre-token; "[\s\S]" also matches newline, unlike ".".
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    # Fuse concatenates tokens on decode; the default would join them with spaces.
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return tokenizer


def _tokenizer_config(model_max_length: int) -> dict[str, Any]:
    added_tokens = {
        str(index): {"content": token, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": True}
        for index, token in enumerate(SPECIAL_TOKENS)
    }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added_tokens,
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "unk_token": UNK_TOKEN,
        "additional_special_tokens": [SYSTEM_TOKEN, USER_TOKEN, ASSISTANT_TOKEN],
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "padding_side": "right",
    }


def save_char_tokenizer(folder: str | Path, model_max_length: int = 512) -> Path:
    """Writes tokenizer.json, tokenizer_config.json and special_tokens_map.json into `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    build_char_tokenizer().save(str(folder / "tokenizer.json"))
    config = _tokenizer_config(model_max_length)
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    special_tokens_map = {key: config[key] for key in ("eos_token", "pad_token", "unk_token", "additional_special_tokens")}
    (folder / "special_tokens_map.json").write_text(json.dumps(special_tokens_map, indent=2) + "\n")
    return folder


def load_tokenizer(folder: str | Path) -> Any:
    """The folder's tokenizer through transformers, after checking that the folder holds tokenizer files and that
    each of them parses; a damaged file raises ValueError naming it.

    A folder whose tokenizer_config.json names no model-specific class (or the generic PreTrainedTokenizerFast /
    TokenizersBackend) loads tokenizer.json as it is. AutoTokenizer in transformers 5 instead picks the class of
    config.json's model_type when one sits in the same folder, and Qwen2Tokenizer rebuilds the pipeline from the
    vocabulary alone: in a qwen2 folder the character tokenizer then lost every space and non-ASCII character.
    transformers is imported here, not at module top, so that `asyncrl.models` imports without it.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"tokenizer folder {folder} does not exist")
    has_fast = (folder / "tokenizer.json").is_file()
    has_slow = (folder / "tokenizer.model").is_file() or (folder / "vocab.json").is_file()
    if not (has_fast or has_slow):
        raise ValueError(
            f"tokenizer folder {folder} lacks tokenizer files: expected tokenizer.json "
            "(or vocab.json + merges.txt, or tokenizer.model), normally with tokenizer_config.json")
    parsed = {name: read_json_object(folder / name) for name in TOKENIZER_JSON_FILES if (folder / name).is_file()}
    if has_fast:
        check_tokenizer_json(folder / "tokenizer.json")
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    # Optional keys of a downloaded file, not our config.
    declared_class = parsed.get("tokenizer_config.json", {}).get("tokenizer_class")
    loader = PreTrainedTokenizerFast if has_fast and declared_class in GENERIC_TOKENIZER_CLASSES else AutoTokenizer
    try:
        return loader.from_pretrained(str(folder))
    except Exception as error:  # transformers and tokenizers raise many unrelated types for a bad folder
        raise ValueError(f"tokenizer folder {folder} cannot be loaded by transformers: "
                         f"{type(error).__name__}: {error}") from None


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON file holding an object; ValueError naming the file (and the line) otherwise."""
    try:
        content = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as error:
        raise ValueError(f"{path} is not UTF-8 text (byte 0x{error.object[error.start]:02x} at offset "
                         f"{error.start}); restore the file") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON (line {error.lineno}, column {error.colno}: {error.msg}); "
                         "restore the file") from None
    if not isinstance(content, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(content).__name__}; restore the file")
    return content


def check_tokenizer_json(path: Path) -> None:
    """Parses tokenizer.json with the tokenizers library alone, so that a damaged or too-new file is named
    (transformers' own error names neither the file nor the folder)."""
    try:
        Tokenizer.from_file(str(path))
    except Exception as error:  # the Rust side raises a bare Exception
        raise ValueError(f"{path} is not a tokenizer file the tokenizers library can read ({error}); restore the "
                         "file, or upgrade tokenizers if it was written by a newer release") from None


def check_tokenizer_fits_model(tokenizer: Any, tokenizer_folder: str | Path, model_config: TransformerConfig,
                               model_folder: str | Path) -> None:
    """Raises ValueError, naming both folders, when the tokenizer and the model do not belong together:
    token ids past the model's embedding; no eos_token (typically a folder without its tokenizer_config.json,
    which also holds the chat template); or an eos_token the model does not stop on (the engine stops on
    config.json's eos_token_id, so responses would always run to full length).
    A missing pad_token is fine: batches are padded with id 0 under a mask."""
    num_tokens, vocab_size = len(tokenizer), model_config.vocab_size
    if num_tokens > vocab_size:
        raise ValueError(
            f"tokenizer {tokenizer_folder} has {num_tokens} tokens but model {model_folder} has vocab_size="
            f"{vocab_size} (config.json): token ids {vocab_size}..{num_tokens - 1} would index past its embedding; "
            "use the tokenizer the model was trained with")
    if tokenizer.eos_token_id is None:
        raise ValueError(
            f"tokenizer {tokenizer_folder} defines no eos_token (is its tokenizer_config.json, which also holds the "
            f"chat template, missing?); set eos_token in {Path(tokenizer_folder) / 'tokenizer_config.json'} to the "
            f"token model {model_folder} ends a response with (eos_token_id={model_config.eos_token_ids or 'none'} "
            "in its config.json)")
    if tokenizer.eos_token_id not in model_config.eos_token_ids:
        raise ValueError(
            f"tokenizer {tokenizer_folder} ends a turn with eos_token {tokenizer.eos_token!r} (id "
            f"{tokenizer.eos_token_id}) but model {model_folder} stops only on eos_token_id="
            f"{model_config.eos_token_ids or 'none'} (config.json), so responses would run to "
            f"data.max_response_length; add {tokenizer.eos_token_id} to eos_token_id in "
            f"{Path(model_folder) / 'config.json'}")
