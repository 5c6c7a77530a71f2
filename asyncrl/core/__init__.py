"""The reusable PPO core: typed records, the stages, the trainer ranks (their Ray actor and the driver's handle),
and the `Runtime` a recipe receives."""

from asyncrl.core.records import Sample, samples_to_batch
from asyncrl.core.runtime import Runtime
from asyncrl.core.stages import PPOCore
from asyncrl.core.trainer_group import TrainerGroup

__all__ = ["PPOCore", "Runtime", "Sample", "TrainerGroup", "samples_to_batch"]
