"""Trackers: metrics.jsonl format and resume truncation, the console line, tensorboard scalars, optional backends."""

import json
import subprocess
import sys
import time
import types

import numpy as np
import pytest

from asyncrl.telemetry import Tracker, read_metrics


def make_tracker(tmp_path, backends, resume_step=None):
    return Tracker(tmp_path, backends, project="asyncrl", experiment="test", config={"actor": {"lr": 1e-6}},
                   resume_step=resume_step)


def test_jsonl_writes_one_sorted_line_per_step_with_step_and_time(tmp_path):
    with make_tracker(tmp_path, ["jsonl"]) as tracker:
        tracker.log({"critic/score/mean": 0.5, "actor/pg_loss": np.float32(-0.25), "param_version": np.int64(3),
                     "is_valid": True, "data_source": "gsm8k"}, step=1)
        tracker.log({"critic/score/mean": 0.75}, step=2)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert list(first) == sorted(first)
    assert first["step"] == 1 and first["critic/score/mean"] == 0.5 and first["actor/pg_loss"] == -0.25
    assert first["param_version"] == 3 and isinstance(first["param_version"], int)
    assert first["is_valid"] == 1 and first["data_source"] == "gsm8k"
    second = json.loads(lines[1])
    assert second["step"] == 2 and second["critic/score/mean"] == 0.75
    assert abs(second["timestamp"] - time.time()) < 60
    assert 0.0 <= first["wall_time_s"] <= second["wall_time_s"]


def test_jsonl_writes_non_finite_numbers_as_null(tmp_path):
    with make_tracker(tmp_path, ["jsonl"]) as tracker:
        tracker.log({"a": float("nan"), "b": float("inf"), "c": np.float64(-np.inf), "d": 1.0}, step=0)
    text = (tmp_path / "metrics.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text
    record = json.loads(text)
    assert record["a"] is None and record["b"] is None and record["c"] is None and record["d"] == 1.0


def test_jsonl_line_is_on_disk_before_close(tmp_path):
    tracker = make_tracker(tmp_path, ["jsonl"])
    tracker.log({"critic/score/mean": 0.1}, step=7)
    assert read_metrics(tmp_path)[0]["step"] == 7  # flushed per line: a killed run keeps it
    tracker.close()


def test_resume_keeps_only_steps_before_the_resume_step(tmp_path):
    with make_tracker(tmp_path, ["jsonl"]) as tracker:
        for step in range(1, 6):
            tracker.log({"critic/score/mean": step / 10}, step=step)
    last_kept_wall_time_s = read_metrics(tmp_path)[2]["wall_time_s"]
    with make_tracker(tmp_path, ["jsonl"], resume_step=4) as tracker:
        assert [record["step"] for record in read_metrics(tmp_path)] == [1, 2, 3]
        tracker.log({"critic/score/mean": 0.99}, step=4)
    records = read_metrics(tmp_path)
    assert [record["step"] for record in records] == [1, 2, 3, 4]
    assert records[3]["critic/score/mean"] == 0.99
    assert records[3]["wall_time_s"] >= last_kept_wall_time_s  # the clock continues across the restart


def test_read_metrics_ignores_a_truncated_last_line_and_append_starts_clean(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "x": 1.0}\n{"step": 2, "x": 2.0}\n{"step": 3, "x"')
    assert [record["step"] for record in read_metrics(path)] == [1, 2]
    with make_tracker(tmp_path, ["jsonl"]) as tracker:
        tracker.log({"x": 3.0}, step=3)
    assert [record["step"] for record in read_metrics(path)] == [1, 2, 3]


def test_read_metrics_rejects_a_broken_line_in_the_middle(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2,\n{"step": 3}\n')
    with pytest.raises(ValueError, match="metrics.jsonl:2"):
        read_metrics(path)


def test_console_prints_step_and_key_metrics_first(tmp_path, capsys):
    with make_tracker(tmp_path, ["console"]) as tracker:
        tracker.log({"zeta/other": 5.0, "actor/pg_loss": -0.0123, "critic/score/mean": 0.625,
                     "val/score/mean": 0.5}, step=12)
    line = capsys.readouterr().out.strip()
    assert line.startswith("step 12 | score 0.625 | val_score 0.5 | pg_loss -0.0123")
    assert "zeta" not in line
    assert not (tmp_path / "metrics.jsonl").exists()


def test_tensorboard_event_file_holds_the_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with make_tracker(tmp_path, ["tensorboard"]) as tracker:
        tracker.log({"critic/score/mean": 0.25, "note": "skipped"}, step=1)
        tracker.log({"critic/score/mean": 0.5}, step=2)
    event_files = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(event_files) == 1
    accumulator = EventAccumulator(str(tmp_path / "tensorboard"))
    accumulator.Reload()
    assert "note" not in accumulator.Tags()["scalars"]
    events = accumulator.Scalars("critic/score/mean")
    assert [(event.step, event.value) for event in events] == [(1, 0.25), (2, 0.5)]


def test_unknown_backend_lists_the_valid_ones(tmp_path):
    with pytest.raises(ValueError, match="csv.*console.*jsonl.*tensorboard.*wandb.*mlflow"):
        make_tracker(tmp_path, ["jsonl", "csv"])


@pytest.mark.parametrize("backend", ["wandb", "mlflow"])
def test_missing_optional_backend_names_the_pip_extra(tmp_path, monkeypatch, backend):
    monkeypatch.setitem(sys.modules, backend, None)  # makes `import backend` raise ImportError
    with pytest.raises(ImportError, match=rf"pip install asyncrl\[{backend}\]"):
        make_tracker(tmp_path, ["jsonl", backend])


def test_wandb_backend_logs_numbers_only_and_resumes_the_saved_run(tmp_path, monkeypatch):
    calls = []
    fake_wandb = types.ModuleType("wandb")
    fake_wandb.init = lambda **kwargs: calls.append(("init", kwargs)) or types.SimpleNamespace(id="run-42")
    fake_wandb.log = lambda metrics, step: calls.append(("log", metrics, step))
    fake_wandb.finish = lambda: calls.append(("finish",))
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb)
    with make_tracker(tmp_path, ["wandb"]) as tracker:
        tracker.log({"critic/score/mean": 0.5, "flag": True, "note": "text"}, step=3)
    assert calls[0][1]["project"] == "asyncrl" and calls[0][1]["config"] == {"actor": {"lr": 1e-6}}
    assert calls[0][1]["id"] is None
    assert calls[1] == ("log", {"critic/score/mean": 0.5, "flag": 1.0}, 3)
    assert calls[2] == ("finish",)
    calls.clear()
    make_tracker(tmp_path, ["wandb"], resume_step=4).close()
    assert calls[0][1]["id"] == "run-42" and calls[0][1]["resume"] == "allow"


def test_importing_telemetry_loads_neither_torch_nor_matplotlib():
    code = "import sys, asyncrl.telemetry; print('torch' in sys.modules, 'matplotlib' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]


def test_non_numeric_object_is_a_clear_error(tmp_path):
    with make_tracker(tmp_path, ["jsonl"]) as tracker, pytest.raises(TypeError, match="'bad'.*list"):
        tracker.log({"bad": [1, 2]}, step=1)
