"""Typed configuration: `load_config(path, overrides)` returns a validated `AsyncRLConfig`."""

from asyncrl.config.errors import ConfigError
from asyncrl.config.invariants import needs_critic, needs_reference
from asyncrl.config.loader import dump_config, load_config
from asyncrl.config.schema import (ActorConfig, AlgorithmConfig, AsyncRLConfig, AsyncTrainingConfig, CriticConfig,
                                   DataConfig, ModelConfig, RolloutConfig, RolloutCorrectionConfig, TrainerConfig)

__all__ = [
    "ActorConfig", "AlgorithmConfig", "AsyncRLConfig", "AsyncTrainingConfig", "ConfigError", "CriticConfig",
    "DataConfig", "ModelConfig", "RolloutConfig", "RolloutCorrectionConfig", "TrainerConfig", "dump_config",
    "load_config", "needs_critic", "needs_reference",
]
