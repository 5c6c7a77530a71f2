"""The arithmetic task's long tail: the teacher's answers followed by a long-tailed run of '.'."""

import numpy as np
import pytest

from asyncrl.data.make import make_task
from asyncrl.data.tasks.arithmetic import score


def test_tail_lengths_are_long_tailed_capped_and_fixed_by_the_question():
    task = make_task("arithmetic", {"min_digits": "2", "max_digits": "2", "operators": "+", "tail_median": "8",
                                    "tail_cap": "48"})
    rng = np.random.default_rng(0)
    questions = [task.make_problem(rng)[0] for _ in range(2000)]
    lengths = np.array([task.tail_length(question) for question in questions])
    assert 6 <= np.median(lengths) <= 10                  # the median asked for
    assert lengths.max() == 48 and lengths.min() >= 0     # capped
    assert np.percentile(lengths, 99) >= 4 * np.median(lengths)  # the tail: the longest are many times the median
    assert [task.tail_length(question) for question in questions[:20]] == list(lengths[:20])


def test_the_tail_is_taught_in_training_only_and_does_not_change_the_score():
    task = make_task("arithmetic", {"tail_median": "8", "tail_cap": "48"})
    train_row = task.make_row("37+85=", "122", "train", 0)
    val_row = task.make_row("37+85=", "122", "val", 0)
    taught = train_row["extra_info"]["answer"]
    assert taught == "122" + "." * task.tail_length("37+85=") and len(taught) > 3
    assert val_row["extra_info"]["answer"] == "122"
    assert score(taught, "122") == 1.0 and score("1222" + "." * 30, "122") == 0.0


def test_a_median_past_the_cap_is_refused():
    with pytest.raises(ValueError, match="tail_median <= tail_cap, got 50, 48"):
        make_task("arithmetic", {"tail_median": "50", "tail_cap": "48"})
