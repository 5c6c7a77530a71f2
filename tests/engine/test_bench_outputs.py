"""Benchmarks never write into the source tree unless told to: by default a run appends its result to
outputs/bench/ under the working directory, says where, and a second run adds to the same series."""

from __future__ import annotations

import json

from asyncrl.bench.engine import main

TINY_RUN = ["--num-requests", "2", "--prompt-lengths", "4", "--output-lengths", "3", "--device", "cpu"]


def test_engine_bench_appends_to_outputs_bench_of_the_working_directory(tiny_folder, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        assert main(["--model", str(tiny_folder), *TINY_RUN]) == 0
    written = tmp_path / "outputs" / "bench" / "engine.jsonl"
    results = [json.loads(line) for line in written.read_text().splitlines()]
    assert len(results) == 2 and all(result["engine"]["generated_tokens"] == 2 * 3 for result in results)
    assert f"appended the result to {written.resolve()}" in capsys.readouterr().out
    assert [path.name for path in tmp_path.iterdir()] == ["outputs"]  # nothing else in the working directory
