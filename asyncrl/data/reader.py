"""Read prompt files (.parquet, .jsonl, .json) in verl's schema into `PromptRecord`s.

Schema of a row: `prompt` (chat messages `[{"role", "content"}]`; a plain string is taken as one user
message), `data_source` (str, picks the built-in scorer), `reward_model.ground_truth` (a string, number,
list or mapping; a row may leave out `reward_model` when its reward function needs no answer), `extra_info`
(dict). A malformed row raises `DatasetError` naming the file and the row.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from asyncrl.data.records import PromptRecord

ROLES = ("system", "user", "assistant", "tool")
GROUND_TRUTH_TYPES = (str, int, float, list, dict)  # what JSON and parquet give and the scorers read


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
        rows = []
        for line_number, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise DatasetError(f"{path}: line {line_number} is not valid JSON: {error}") from None
        return rows
    if suffix == ".json":
        rows = json.loads(path.read_text())
        if not isinstance(rows, list):
            raise DatasetError(f"{path}: a .json dataset must hold a list of rows")
        return rows
    raise DatasetError(f"dataset file {path}: unsupported format {suffix!r}; use .parquet, .jsonl or .json")


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
        messages.append({"role": message["role"], "content": message["content"]})
    return messages
