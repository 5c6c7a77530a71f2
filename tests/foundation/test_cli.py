"""The CLI's config and data commands, run as a user runs them (a subprocess of the console script).

The demo itself runs once in the suite, as the README says to run it: tests/foundation/test_readme.py."""

import re
import subprocess
import sys

import pandas as pd

from asyncrl.data.demo_tasks import DEMO_TASKS


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "asyncrl.cli", *args], capture_output=True, text=True, timeout=120)


def test_config_show_prints_overridden_values():
    result = run_cli("config", "show", "trainer.mode=fully_async", "async_training.staleness_threshold=0.5")
    assert result.returncode == 0, result.stderr
    assert "mode: fully_async" in result.stdout
    assert "staleness_threshold: 0.5" in result.stdout


def test_config_show_rejects_misspelt_key_without_traceback():
    result = run_cli("config", "show", "actor.ppo_mini_batchsize=4")
    assert result.returncode != 0
    assert "actor.ppo_mini_batch_size" in result.stderr
    assert "Traceback" not in result.stderr


def test_data_make_writes_verl_schema_parquet(tmp_path):
    result = run_cli("data", "make", "arithmetic", "--out", str(tmp_path), "--train-size", "64", "--val-size", "16")
    assert result.returncode == 0, result.stderr
    train = pd.read_parquet(tmp_path / "train.parquet")
    val = pd.read_parquet(tmp_path / "val.parquet")
    assert len(train) == 64 and len(val) == 16
    row = train.iloc[0]
    assert set(["prompt", "data_source", "reward_model", "extra_info"]) <= set(train.columns)
    assert row["data_source"] == "asyncrl/arithmetic"
    assert row["prompt"][0]["role"] == "user"
    assert "ground_truth" in row["reward_model"]
    assert not set(train["prompt"].map(lambda p: p[0]["content"])) & set(val["prompt"].map(lambda p: p[0]["content"]))


def test_data_make_without_a_task_writes_the_demos_task(tmp_path):
    # The demo's warm-started model (asyncrl demo --setup-only) was taught 2-digit sums: the default data matches it.
    result = run_cli("data", "make", "--out", str(tmp_path), "--train-size", "64", "--val-size", "16")
    assert result.returncode == 0, result.stderr
    for split in ("train", "val"):
        questions = pd.read_parquet(tmp_path / f"{split}.parquet")["prompt"].map(lambda p: p[0]["content"])
        assert all(re.fullmatch(r"[1-9]\d\+[1-9]\d=", question) for question in questions), list(questions)[:5]


def test_demo_unknown_task_is_a_clear_error(tmp_path):
    result = run_cli("demo", "--task", "longtails", "--out", str(tmp_path))
    assert result.returncode == 2
    assert "argument --task: invalid choice: 'longtails'" in result.stderr
    assert all(name in result.stderr.split("invalid choice")[1] for name in DEMO_TASKS)
    assert "Traceback" not in result.stderr and not any(tmp_path.iterdir())


def test_demo_help_lists_every_task_with_its_summary():
    result = run_cli("demo", "--help")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())  # argparse wraps the lines
    for name, task in DEMO_TASKS.items():
        assert f"{name}: {' '.join(task.summary.split())}" in text, name
    assert "{" + ",".join(DEMO_TASKS) + "}" in text


def test_data_make_unknown_knob_is_a_clear_error(tmp_path):
    result = run_cli("data", "make", "arithmetic", "--out", str(tmp_path), "--set", "digits=3")
    assert result.returncode == 2
    assert "no knob 'digits'" in result.stderr
