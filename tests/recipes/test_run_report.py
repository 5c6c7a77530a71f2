"""What `asyncrl train` prints at the end of a run: this run's counts (a resumed run says from where), the final
validation score, the outputs."""

from asyncrl.recipes.run_report import run_report


def summary(**changes):
    base = {"steps": 20, "last_step": 20, "resumed_from_step": 0, "wall_time_s": 17.4, "output_dir": "/runs/a",
            "initial_validation": {"val/score/mean": 0.125}, "final_validation": {"val/score/mean": 0.975}}
    return {**base, **changes}


def test_a_fresh_run_reports_its_steps_and_the_score_before_and_after():
    assert run_report(summary()) == ["finished 20 steps in 17s",
                                     "validation val/score/mean: 0.125 before training -> 0.975 at step 20",
                                     "outputs in /runs/a"]


def test_a_resumed_run_counts_only_what_it_ran_and_says_it_resumed():
    lines = run_report(summary(steps=1, last_step=250, resumed_from_step=249, initial_validation={}))
    assert lines == ["resumed at step 249; finished 1 step in 17s, to step 250",
                     "validation val/score/mean: 0.975 at step 250", "outputs in /runs/a"]


def test_a_stopped_run_says_where_it_stopped_and_how_to_continue():
    lines = run_report(summary(steps=5, last_step=7, resumed_from_step=2, stopped_by="SIGINT", final_validation={}))
    assert lines == ["stopped by SIGINT after step 7 (resumed at step 2; 5 steps in 17s); run the same "
                     "command again to continue", "outputs in /runs/a"]
