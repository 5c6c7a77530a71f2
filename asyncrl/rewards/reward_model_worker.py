"""The Ray actor that serves one reward model or judge (reward.model.kind) to `RewardModelPool`.

    worker = RewardModelWorker.options(num_cpus=0.1).remote(config.reward.model, "cpu", num_threads=1)
    results = wait_for(worker.score.remote(requests), "reward_model/replica0", "score", timeout_s)

The model loads in the constructor; `ping` answers once it has. Scoring runs on the actor's one thread, a
call's batch at a time.
"""

from __future__ import annotations

import os

import ray
import torch

from asyncrl.config.reward_schema import RewardModelConfig
from asyncrl.rewards.judge import GenerativeJudge
from asyncrl.rewards.protocol import RewardRequest, RewardResult
from asyncrl.rewards.reward_model import DiscriminativeRewardModel


def build_reward_model(config: RewardModelConfig, device: str) -> DiscriminativeRewardModel | GenerativeJudge:
    """The scorer `config.kind` names, on `device` (bfloat16 on CUDA, float32 on CPU)."""
    if config.kind == "discriminative":
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        return DiscriminativeRewardModel(config.path, device, dtype, config.micro_batch_size_per_gpu,
                                         config.max_length)
    # The judge's KV cache takes a share of the device memory in proportion to its share of the device.
    return GenerativeJudge(config.path, config.prompt_template, config.answer_parser, config.max_new_tokens,
                           device, config.max_length, max(0.05, 0.8 * config.num_gpus_per_worker))


@ray.remote
class RewardModelWorker:
    def __init__(self, config: RewardModelConfig, device: str, num_threads: int):
        torch.set_num_threads(num_threads)
        self.model = build_reward_model(config, device)

    def ping(self) -> int:
        """The actor's process id, once the model has loaded."""
        return os.getpid()

    def score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        return self.model.score(requests)
