"""A teacher model in this process: token ids in, the teacher's log-prob of every response token out.

    teacher = TeacherModel("teacher-folder", device="cpu", temperature=1.0, micro_batch_size=32)
    log_probs = teacher.score([(prompt_ids, response_ids), ...])    # one (R,) float32 array per response

The log-probs are the trainer's: `log_softmax(logits / temperature)` at the tokens the student sampled, with the
student's temperature (rollout.temperature), so the two policies are compared as the engine samples from them.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from asyncrl.models import CausalLM, load_model
from asyncrl.train.batch import TrainBatch
from asyncrl.train.forward import batched_log_probs


class TeacherModel:
    def __init__(self, path: str, device: str = "cpu", dtype: torch.dtype = torch.float32, temperature: float = 1.0,
                 micro_batch_size: int = 32):
        self.model: CausalLM = load_model(path, dtype=dtype, device=device).eval()
        self.model.requires_grad_(False)
        self.device = torch.device(device)
        self.temperature = temperature
        self.micro_batch_size = micro_batch_size

    def score(self, rows: Sequence[tuple[np.ndarray, np.ndarray]]) -> list[np.ndarray]:
        """The teacher's log-prob of each response token, one (len(response_ids),) float32 array per row."""
        if not rows:
            return []
        batch = TrainBatch.from_sequences([prompt.tolist() for prompt, _ in rows],
                                          [response.tolist() for _, response in rows], list(range(len(rows))))
        log_probs, _ = batched_log_probs(self.model, batch, self.temperature, self.micro_batch_size, None,
                                         with_entropy=False, device=self.device)   # (B, R)
        log_probs = log_probs.float().numpy()
        return [log_probs[index, :len(response)].copy() for index, (_, response) in enumerate(rows)]
