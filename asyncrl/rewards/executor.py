"""Score samples in worker processes, each sample under a time limit, so no scorer can stop a run.

    executor = RewardExecutor("my_reward.py:compute_score", timeout_s=10, num_workers=2)
    results = executor.score([RewardRequest(data_source, text, ground_truth, extra_info), ...])
    executor.metrics()   # {"reward/num_errors": ..., "reward/num_timeouts": ...}
    executor.close()

A scorer that raises, returns garbage, kills its process or runs past `timeout_s` gives score 0 and is
counted; a timed-out worker is killed and replaced. Workers are separate processes (spawned, so they do
not inherit torch or Ray state) because a hung Python thread cannot be stopped. A worker that cannot
start (it dies, or does not load the reward function within `startup_timeout_s`) is an environment
problem, not a bad sample: it raises, naming the function, instead of timing out sample after sample.
"""

from __future__ import annotations

import multiprocessing
import time
from multiprocessing.connection import Connection, wait

from asyncrl.rewards.loader import load_reward_function
from asyncrl.rewards.protocol import RewardRequest, RewardResult, to_result


READY = "ready"
# Spawned processes re-import the script that started the run: one without an `if __name__ == "__main__":`
# guard starts the run again in every scoring process, which then never serves.
MAIN_GUARD_HINT = ("if a script of yours starts the run, guard it with `if __name__ == \"__main__\":` "
                   "(scoring processes are spawned and re-import the main module)")


def worker_main(spec: str, connection: Connection) -> None:
    function = load_reward_function(spec)
    connection.send(READY)
    while True:
        request = connection.recv()
        if request is None:
            return
        try:
            value = function(request.data_source, request.solution_str, request.ground_truth, request.extra_info)
            result = to_result(value)
        except Exception as error:  # a user function may raise anything: it scores 0 and is counted
            result = RewardResult(score=0.0, error=f"{type(error).__name__}: {error}")
        connection.send(result)


class ScoringWorker:
    def __init__(self, context, spec: str):
        self.connection, child_end = context.Pipe()
        self.process = context.Process(target=worker_main, args=(spec, child_end), daemon=True)
        self.process.start()
        child_end.close()
        self.task_index: int | None = None
        self.deadline = 0.0

    def wait_ready(self, spec: str, timeout_s: float) -> None:
        """Block until the process loaded the reward function; raise, naming it, if it died or took longer
        than `timeout_s`."""
        try:
            if self.connection.poll(timeout_s) and self.connection.recv() == READY:
                return
            problem = f"did not load it within {timeout_s:.0f}s"
        except (EOFError, OSError):
            self.process.join(timeout=5)
            problem = f"died while loading it (exit code {self.process.exitcode})"
        self.kill()
        raise RuntimeError(f"reward function {spec}: a scoring process {problem}; {MAIN_GUARD_HINT}")

    def submit(self, task_index: int, request: RewardRequest, timeout_s: float) -> None:
        self.task_index = task_index
        self.deadline = time.monotonic() + timeout_s
        self.connection.send(request)

    def kill(self) -> None:
        self.process.kill()
        self.process.join(timeout=5)
        self.connection.close()


class RewardExecutor:
    def __init__(self, spec: str, timeout_s: float, num_workers: int = 1, startup_timeout_s: float = 120.0):
        load_reward_function(spec)  # fail now, in the caller, if the spec does not resolve
        self.spec = spec
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.num_workers = num_workers
        self.context = multiprocessing.get_context("spawn")
        self.workers: list[ScoringWorker] = []
        self.num_scored = 0
        self.num_errors = 0
        self.num_timeouts = 0
        self.last_error = ""

    def score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        """Scores in request order."""
        started = [ScoringWorker(self.context, self.spec)
                   for _ in range(min(self.num_workers, len(requests)) - len(self.workers))]
        self.workers += started  # first all started, then waited for: they load concurrently
        for worker in started:
            worker.wait_ready(self.spec, self.startup_timeout_s)
        results: list[RewardResult | None] = [None] * len(requests)
        next_task = 0
        idle = list(self.workers)
        busy: list[ScoringWorker] = []
        while next_task < len(requests) or busy:
            while idle and next_task < len(requests):
                worker = idle.pop()
                worker.submit(next_task, requests[next_task], self.timeout_s)
                busy.append(worker)
                next_task += 1
            earliest = min(worker.deadline for worker in busy)
            ready = wait([worker.connection for worker in busy], timeout=max(0.0, earliest - time.monotonic()))
            for worker in list(busy):
                if worker.connection in ready:
                    result, healthy = self.receive(worker)
                elif time.monotonic() >= worker.deadline:
                    result, healthy = RewardResult(0.0, error=f"timeout after {self.timeout_s}s"), False
                else:
                    continue
                results[worker.task_index] = result
                busy.remove(worker)
                idle.append(worker if healthy else self.replace(worker))
        self.count(results)
        return results

    def receive(self, worker: ScoringWorker) -> tuple[RewardResult, bool]:
        """The worker's result, and whether the worker can take another sample."""
        try:
            return worker.connection.recv(), True
        except (EOFError, OSError):
            worker.process.join(timeout=5)
            return RewardResult(0.0, error=f"scoring process died (exit code {worker.process.exitcode})"), False

    def replace(self, worker: ScoringWorker) -> ScoringWorker:
        worker.kill()
        fresh = ScoringWorker(self.context, self.spec)
        self.workers[self.workers.index(worker)] = fresh
        fresh.wait_ready(self.spec, self.startup_timeout_s)
        return fresh

    def count(self, results: list[RewardResult]) -> None:
        self.num_scored += len(results)
        for result in results:
            if result.error is None:
                continue
            if result.error.startswith("timeout"):
                self.num_timeouts += 1
            else:
                self.num_errors += 1
            self.last_error = result.error

    def metrics(self) -> dict[str, float]:
        """Cumulative counters since the executor started."""
        return {"reward/num_scored": self.num_scored, "reward/num_errors": self.num_errors,
                "reward/num_timeouts": self.num_timeouts}

    def close(self) -> None:
        for worker in self.workers:
            try:
                worker.connection.send(None)
            except (BrokenPipeError, OSError):
                pass
            worker.process.join(timeout=2)
            if worker.process.is_alive():
                worker.kill()
        self.workers = []
