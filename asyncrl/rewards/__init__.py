"""Reward functions: the verl-compatible protocol, built-in scorers, user functions, safe execution."""

from asyncrl.rewards.executor import RewardExecutor
from asyncrl.rewards.loader import RewardLoadError, load_reward_function
from asyncrl.rewards.protocol import RewardFn, RewardRequest, RewardResult

__all__ = ["RewardExecutor", "RewardFn", "RewardLoadError", "RewardRequest", "RewardResult", "load_reward_function"]
