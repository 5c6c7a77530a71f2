"""What the teacher says about one sampled response: its log-prob of each response token, or why it could not."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

TIMEOUT = "timeout"   # the actor was past algorithm.distillation.timeout_s
ERROR = "error"       # the actor raised or died


@dataclass(frozen=True)
class TeacherScore:
    log_probs: Optional[np.ndarray] = None   # (R,) float32: log p_teacher of each response token; None if it failed
    failure: str = ""                         # "" when scored, else TIMEOUT or ERROR
    message: str = ""                         # the failure's text

    @property
    def is_scored(self) -> bool:
        return self.log_probs is not None

    @classmethod
    def failed(cls, failure: str, message: str) -> "TeacherScore":
        return cls(None, failure, message)
