"""The order in which training prompts are visited, resumable exactly.

    sampler = PromptSampler(len(dataset), shuffle=True, seed=1, total_epochs=2)
    index = sampler.next_index()          # None when every epoch is done
    state = sampler.state_dict(); ...; sampler.load_state_dict(state)

Epoch e's permutation depends only on (seed, e), so a restored sampler yields exactly the prompts the
original had not yet yielded, in the same order. The sampler hands out one index at a time, so callers
that take batches cross epoch boundaries without a gap.
"""

from __future__ import annotations

from typing import Optional

import numpy as np


class PromptSampler:
    def __init__(self, num_prompts: int, shuffle: bool, seed: int, total_epochs: int):
        if num_prompts <= 0:
            raise ValueError(f"PromptSampler needs at least one prompt, got {num_prompts}")
        self.num_prompts = num_prompts
        self.shuffle = shuffle
        self.seed = seed
        self.total_epochs = total_epochs
        self.epoch = 0
        self.position = 0
        self.order = self.epoch_order(0)

    def epoch_order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.num_prompts)
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_prompts)

    def next_index(self) -> Optional[int]:
        if self.position == self.num_prompts:
            if self.epoch + 1 >= self.total_epochs:
                return None
            self.epoch += 1
            self.position = 0
            self.order = self.epoch_order(self.epoch)
        index = int(self.order[self.position])
        self.position += 1
        return index

    def next_batch(self, size: int) -> list[int]:
        """Up to `size` indices (fewer only at the very end of the run)."""
        batch = []
        while len(batch) < size:
            index = self.next_index()
            if index is None:
                break
            batch.append(index)
        return batch

    @property
    def is_exhausted(self) -> bool:
        return self.position == self.num_prompts and self.epoch + 1 >= self.total_epochs

    @property
    def num_remaining(self) -> int:
        return (self.total_epochs - self.epoch) * self.num_prompts - self.position

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "num_prompts": self.num_prompts}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["num_prompts"] != self.num_prompts or state["seed"] != self.seed:
            raise ValueError(f"sampler state is for {state['num_prompts']} prompts with seed {state['seed']}, "
                             f"this sampler has {self.num_prompts} prompts with seed {self.seed}")
        self.epoch = state["epoch"]
        self.position = state["position"]
        self.order = self.epoch_order(self.epoch)
