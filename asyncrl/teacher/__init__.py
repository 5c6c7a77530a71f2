"""The distillation teacher (algorithm.distillation): a model that scores the student's sampled tokens.

    check_teacher(config, tokenizer, tokenizer_folder)     # before Ray: the folder, and the same tokenizer
    pool = TeacherPool.launch(config)                      # after Ray: the actors load while the run starts
    pending = pool.start(samples)                          # dispatched at once, split among the actors
    scores = pool.collect(pending)                         # one TeacherScore per sample, in order

`TeacherModel` does the scoring in a process (a forward pass, log-probs of the given tokens), `TeacherWorker`
serves one in a Ray actor, and `TeacherPool` is the client with deadlines and failure counts.
"""

from asyncrl.teacher.check import check_teacher
from asyncrl.teacher.model import TeacherModel
from asyncrl.teacher.pool import PendingTeacher, TeacherPool
from asyncrl.teacher.records import TeacherScore

__all__ = ["PendingTeacher", "TeacherModel", "TeacherPool", "TeacherScore", "check_teacher"]
