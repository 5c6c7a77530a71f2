"""Read prompt files (.parquet, .jsonl, .json) in verl's schema into `PromptRecord`s.

Schema of a row: `prompt` (chat messages `[{"role", "content"}]`; a plain string is taken as one user
message), `data_source` (str, picks the built-in scorer), `reward_model.ground_truth` (a string, number,
list or mapping; a row may leave out `reward_model` when its reward function needs no answer), `extra_info`
(dict). A malformed row raises `DatasetError` naming the file and the row; a file that is not UTF-8 or not
JSON names the file and the line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from asyncrl.data.records import PromptRecord

ROLES = ("system", "user", "assistant", "tool")
GROUND_TRUTH_TYPES = (str, int, float, list, dict)  # what JSON and parquet give and the scorers read
BYTE_ORDER_MARK = "\ufeff"  # editors on Windows start UTF-8 files with it; JSON does not allow it


class DatasetError(ValueError):
    """A dataset file or row that cannot be used; the message names the file and the row."""


def read_prompt_file(path: str | Path, prompt_key: str = "prompt") -> list[PromptRecord]:
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"dataset file {path} does not exist")
    rows = read_rows(path)
    if not rows:
        raise DatasetError(f"dataset file {path} holds no rows")
    return [parse_row(row, path, index, prompt_key) for index, row in enumerate(rows)]


def read_prompt_files(paths: list[str], prompt_key: str = "prompt") -> list[PromptRecord]:
    records: list[PromptRecord] = []
    for path in paths:
        records.extend(read_prompt_file(path, prompt_key))
    return records


def read_rows(path: Path) -> list[dict[str, Any]]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as parquet
        try:
            return parquet.read_table(path).to_pylist()
        except Exception as error:  # pyarrow raises several unrelated types for a bad file
            raise DatasetError(f"dataset file {path} is not a readable parquet file: {error}") from None
    if suffix == ".jsonl":
        return read_json_lines(path)
    if suffix == ".json":
        return read_json_list(path)
    raise DatasetError(f"dataset file {path}: unsupported format {suffix!r}; use .parquet, .jsonl or .json")


def read_json_lines(path: Path) -> list[Any]:
    """One JSON value per line. Lines are split at b"\n" only: str.splitlines would also split at U+2028 and
    other separators that JSON allows unescaped inside a string."""
    rows = []
    for line_number, raw_line in enumerate(path.read_bytes().split(b"\n"), start=1):
        line = decode_utf8(raw_line, path, first_line=line_number)
        if line_number == 1:
            line = line.removeprefix(BYTE_ORDER_MARK)
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise DatasetError(f"{path}: line {line_number} is not valid JSON: {error}") from None
    return rows


def read_json_list(path: Path) -> list[Any]:
    text = decode_utf8(path.read_bytes(), path, first_line=1).removeprefix(BYTE_ORDER_MARK)
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as error:
        # "Extra data" after a first complete value is the usual sign of JSON Lines saved as .json.
        hint = "; one row per line is JSON Lines: name the file .jsonl" if error.msg == "Extra data" else ""
        raise DatasetError(f"{path}: not valid JSON at line {error.lineno}, column {error.colno}: "
                           f"{error.msg}{hint}") from None
    if not isinstance(rows, list):
        raise DatasetError(f"{path}: a .json dataset must hold a list of rows")
    return rows


def decode_utf8(data: bytes, path: Path, first_line: int) -> str:
    """`data` as UTF-8 text; otherwise a DatasetError naming the file, the line and the column of the first bad
    byte (`first_line` is the line `data` starts on)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = first_line + data.count(b"\n", 0, error.start)
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        raise DatasetError(f"{path}: line {line} is not UTF-8 text (byte 0x{data[error.start]:02x} at column "
                           f"{column}); save the file as UTF-8") from None


def parse_row(row: Any, path: Path, index: int, prompt_key: str) -> PromptRecord:
    where = f"{path}: row {index}"
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected a mapping, got {type(row).__name__}")
    if prompt_key not in row:
        raise DatasetError(f"{where}: missing column {prompt_key!r} (data.prompt_key); columns: {sorted(row)}")
    messages = parse_messages(row[prompt_key], where, prompt_key)
    data_source = row.get("data_source") or "unknown"  # a dataset row, not our config: optional columns
    if not isinstance(data_source, str):
        raise DatasetError(f"{where}: data_source must be a string, got {data_source!r}")
    reward_model = row.get("reward_model") or {}
    if not isinstance(reward_model, dict):
        raise DatasetError(f"{where}: reward_model must be a mapping with ground_truth, got {reward_model!r}")
    ground_truth = parse_ground_truth(reward_model, where)
    extra_info = row.get("extra_info") or {}
    if not isinstance(extra_info, dict):
        raise DatasetError(f"{where}: extra_info must be a mapping, got {extra_info!r}")
    return PromptRecord(prompt_id=f"{path.name}:{index}", messages=messages, data_source=data_source,
                        ground_truth=ground_truth, extra_info=extra_info)


def parse_ground_truth(reward_model: dict[str, Any], where: str) -> Any:
    """The row's answer; None only for a row without reward_model. A reward_model whose ground_truth is
    absent or null (a misspelt key, a parquet cell left empty) would score every response 0."""
    if not reward_model:
        return None
    ground_truth = reward_model.get("ground_truth")
    if ground_truth is None:
        raise DatasetError(f"{where}: reward_model.ground_truth is missing or null (reward_model keys: "
                           f"{sorted(reward_model)}); give every row the answer its reward function compares to")
    if not isinstance(ground_truth, GROUND_TRUTH_TYPES):
        raise DatasetError(f"{where}: reward_model.ground_truth must be a string, number, list or mapping, got "
                           f"{type(ground_truth).__name__} {ground_truth!r:.60}")
    return ground_truth


def parse_messages(value: Any, where: str, prompt_key: str) -> list[dict[str, str]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise DatasetError(f"{where}: {prompt_key!r} must be a non-empty list of chat messages, got {value!r}")
    messages = []
    for position, message in enumerate(value):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise DatasetError(f"{where}: {prompt_key}[{position}] must have 'role' and 'content', got {message!r}")
        if message["role"] not in ROLES:
            raise DatasetError(f"{where}: {prompt_key}[{position}] has role {message['role']!r}; valid: {ROLES}")
        if not isinstance(message["content"], str):
            raise DatasetError(f"{where}: {prompt_key}[{position}].content must be a string")
        check_encodable(message["content"], f"{where}: {prompt_key}[{position}].content")
        messages.append({"role": message["role"], "content": message["content"]})
    if not any(message["content"].strip() for message in messages):
        raise DatasetError(f"{where}: {prompt_key!r} is empty (every message's content is blank): nothing to answer")
    return messages


def check_encodable(text: str, where: str) -> None:
    """JSON's "\\ud800" escape gives a string with an unpaired surrogate, which no tokenizer can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise DatasetError(f"{where} holds an unpaired surrogate {text[error.start]!r} at character {error.start}, "
                           "which is not text (an escape such as \\ud83d without its pair)") from None
