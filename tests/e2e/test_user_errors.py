"""What a user sees when their input is wrong: one clear line, no traceback, no Ray started; a reward function
that raises during training costs only its samples (scored 0, counted, warned about); a finished run run again
starts nothing."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from asyncrl.config import dump_config
from asyncrl.telemetry import read_metrics


def train_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "asyncrl.cli", "train", *args], capture_output=True, text=True,
                          timeout=timeout)


def assert_clean_failure(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert "Ray" not in result.stderr  # nothing started
    for needle in needles:
        assert needle in result.stderr, result.stderr


def test_bad_config_key(tmp_path):
    assert_clean_failure(train_cli("actor.ppo_mini_batchsize=4"), "actor.ppo_mini_batch_size")


def test_missing_dataset_file_and_model_folder(raw_policy, tmp_path):
    result = train_cli(f"model.path={raw_policy['model']}", f"data.train_files=[{tmp_path / 'nope.parquet'}]",
                       "data.max_prompt_length=16", "data.max_response_length=6")
    assert_clean_failure(result, "nope.parquet does not exist")
    result = train_cli(f"model.path={tmp_path / 'no_model'}", f"data.train_files=[{raw_policy['train']}]")
    assert_clean_failure(result, "model.path", "no_model does not exist")


FLAKY_REWARD = ("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                "    if solution_str.endswith('1'):\n"
                "        raise ValueError('cannot score answers ending in 1')\n"
                "    return float(solution_str.strip() == ground_truth)\n")


def test_a_reward_that_raises_costs_its_samples_and_a_finished_run_run_again_starts_nothing(make_raw_config,
                                                                                            tmp_path):
    """A reward function that raises during training costs only its samples: scored 0, counted, warned about in
    one line without a traceback, and the run finishes. The same command again starts nothing, says how to train
    again and exits 0. A changed trainer.mode is refused before Ray with both values named. Neither touches the
    finished run's files; raising trainer.total_steps trains on from its last checkpoint."""
    reward_file = tmp_path / "flaky.py"
    reward_file.write_text(FLAKY_REWARD)
    config = make_raw_config(f"reward.custom_function={reward_file}:compute_score", "trainer.total_steps=2",
                             "trainer.val_before_train=false", "data.val_files=[]", "data.train_batch_size=8",
                             "actor.ppo_mini_batch_size=8", "ray.num_cpus=2")
    config_path = tmp_path / "run.yaml"
    config_path.write_text(dump_config(config))
    output = Path(config.trainer.output_dir)
    first = train_cli(str(config_path))
    assert first.returncode == 0, first.stderr[-3000:]
    assert re.search(rf"^finished 2 steps in \d+s\noutputs in {re.escape(str(output))}$", first.stdout, re.M)
    assert "the reward failed on" in first.stderr and "cannot score answers ending in 1" in first.stderr
    assert "Traceback" not in first.stderr
    rows = [row for row in read_metrics(output / "metrics.jsonl") if "reward/num_errors" in row]
    assert len(rows) == 2 and rows[-1]["reward/num_errors"] > 0
    files = {name: (output / name).read_bytes() for name in ("config.yaml", "timeline.json", "metrics.jsonl",
                                                             "summary.json")}

    again = train_cli(str(config_path))
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"WARNING] asyncrl.launch.modes: trainer.output_dir={output} holds a finished run (2 steps; last " \
           f"checkpoint {output / 'checkpoints' / 'step_2'}): nothing to train, nothing was started." in again.stderr
    assert "give another trainer.output_dir, or trainer.resume=disable to start over" in again.stderr
    assert "raise trainer.total_steps (now 2)" in again.stderr
    assert f"nothing to do: {output} holds a finished run (2 steps)" in again.stdout
    assert "Ray" not in again.stderr and "Traceback" not in again.stderr
    assert {name: (output / name).read_bytes() for name in files} == files

    other_mode = train_cli(str(config_path), "trainer.mode=one_step_off", "rollout.n_gpus_per_node=1")
    assert_clean_failure(other_mode, f"error: cannot resume from {output / 'checkpoints' / 'step_2'}: the config "
                         "differs in trainer.mode: 'sync' in the checkpoint, 'one_step_off' now.",
                         "another trainer.output_dir, or trainer.resume=disable")
    assert {name: (output / name).read_bytes() for name in files} == files

    further = train_cli(str(config_path), "trainer.total_steps=3")
    assert further.returncode == 0, further.stderr[-3000:]
    steps = [row["step"] for row in read_metrics(output / "metrics.jsonl") if "critic/score/mean" in row]
    assert steps == [1, 2, 3]
    summary = json.loads((output / "summary.json").read_text())
    # The resumed run counts what it ran, and says it resumed.
    assert (summary["steps"], summary["last_step"], summary["resumed_from_step"]) == (1, 3, 2)
    assert summary["samples"] == 8 * 8 and summary["resumed_from"] == str(output / "checkpoints" / "step_2")
    assert re.search(r"^resumed at step 2; finished 1 step in \d+s, to step 3$", further.stdout, re.M), further.stdout
