"""A scorer cannot stop a run: a dead scoring process (idle or busy) is replaced, Ctrl-C is the driver's, hung
samples on different processes cost one timeout together, a batch can be bounded, memory and CPU limited."""

import logging
import os
import signal
import time

import pytest

from asyncrl.rewards import Failure, RewardExecutor
from asyncrl.rewards.executor import MAX_WORKERS_PER_CPU, available_cpus
from asyncrl.rewards.limits import ScoringLimits
from asyncrl.rewards.process import Phase, ScoringProcess
from asyncrl.rewards.startup import spawn_context
from tests.rewards.helpers import requests, scores, wait_until_dead, write_reward_file

SCORERS = """
import os, time

def exact(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str == ground_truth)

def hangs_on_slow(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "slow":
        time.sleep(600)
    return 1.0

def allocates(data_source, solution_str, ground_truth, extra_info=None):
    ballast = bytearray(2 ** 34 if solution_str == "huge" else 2 ** 20)
    return float(len(ballast) > 0)

def sleeps_then_scores_length(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str.startswith("slow"):
        time.sleep(2)
    return float(len(solution_str))

def exits_on_die(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "die":
        os._exit(3)
    return float(solution_str == ground_truth)

def spins(data_source, solution_str, ground_truth, extra_info=None):
    while solution_str == "spin":
        pass
    return 1.0
"""


@pytest.fixture()
def scorers(tmp_path):
    return write_reward_file(tmp_path, SCORERS, "scorers.py")


def test_a_scorer_killed_while_idle_is_replaced_and_the_next_batch_scores_every_sample(scorers, caplog):
    executor = RewardExecutor(f"{scorers}:exact", timeout_s=10, num_workers=2)
    try:
        assert scores(executor.score(requests("yes", "no"))) == [1.0, 0.0]
        killed = executor.pids()[0]
        os.kill(killed, signal.SIGKILL)
        wait_until_dead(killed)
        with caplog.at_level(logging.WARNING, logger="asyncrl.rewards.executor"):
            results = executor.score(requests("yes", "no", "yes", "yes"))
        assert scores(results) == [1.0, 0.0, 1.0, 1.0]  # the sample sent to the dead process was sent again
        assert killed not in executor.pids() and len(executor.pids()) == 2
        metrics = executor.metrics()
        assert metrics["reward/num_errors"] == 0 and metrics["reward/num_restarts"] == 1
        assert f"scoring process {killed} of {scorers}:exact was killed by SIGKILL while idle" in caplog.text
    finally:
        executor.close()


def test_sigint_to_a_scorer_is_ignored_so_ctrl_c_reaches_only_the_driver(scorers):
    executor = RewardExecutor(f"{scorers}:exact", timeout_s=10)
    try:
        before = executor.pids()
        os.kill(before[0], signal.SIGINT)
        assert scores(executor.score(requests("yes", "no"))) == [1.0, 0.0]
        assert executor.pids() == before and executor.metrics()["reward/num_restarts"] == 0
    finally:
        executor.close()


def test_sigint_while_a_scorer_is_still_importing_is_ignored_too(tmp_path):
    """Between the spawn and the scorer's own handler the interpreter starts and re-imports the main module;
    a Ctrl-C then must not kill it either (it is spawned with SIGINT blocked)."""
    path = write_reward_file(tmp_path, """
        import time
        time.sleep(1.0)

        def score(data_source, solution_str, ground_truth, extra_info=None):
            return 1.0
    """)
    process = ScoringProcess(spawn_context(), f"{path}:score", ScoringLimits(), import_timeout_s=60)
    try:
        for _ in range(5):
            os.kill(process.pid, signal.SIGINT)
            time.sleep(0.1)
        process.connection.poll(60)
        process.finish_loading()
        assert process.phase is Phase.IDLE
    finally:
        process.kill()


def test_hung_samples_on_two_processes_cost_one_timeout_not_two(tmp_path):
    """Each busy process has its own deadline, and a timed-out one is replaced while the others go on: a
    replacement that waited for its import (1.5 s here, as a scorer importing a heavy library takes) before
    the next deadline was looked at made the second timeout cost its own time."""
    path = write_reward_file(tmp_path, """
        import time
        time.sleep(1.5)

        def hangs_on_slow(data_source, solution_str, ground_truth, extra_info=None):
            if solution_str == "slow":
                time.sleep(600)
            return 1.0
    """)
    timeout_s = 3.0
    executor = RewardExecutor(f"{path}:hangs_on_slow", timeout_s=timeout_s, num_workers=2)
    try:
        started = time.monotonic()
        results = executor.score(requests("slow", "slow"))
        elapsed = time.monotonic() - started
        assert [result.failure for result in results] == [Failure.TIMEOUT, Failure.TIMEOUT]
        # One after the other, or waiting for each replacement's import, takes >= 2 x timeout_s.
        assert elapsed < 2 * timeout_s
        assert executor.metrics()["reward/num_timeouts"] == 2
        assert scores(executor.score(requests("fast", "fast"))) == [1.0, 1.0]
    finally:
        executor.close()


class Interrupted(Exception):
    pass


def interrupt(signal_number, frame):
    raise Interrupted


