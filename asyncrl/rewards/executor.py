"""Score samples in scoring processes, each sample under a time limit, so no scorer can stop a run.

    executor = RewardExecutor("my_reward.py:compute_score", timeout_s=10, num_workers=2)
    results = executor.score([RewardRequest(data_source, text, ground_truth, extra_info), ...])
    executor.metrics()   # {"reward/num_scored": ..., "reward/num_errors": ..., "reward/num_timeouts": ..., ...}
    executor.close()

The constructor starts the scoring processes and waits until each has loaded the function (within
`import_timeout_s`), so an executor that exists can score, and one built before Ray starts is that run's check
of the reward file: a module that hangs, exits or raises at import raises `RewardLoadError` naming it. No
reward code runs in the caller's process. `check_reward_function` (asyncrl.rewards.startup) is the same check
without keeping the processes.

A sample whose function raises, returns garbage or a non-finite number, kills its process or runs past
`timeout_s` scores 0 and is counted. Every busy process has its own deadline and all are waited on together,
so hung samples on different processes cost one timeout, not one each; `max_batch_s` bounds a whole `score`
call from the moment a process can score (every sample not scored by then scores 0 as a timeout). A process that timed out or died, busy or idle,
is replaced without stopping the others; a sample whose process had died before it was sent is sent again.
Requests go to a process a chunk at a time and come back one by one, so cheap samples cost few round trips; the
samples of a chunk after the one its process died or hung on are sent again, not charged.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Optional

from asyncrl.config.reward_schema import RewardConfig
from asyncrl.rewards.limits import ScoringLimits
from asyncrl.rewards.process import Phase, Scored, ScoringProcess, stop_all
from asyncrl.rewards.protocol import Failure, RewardRequest, RewardResult
from asyncrl.rewards.startup import DEFAULT_IMPORT_TIMEOUT_S, spawn_context, start_scoring_processes

logger = logging.getLogger(__name__)

# Requests sent to a process at once: enough to amortize a round trip over cheap samples; a chunk's samples
# are scored one after another, so a larger one only evens out worse across processes.
MAX_CHUNK = 32

# More scoring processes than this per CPU only adds memory and start-up time: scorers are CPU-bound, and an
# I/O-bound one (a remote judge) is better written as `async def`.
MAX_WORKERS_PER_CPU = 4


def available_cpus() -> int:
    # The CPUs this process may run on (a container's or a job's share) where the OS says; else the host's.
    return len(os.sched_getaffinity(0)) if sys.platform == "linux" else (os.cpu_count() or 1)


def bounded_num_workers(num_workers: int) -> int:
    if num_workers < 1:
        raise ValueError(f"reward num_workers must be >= 1, got {num_workers}")
    num_cpus = available_cpus()
    bound = MAX_WORKERS_PER_CPU * num_cpus
    if num_workers > bound:
        logger.warning("reward num_workers=%d is more than %d scoring processes per CPU on this host (%d CPUs); "
                       "starting %d", num_workers, MAX_WORKERS_PER_CPU, num_cpus, bound)
        return bound
    return num_workers


@dataclass
class RewardCounters:
    """Cumulative since the executor started. A non-finite score is an error, and is also counted on its own."""
    num_scored: int = 0
    num_errors: int = 0
    num_nonfinite: int = 0
    num_timeouts: int = 0
    num_restarts: int = 0   # processes replaced after a timeout or a death (idle deaths cost no sample)

    def count(self, result: RewardResult) -> None:
        self.num_scored += 1
        self.num_errors += result.failure in (Failure.ERROR, Failure.NONFINITE)
        self.num_nonfinite += result.failure is Failure.NONFINITE
        self.num_timeouts += result.failure is Failure.TIMEOUT

    def as_metrics(self) -> dict[str, float]:
        return {"reward/num_scored": self.num_scored, "reward/num_errors": self.num_errors,
                "reward/num_nonfinite": self.num_nonfinite, "reward/num_timeouts": self.num_timeouts,
                "reward/num_restarts": self.num_restarts}


class RewardExecutor:
    """A pool of scoring processes for one reward function.

    timeout_s         wall time per sample
    num_workers       scoring processes, at most MAX_WORKERS_PER_CPU per available CPU (more: a warning)
    import_timeout_s  wall time for a process to start and load the function
    max_batch_s       wall time per `score` call; None: unbounded (ceil(samples / workers) x timeout_s at worst)
    max_memory_mb     memory a process may allocate beyond its start-up (see ScoringLimits); None: unlimited
    max_cpu_s         CPU seconds per sample; None: unlimited
    """

    @classmethod
    def from_config(cls, config: RewardConfig) -> "RewardExecutor":
        """The executor a run's `reward.*` keys describe (starts and checks its scoring processes)."""
        return cls(config.custom_function, config.timeout_s, config.num_workers,
                   import_timeout_s=config.import_timeout_s, max_batch_s=config.max_batch_s,
                   max_memory_mb=config.max_memory_mb, max_cpu_s=config.max_cpu_s)

    def __init__(self, spec: str, timeout_s: float, num_workers: int = 1, *,
                 import_timeout_s: float = DEFAULT_IMPORT_TIMEOUT_S, max_batch_s: Optional[float] = None,
                 max_memory_mb: Optional[float] = None, max_cpu_s: Optional[float] = None):
        for name, value in (("timeout_s", timeout_s), ("import_timeout_s", import_timeout_s),
                            ("max_batch_s", max_batch_s)):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"reward {name} must be a positive number, got {value}")
        self.spec = spec
        self.timeout_s = timeout_s
        self.import_timeout_s = import_timeout_s
        self.max_batch_s = max_batch_s
        self.limits = ScoringLimits(max_memory_mb=max_memory_mb, max_cpu_s=max_cpu_s)
        self.context = spawn_context()
        self.counters = RewardCounters()
        self.processes = start_scoring_processes(spec, bounded_num_workers(num_workers), self.limits,
                                                 import_timeout_s)

    def pids(self) -> list[int]:
        """The scoring processes' ids, for logs and fault tests."""
        return [process.pid for process in self.processes]

    def score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        """Scores in request order."""
        if not self.processes:
            raise RuntimeError(f"reward executor for {self.spec or 'the built-in scorer'} is closed")
        for slot, process in enumerate(self.processes):
            if process.phase is Phase.BUSY:  # left by a call that was interrupted: its answer belongs to no request
                self.replace(slot)
        results: list[Optional[RewardResult]] = [None] * len(requests)
        waiting = deque(range(len(requests)))
        batch_deadline = math.inf
        while waiting or self.busy():
            if batch_deadline == math.inf:
                batch_deadline = self.batch_deadline()
            self.dispatch(waiting, requests)
            self.wait_for_any(batch_deadline)
            for slot, process in enumerate(self.processes):
                self.collect(slot, process, results, waiting)
            if time.monotonic() >= batch_deadline:
                self.abandon(waiting, results)
        for result in results:
            self.counters.count(result)
        return results

    def batch_deadline(self) -> float:
        """`max_batch_s` from now once a process can score; until then (every one replaced and still loading,
        which `import_timeout_s` bounds) the batch's time has not started."""
        if self.max_batch_s is None or all(process.phase is Phase.LOADING for process in self.processes):
            return math.inf
        return time.monotonic() + self.max_batch_s

    def busy(self) -> list[ScoringProcess]:
        return [process for process in self.processes if process.phase is Phase.BUSY]

    def dispatch(self, waiting: deque[int], requests: list[RewardRequest]) -> None:
        """A chunk of the waiting requests to each idle process: a share small enough that the processes finish
        together when samples cost alike, large enough that cheap samples cost few round trips."""
        size = max(1, min(MAX_CHUNK, math.ceil(len(waiting) / (2 * len(self.processes)))))
        for slot, process in enumerate(self.processes):
            if not waiting or process.phase is not Phase.IDLE:
                continue
            chunk = [waiting[position] for position in range(min(size, len(waiting)))]
            if process.submit([(index, requests[index]) for index in chunk], self.timeout_s):
                for _ in chunk:
                    waiting.popleft()
            else:  # it died while idle: the requests stay first in line for the next process that is ready
                self.replace_dead_idle(slot)

    def replace_dead_idle(self, slot: int) -> None:
        process = self.processes[slot]
        logger.warning("scoring process %d of %s %s while idle; starting another", process.pid,
                       self.spec or "the built-in scorer", process.exit_description())
        self.replace(slot)

    def wait_for_any(self, batch_deadline: float) -> None:
        """Until a busy or loading process answers, or the earliest deadline (a sample's, an import's or the
        batch's) passes."""
        watched = [process for process in self.processes if process.phase is not Phase.IDLE]
        if not watched:
            return
        deadline = min(batch_deadline, *(process.deadline for process in watched))
        wait([process.connection for process in watched], timeout=max(0.0, deadline - time.monotonic()))

    def collect(self, slot: int, process: ScoringProcess, results: list[Optional[RewardResult]],
                waiting: deque[int]) -> None:
        """Take a result, a finished load, a death or a passed deadline from one process."""
        is_readable = process.connection.poll()
        if not is_readable and time.monotonic() < process.deadline:
            return
        if process.phase is Phase.LOADING:
            process.finish_loading()  # a replacement that can no longer load the function: RewardLoadError
        elif process.phase is Phase.BUSY:
            self.take_scores(slot, process, results, waiting, is_readable)

    def take_scores(self, slot: int, process: ScoringProcess, results: list[Optional[RewardResult]],
                    waiting: deque[int], is_readable: bool) -> None:
        """Every result a busy process has sent; on its death or a passed deadline the sample it was scoring
        scores 0, the rest of its chunk goes back to the front of the line, and it is replaced."""
        while is_readable:
            message = process.receive()
            if message is None:
                if not process.taken:  # it was dying when the chunk was sent: send all of it again
                    waiting.extendleft(reversed(process.pending))
                    self.replace_dead_idle(slot)
                    return
                self.lose_first(slot, process, results, waiting, process.died_result())
                return
            if isinstance(message, Scored):
                results[message.task_index] = message.result
            if process.phase is Phase.IDLE:
                return
            is_readable = process.connection.poll()
        if time.monotonic() >= process.deadline:
            self.lose_first(slot, process, results, waiting,
                            RewardResult.failed(Failure.TIMEOUT, f"timeout after {self.timeout_s:g}s"))

    def lose_first(self, slot: int, process: ScoringProcess, results: list[Optional[RewardResult]],
                   waiting: deque[int], result: RewardResult) -> None:
        pending = list(process.pending)
        results[pending[0]] = result
        waiting.extendleft(reversed(pending[1:]))
        self.replace(slot)

    def abandon(self, waiting: deque[int], results: list[Optional[RewardResult]]) -> None:
        """Past `max_batch_s`: every sample not scored yet scores 0 as a timeout; busy processes are replaced."""
        timeout = RewardResult.failed(Failure.TIMEOUT, f"timeout: the batch ran past max_batch_s={self.max_batch_s:g}s")
        for index in waiting:
            results[index] = timeout
        waiting.clear()
        for slot, process in enumerate(self.processes):
            if process.phase is Phase.BUSY:
                for index in process.pending:
                    results[index] = timeout
                self.replace(slot)

    def replace(self, slot: int) -> None:
        """Kill the process in `slot` and start another; it loads while the others go on scoring."""
        self.processes[slot].kill()
        self.processes[slot] = ScoringProcess(self.context, self.spec, self.limits, self.import_timeout_s)
        self.counters.num_restarts += 1

    def metrics(self) -> dict[str, float]:
        """Cumulative counters since the executor started."""
        return self.counters.as_metrics()

    def close(self) -> None:
        stop_all(self.processes)
        self.processes = []
