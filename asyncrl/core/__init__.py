"""The reusable PPO core: typed records, the stages, the trainer group and rollout handles."""

from asyncrl.core.records import Sample, samples_to_batch
from asyncrl.core.stages import PPOCore

__all__ = ["PPOCore", "Sample", "samples_to_batch"]