def test_a_score_call_interrupted_midway_leaves_no_stale_answer_for_the_next(scorers):
    """A KeyboardInterrupt (a second Ctrl-C) out of `score` leaves processes busy with requests of no batch;
    the next call must neither wait for nor take their answers (here for indexes it does not have)."""
    executor = RewardExecutor(f"{scorers}:sleeps_then_scores_length", timeout_s=30, num_workers=2)
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(Interrupted):
            executor.score(requests("slow-first", "slow-second"))
        signal.setitimer(signal.ITIMER_REAL, 0)
        assert scores(executor.score(requests("abc"))) == [3.0]
        assert executor.metrics()["reward/num_restarts"] == 2
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        executor.close()


def test_a_process_dying_mid_chunk_loses_only_the_sample_it_was_scoring(scorers):
    """One process takes several requests at once (here two: four requests, one process); the one it dies on
    scores 0 with the exit named, the rest of its chunk is sent again to the replacement and scored."""
    executor = RewardExecutor(f"{scorers}:exits_on_die", timeout_s=30)
    try:
        results = executor.score(requests("die", "yes", "yes", "no"))
        assert scores(results) == [0.0, 1.0, 1.0, 0.0]
        assert results[0].error == "scoring process died: it exited with code 3"
        assert [result.error for result in results[1:]] == [None, None, None]
        assert executor.metrics()["reward/num_errors"] == 1 and executor.metrics()["reward/num_restarts"] == 1
    finally:
        executor.close()


def test_each_sample_of_a_chunk_has_its_own_deadline(scorers):
    """A hung first sample times out after timeout_s; the samples after it in its chunk are not charged for it:
    they are sent again and score."""
    executor = RewardExecutor(f"{scorers}:hangs_on_slow", timeout_s=3)
    try:
        results = executor.score(requests("slow", "fast", "fast"))
        assert scores(results) == [0.0, 1.0, 1.0]
        assert results[0].error == "timeout after 3s"
        assert executor.metrics()["reward/num_timeouts"] == 1
    finally:
        executor.close()


def test_max_batch_s_bounds_a_whole_batch(scorers):
    executor = RewardExecutor(f"{scorers}:hangs_on_slow", timeout_s=120, max_batch_s=2)
    try:
        started = time.monotonic()
        results = executor.score(requests("fast", "slow", "fast", "fast"))
        assert time.monotonic() - started < 60  # the per-sample timeout alone would take 120 s
        assert scores(results) == [1.0, 0.0, 0.0, 0.0]
        assert all(result.error == "timeout: the batch ran past max_batch_s=2s" for result in results[1:])
        assert executor.metrics()["reward/num_timeouts"] == 3
        assert scores(executor.score(requests("fast", "fast"))) == [1.0, 1.0]
    finally:
        executor.close()


def test_a_scorer_allocating_past_the_memory_limit_scores_zero_and_the_run_goes_on(scorers):
    executor = RewardExecutor(f"{scorers}:allocates", timeout_s=30, max_memory_mb=256)
    try:
        results = executor.score(requests("small", "huge", "small"))
        assert scores(results) == [1.0, 0.0, 1.0]
        assert results[1].failure is Failure.ERROR
        assert results[1].error == ("MemoryError (past this scoring process's memory limit, max_memory_mb=256)")
        assert executor.metrics()["reward/num_errors"] == 1
    finally:
        executor.close()


def test_a_scorer_past_its_cpu_limit_is_stopped_scores_zero_and_is_replaced(scorers):
    executor = RewardExecutor(f"{scorers}:spins", timeout_s=120, max_cpu_s=1)
    try:
        results = executor.score(requests("fast", "spin", "fast"))
        assert scores(results) == [1.0, 0.0, 1.0]
        assert results[1].error == ("scoring process died: it was killed by SIGXCPU: it used more than its CPU "
                                    "limit (max_cpu_s=1) on this sample")
        assert executor.metrics()["reward/num_restarts"] == 1
    finally:
        executor.close()


def test_num_workers_is_bounded_with_a_warning(scorers, caplog):
    bound = MAX_WORKERS_PER_CPU * available_cpus()
    with caplog.at_level(logging.WARNING, logger="asyncrl.rewards.executor"):
        executor = RewardExecutor(f"{scorers}:exact", timeout_s=10, num_workers=bound + 1000)
    try:
        assert len(executor.pids()) == bound
        assert f"reward num_workers={bound + 1000} is more than {MAX_WORKERS_PER_CPU} scoring processes per CPU" \
            in caplog.text
    finally:
        executor.close()
    with pytest.raises(ValueError, match="reward num_workers must be >= 1, got 0"):
        RewardExecutor(f"{scorers}:exact", timeout_s=10, num_workers=0)


def test_close_stops_every_scoring_process_even_a_hung_one(scorers):
    executor = RewardExecutor(f"{scorers}:hangs_on_slow", timeout_s=120, num_workers=2, max_batch_s=1)
    executor.score(requests("slow", "fast"))
    pids = executor.pids()
    executor.close()
    for pid in pids:
        wait_until_dead(pid, within_s=10)
    with pytest.raises(RuntimeError, match="is closed"):
        executor.score(requests("fast"))
