"""Every measured figure the docs cite names its raw file, and equals it.

A figure is written in the page between two markers naming the raw file under docs/figures/, the value's key
(dotted) and its Python format:

    <!-- figure demo_run.json measured.accuracy_after .1% -->97.5%<!-- /figure -->

The raw file is what the measurement wrote (or its record, by hand, from the command it names), with the
machine's state: every file has `command` (or `test`), `machine` and `date`. A page that quotes a number from a
raw file without the markers is not checked; a figure that no longer equals its file fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIGURES = REPO / "docs" / "figures"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FIGURE = re.compile(r"<!--\s+figure\s+(?P<file>\S+)\s+(?P<key>\S+)\s+(?P<format>\S+)\s+-->(?P<text>.*?)<!-- /figure -->",
                    re.S)
OPENING = re.compile(r"<!--\s+figure\s")


def cited() -> list[tuple[str, re.Match]]:
    return [(page.name, match) for page in PAGES for match in FIGURE.finditer(page.read_text())]


def value_at(record: dict, key: str):
    for part in key.split("."):
        record = record[part]
    return record


def test_the_docs_cite_figures_and_every_marker_is_read():
    assert len(cited()) >= 4
    assert len(cited()) == sum(len(OPENING.findall(page.read_text())) for page in PAGES)


@pytest.mark.parametrize("page, match", cited(), ids=lambda item: item if isinstance(item, str) else item.group("key"))
def test_a_cited_figure_equals_its_raw_file(page, match):
    record = json.loads((FIGURES / match.group("file")).read_text())
    value = value_at(record, match.group("key"))
    assert match.group("text") == format(value, match.group("format")), (page, match.group(0), value)


@pytest.mark.parametrize("path", sorted(FIGURES.glob("*.json")), ids=lambda path: path.name)
def test_a_raw_file_says_how_where_and_when_it_was_measured(path):
    record = json.loads(path.read_text())
    assert {"machine", "date"} <= set(record) and ("command" in record or "test" in record), sorted(record)
    assert re.search(r"load average|idle", record["machine"]), record["machine"]   # the machine's state
