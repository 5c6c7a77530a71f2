"""A .jsonl or .json file that is not UTF-8 or not JSON fails with the file, the line and the column named."""

from __future__ import annotations

import json
import re

import pytest

from asyncrl.data import DatasetError, read_prompt_file

from .helpers import row

GOOD = json.dumps(row("1+1=")).encode()


def test_a_jsonl_line_that_is_not_utf8_names_the_line_and_column(tmp_path):
    path = tmp_path / "latin1.jsonl"
    latin1 = json.dumps(row("caf\u00e9"), ensure_ascii=False).encode("latin-1")  # an editor's "ANSI" encoding
    path.write_bytes(GOOD + b"\n" + GOOD + b"\n" + latin1 + b"\n")
    column = GOOD.index(b"1+1=") + 4  # "café" starts where "1+1=" does; é is its 4th character
    with pytest.raises(DatasetError, match=re.escape(
            f"{path}: line 3 is not UTF-8 text (byte 0xe9 at column {column}); save the file as UTF-8")):
        read_prompt_file(path)


def test_a_json_file_that_is_not_json_or_not_utf8_names_the_line(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text('[\n  {"prompt": "1+1="},\n  {"prompt": "2+2=",}\n]\n')
    with pytest.raises(DatasetError, match=re.escape(
            f"{path}: not valid JSON at line 3, column 21: Expecting property name enclosed in double quotes")):
        read_prompt_file(path)
    path.write_bytes(b'[\n  {"prompt": "caf\xe9"}\n]\n')
    with pytest.raises(DatasetError, match=re.escape(
            f"{path}: line 2 is not UTF-8 text (byte 0xe9 at column 18); save the file as UTF-8")):
        read_prompt_file(path)


def test_json_lines_saved_as_json_gets_a_hint(tmp_path):
    path = tmp_path / "rows.json"
    path.write_bytes(GOOD + b"\n" + GOOD + b"\n")
    with pytest.raises(DatasetError, match=re.escape(
            f"{path}: not valid JSON at line 2, column 1: Extra data; one row per line is JSON Lines: name the file "
            ".jsonl")):
        read_prompt_file(path)


def test_a_byte_order_mark_and_unicode_line_separators_inside_strings_are_read(tmp_path):
    path = tmp_path / "windows.jsonl"
    separated = json.dumps(row("a\u2028b\u0085c"), ensure_ascii=False).encode()
    path.write_bytes(b"\xef\xbb\xbf" + GOOD + b"\r\n" + separated + b"\r\n")
    records = read_prompt_file(path)
    assert [record.messages[0]["content"] for record in records] == ["1+1=", "a\u2028b\u0085c"]
    path = tmp_path / "windows.json"
    path.write_bytes(b"\xef\xbb\xbf[" + GOOD + b"]")
    assert read_prompt_file(path)[0].messages[0]["content"] == "1+1="


def test_an_unpaired_surrogate_names_the_row_and_message(tmp_path):
    path = tmp_path / "surrogate.jsonl"
    escaped = json.dumps(row("smile SURROGATE")).replace("SURROGATE", "\\ud83d")  # JSON's escape, without its pair
    path.write_text(json.dumps(row("1+1=")) + "\n" + escaped + "\n")
    with pytest.raises(DatasetError, match=re.escape(
            f"{path}: row 1: prompt[0].content holds an unpaired surrogate '\\ud83d' at character 6, which is not "
            "text")):
        read_prompt_file(path)
