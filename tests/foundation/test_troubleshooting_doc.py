"""docs/troubleshooting.md cannot rot: every row of its bad-input table names a test, and every test the page
names (`tests/path.py::test_name`) exists and is defined in that file."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "troubleshooting.md"
HEADER = ["input", "what is wrong", "the error you see", "what to do", "test"]
TEST_REFERENCE = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def cells(line):
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def table_rows(text):
    """The data rows of the table whose header is HEADER, as lists of cells."""
    lines = text.splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith("|") and cells(line) == HEADER)
    rows = []
    for line in lines[start + 2:]:  # past the header and the |---| line
        if not line.startswith("|"):
            break
        rows.append(cells(line))
    return rows


def defined_functions(path):
    tree = ast.parse(path.read_text())
    return {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_every_table_row_is_complete_and_names_a_test():
    rows = table_rows(DOC.read_text())
    assert len(rows) >= 30
    for row in rows:
        assert len(row) == len(HEADER), row
        assert all(row), f"empty cell in {row}"
        assert TEST_REFERENCE.search(row[-1]), f"no `tests/...py::test_name` in the test cell of {row}"


def test_every_referenced_test_exists():
    references = TEST_REFERENCE.findall(DOC.read_text())
    assert references
    missing = []
    for file_name, function in sorted(set(references)):
        path = ROOT / file_name
        if not path.is_file() or function not in defined_functions(path):
            missing.append(f"{file_name}::{function}")
    assert not missing, f"docs/troubleshooting.md names tests that do not exist: {missing}"
