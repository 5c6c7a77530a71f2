"""Shared pieces of the trainer tests: a tiny model, a deterministic batch, and multi-process runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from asyncrl.bench.trainer_ranks import run_ranks
from asyncrl.config import load_config
from asyncrl.train import TrainBatch


def trainer_config(model_path: Path, *overrides: str):
    return load_config(None, [
        f"model.path={model_path}", "trainer.device=cpu", "data.train_batch_size=6", "rollout.n=2",
        "actor.ppo_mini_batch_size=2", "actor.ppo_micro_batch_size_per_gpu=2", "actor.optim.lr=1e-2",
        "actor.optim.weight_decay=0.0", "actor.shuffle=false", "critic.ppo_mini_batch_size=2",
        "critic.ppo_micro_batch_size_per_gpu=2", "critic.optim.lr=1e-2", "data.max_response_length=8",
        *overrides])


def make_batch(seed: int = 0, num_prompts: int = 6, group_size: int = 2) -> TrainBatch:
    """Prompts of 2-5 tokens, responses of 1-6 tokens, with advantages, old log-probs, values, returns."""
    generator = torch.Generator().manual_seed(seed)
    prompts, responses, group_ids = [], [], []
    for prompt_index in range(num_prompts):
        prompt = torch.randint(6, 90, (int(torch.randint(2, 6, (1,), generator=generator)),), generator=generator)
        for _ in range(group_size):
            length = int(torch.randint(1, 7, (1,), generator=generator))
            prompts.append(prompt.tolist())
            responses.append(torch.randint(6, 90, (length,), generator=generator).tolist())
            group_ids.append(prompt_index)
    batch = TrainBatch.from_sequences(prompts, responses, group_ids)
    mask = batch.response_mask
    scores = torch.randn(batch.num_rows, generator=generator)
    return batch.replace(
        advantages=scores[:, None] * mask,
        old_log_probs=(-4.5 + 0.1 * torch.randn(mask.shape, generator=generator)) * mask,
        values=0.1 * torch.randn(mask.shape, generator=generator) * mask,
        returns=scores[:, None] * mask)


def run_in_processes(function: Callable[..., Any], world_size: int, *args: Any) -> list[Any]:
    """Run function(rank, world_size, port, *args) in `world_size` fresh processes, one thread each (the
    equivalence tests compare ranks' float results); their return values."""
    return run_ranks(function, world_size, *args, timeout_s=300, num_threads=1)
