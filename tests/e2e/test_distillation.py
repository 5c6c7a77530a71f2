"""On-policy distillation end to end through real Ray actors: the demo's warm-started student, which stutters
(its sloppy teacher's habit, "122" -> "1222"), distilled from a teacher that learned the same sums without the
stutter (the student's model after 2 more SFT epochs on clean answers), with the teacher's signal alone
(algorithm.distillation.task_reward_weight=0: the reward is computed and logged, never trained on).

Measured on the 2-core VM: the student's greedy validation accuracy went from 12.5% to 98.4% in 10 sync steps
and to 95.3% in 20 fully_async steps (the same prompts), the teacher's being 98.4%; the sampled reverse KL per
token fell from ~1.2 to ~0.05. The test asks for 60% of the gap closed and the KL cut by 3x."""

from __future__ import annotations

import numpy as np
import pytest

from asyncrl.data.demo_tasks import TASK_KNOBS
from asyncrl.data.make import make_task, write_task
from asyncrl.launch import train
from asyncrl.telemetry import read_metrics
from asyncrl.train.sft import SFTSettings, run_sft
from tests.e2e.demo_configs import warm_config

GAP_SHARE = 0.6   # of the teacher's lead in validation accuracy, closed by distillation alone


@pytest.fixture(scope="module")
def teacher(warm_policy, ray_session, tmp_path_factory) -> tuple[str, float]:
    """The teacher's folder (the student after 2 SFT epochs on stutter-free answers) and its validation accuracy
    (a run of it that does not move its weights)."""
    root = tmp_path_factory.mktemp("teacher")
    clean = write_task(make_task("arithmetic", {**TASK_KNOBS, "sloppy_teacher": "0"}), root / "data", 2000, 8, seed=1)
    folder = run_sft(warm_policy["model"], [str(clean["train"])], root / "model", SFTSettings(epochs=2.0, seed=0))
    summary = train(warm_config(warm_policy, root / "accuracy", f"model.path={folder}", "trainer.total_steps=1",
                                "actor.optim.lr=0"))
    return str(folder), summary["initial_validation"]["val/score/mean"]


@pytest.mark.parametrize("mode, overrides", [
    ("sync", ("trainer.total_steps=10",)),
    # R = 16 prompts a step: the sync run's 320 prompts in 20 steps, samples up to one version stale.
    ("fully_async", ("trainer.total_steps=20", "async_training.staleness_threshold=0.5")),
])
def test_distillation_alone_closes_most_of_the_accuracy_gap_to_the_teacher(warm_policy, teacher, mode, overrides,
                                                                           tmp_path):
    teacher_path, teacher_accuracy = teacher
    config = warm_config(warm_policy, tmp_path / mode, f"trainer.mode={mode}", "algorithm.distillation.enable=true",
                         f"algorithm.distillation.teacher_path={teacher_path}", *overrides)
    summary = train(config)
    before = summary["initial_validation"]["val/score/mean"]
    after = summary["final_validation"]["val/score/mean"]
    assert teacher_accuracy >= before + 0.3, (before, teacher_accuracy)   # a gap worth closing
    assert after >= before + GAP_SHARE * (teacher_accuracy - before), (before, after, teacher_accuracy)
    trained = [row for row in read_metrics(f"{config.trainer.output_dir}/metrics.jsonl") if "actor/pg_loss" in row]
    kl = [row["distillation/reverse_kl/mean"] for row in trained]
    assert np.mean(kl[-3:]) < np.mean(kl[:3]) / 3, kl
    assert all(row["distillation/scored_fraction"] == 1.0 for row in trained)
    assert sum(row["distillation/teacher_errors"] + row["distillation/teacher_timeouts"] for row in trained) == 0
    assert all(row["distillation/teacher_log_prob/mean"] < 0 for row in trained)
