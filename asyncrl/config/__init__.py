"""Typed configuration: `load_config(path, overrides)` returns a validated `AsyncRLConfig`;
`check_environment(config)` checks what it asks of this machine (a CUDA device, a resume folder) before Ray."""

from asyncrl.config.environment import check_environment
from asyncrl.config.errors import ConfigError
from asyncrl.config.invariants import (needs_critic, needs_greedy_baseline, needs_reference, prompts_per_step,
                                       step_meaning)
from asyncrl.config.loader import check_named_choices, dump_config, load_config
from asyncrl.config.rollout_schema import RolloutConfig
from asyncrl.config.schema import (ActorConfig, AlgorithmConfig, AsyncRLConfig, AsyncTrainingConfig, CriticConfig,
                                   DataConfig, ModelConfig, RolloutCorrectionConfig, TrainerConfig)

__all__ = [
    "ActorConfig", "AlgorithmConfig", "AsyncRLConfig", "AsyncTrainingConfig", "ConfigError", "CriticConfig",
    "DataConfig", "ModelConfig", "RolloutConfig", "RolloutCorrectionConfig", "TrainerConfig", "check_environment",
    "check_named_choices",
    "dump_config", "load_config", "needs_critic", "needs_greedy_baseline", "needs_reference", "prompts_per_step",
    "step_meaning",
]
