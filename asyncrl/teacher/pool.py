"""The client of the teacher actors: splits a batch of responses among them, waits with a deadline, never fails
a run.

    pool = TeacherPool.launch(config)                      # after Ray: the actors load while the run starts
    pool.wait_ready(timeout_s)                             # each actor loaded its model, or the error names it
    pending = pool.start(rows)                             # (prompt_ids, response_ids) per response; returns at once
    scores = pool.collect(pending)                         # one TeacherScore per row, in order

A call's rows are split into contiguous shares, one per actor. A share whose actor is past
`algorithm.distillation.timeout_s` (counted from `start`) fails as timeouts and the actor is restarted (Ray
reloads its model); one whose actor raised or died fails as errors. A failed row gets no distillation signal;
the core counts them per step (`distillation/teacher_timeouts`, `distillation/teacher_errors`) and the run goes
on. The pool is plain data plus actor handles, so the composition root hands it to the fully-async rollouter.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import ray

from asyncrl.config import AsyncRLConfig
from asyncrl.config.distillation_schema import DistillationConfig
from asyncrl.remote import collect_shares, contiguous_shares, wait_for_all, worker_name
from asyncrl.teacher.records import ERROR, TIMEOUT, TeacherScore
from asyncrl.teacher.worker import TeacherWorker

POOL_NAME = "teacher"


@dataclass
class PendingTeacher:
    """A dispatched call: actor i's share of the rows (begin, end) and its result ref, at index i."""
    refs: list[ray.ObjectRef]
    shares: list[tuple[int, int]]
    deadline: float


class TeacherPool:
    def __init__(self, actors: list, config: DistillationConfig):
        self.actors = actors
        self.config = config
        self.names = [worker_name(POOL_NAME, index) for index in range(len(actors))]

    @classmethod
    def launch(cls, config: AsyncRLConfig) -> "TeacherPool":
        """Starts the teacher actors without waiting for them; Ray restarts one that dies or is killed."""
        settings = config.algorithm.distillation
        device = "cuda" if settings.num_gpus_per_worker > 0 else "cpu"
        threads = max(1, int(settings.num_cpus_per_worker))
        actors = [TeacherWorker.options(num_cpus=settings.num_cpus_per_worker, num_gpus=settings.num_gpus_per_worker,
                                        max_restarts=-1, max_task_retries=0).remote(
                      settings, config.rollout.temperature, device, threads)
                  for _ in range(settings.num_workers)]
        return cls(actors, settings)

    def wait_ready(self, timeout_s: float) -> list[int]:
        """Each actor's process id once its model has loaded; a load failure raises RemoteCallError naming it."""
        return wait_for_all([actor.ping.remote() for actor in self.actors], self.names, "load", timeout_s)

    def start(self, rows: list[tuple[np.ndarray, np.ndarray]]) -> PendingTeacher:
        shares = contiguous_shares(len(rows), len(self.actors))
        refs = [self.actors[index].score.remote(rows[begin:end]) for index, (begin, end) in enumerate(shares)]
        return PendingTeacher(refs, shares, time.monotonic() + self.config.timeout_s)

    def collect(self, pending: PendingTeacher) -> list[TeacherScore]:
        """The scores in row order; a share past the deadline, or whose actor failed, fails (no log-probs)."""
        return collect_shares(pending.refs, pending.shares, self.actors, self.names, "score", pending.deadline,
                              lambda timed_out, message: TeacherScore.failed(TIMEOUT if timed_out else ERROR, message))
