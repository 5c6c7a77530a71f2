"""The weights a server should hold, computed by asyncrl's own transformer (the trainer's) in fp32 on the CPU: the
yardstick `asyncrl check-server` holds a server's token ids and log-probs against.

    reference = ReferenceModel("path/to/model")
    prompt = reference.encode("12+34=")
    reference.log_probs(prompt, response_ids, temperature=0.7)    # (R,) each token's log-prob given those before
    changed = reference.perturbed("work/changed", seed=0)          # a copy with other weights, for the reload checks
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import torch

from asyncrl.models import iter_named_tensors, load_model, load_tokenizer, save_model

# Noise added to every tensor of the perturbed copy, as a share of the tensor's own spread: enough to move
# log-probs by far more than any tolerance, small enough to keep the model's outputs finite.
PERTURBATION_SCALE = 0.5


class ReferenceModel:
    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.model = load_model(self.folder, torch.float32, "cpu").eval()
        self.tokenizer = load_tokenizer(self.folder)
        self.vocab_size = self.model.config.vocab_size
        self.max_model_len = self.model.config.max_position_embeddings
        self.special_ids = sorted(set(self.tokenizer.all_special_ids) & set(range(self.vocab_size)))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    @torch.no_grad()
    def log_probs(self, prompt_ids: list[int], response_ids: list[int], temperature: float) -> np.ndarray:
        """(R,) log-prob of each response token under softmax(logits / temperature), as the trainer computes it."""
        if not response_ids:
            return np.zeros(0, np.float32)
        ids = torch.tensor([list(prompt_ids) + list(response_ids)])                 # (1, P + R)
        hidden = self.model(ids, torch.arange(ids.shape[1])[None])                    # (1, P + R, hidden)
        start = len(prompt_ids) - 1
        logits = self.model.compute_logits(hidden[0, start:start + len(response_ids)])  # (R, V)
        log_probs = torch.log_softmax(logits / temperature, dim=-1)
        return log_probs.gather(1, torch.tensor(response_ids)[:, None])[:, 0].numpy()

    def perturbed(self, folder: str | Path, seed: int) -> "ReferenceModel":
        """A copy of this model (tokenizer included) whose every tensor has noise added, written to `folder`."""
        folder = Path(folder)
        if folder.exists():
            shutil.rmtree(folder)
        model = load_model(self.folder, torch.float32, "cpu")
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for _, tensor in iter_named_tensors(model):
                noise = torch.randn(tensor.shape, generator=generator)
                tensor.add_(noise * PERTURBATION_SCALE * tensor.float().std().clamp_min(1e-3))
        save_model(model, folder, tokenizer_folder=self.folder)
        return ReferenceModel(folder)
