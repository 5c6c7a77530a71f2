"""The Ray actor that serves one teacher model to `TeacherPool`.

    worker = TeacherWorker.options(num_cpus=0.1).remote(config.algorithm.distillation, temperature, "cpu", 1)
    log_probs = wait_for(worker.score.remote(rows), "teacher/replica0", "score", timeout_s)

The model loads in the constructor; `ping` answers once it has. Scoring runs on the actor's one thread.
"""

from __future__ import annotations

import os

import numpy as np
import ray
import torch

from asyncrl.config.distillation_schema import DistillationConfig
from asyncrl.teacher.model import TeacherModel
from asyncrl.teacher.records import TeacherScore


@ray.remote
class TeacherWorker:
    def __init__(self, config: DistillationConfig, temperature: float, device: str, num_threads: int):
        torch.set_num_threads(num_threads)
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        self.model = TeacherModel(config.teacher_path, device, dtype, temperature, config.micro_batch_size_per_gpu)

    def ping(self) -> int:
        """The actor's process id, once the model has loaded."""
        return os.getpid()

    def score(self, rows: list[tuple[np.ndarray, np.ndarray]]) -> list[TeacherScore]:
        return [TeacherScore(log_probs) for log_probs in self.model.score(rows)]
