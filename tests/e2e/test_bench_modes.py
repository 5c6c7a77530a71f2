"""`asyncrl bench modes` end to end on CPU with a random-weight Qwen2-shaped model (the GPU path's model
writer, at a tiny size): every mode runs the same sample budget and the table reports their staleness."""

from __future__ import annotations

import json

from PIL import Image

from asyncrl.bench.modes import main


def test_bench_modes_runs_each_mode_on_the_same_budget_with_a_random_qwen_shaped_model(tmp_path, ray_session):
    results_dir = tmp_path / "results"
    assert main(["--model", "tiny-test", "--device", "cpu", "--samples", "24", "--n", "2", "--prompts-per-step", "4",
                 "--micro-batch", "8", "--lengths", "2:6", "--max-response-length", "8", "--modes", "sync",
                 "one_step_off", "--name", "smoke", "--results-dir", str(results_dir)]) == 0
    results = {result["mode"]: result for result in
               json.loads((results_dir / "modes_smoke.json").read_text())["results"]}
    assert set(results) == {"sync", "one_step_off"}
    for result in results.values():
        assert result["samples"] == 24 and result["steps"] == 3
        # Throughput over the training steps: higher than over the run with its start-up and final save.
        assert result["samples_per_s"] == 24 / result["steps_s"] > result["end_to_end_samples_per_s"] > 0
        assert 0.0 <= result["final_score"] <= 1.0  # validated after training, reported beside throughput
    assert results["sync"]["staleness_max"] == 0
    assert results["one_step_off"]["staleness_max"] == 1  # batch s+1 is generated while s trains
    table = (results_dir / "modes_smoke.md").read_text()
    assert "| sync |" in table and "| one_step_off |" in table
    with Image.open(results_dir / "modes_smoke_throughput.png") as image:   # a decodable figure, not a blank one
        colors = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert image.size[0] > 100 and image.size[1] > 100 and len(colors) > 2
