"""Reward functions: the verl-compatible protocol, built-in scorers, user functions, safe execution.

User reward code runs only in scoring processes: `check_reward_function` loads it in one under a time limit
(for the composition root, before Ray starts), and `RewardExecutor` scores with a pool of them. A reward model
or generative judge runs in Ray actors (`RewardModelPool`); `Scorer` combines its score with the rule's.
"""

from asyncrl.rewards.executor import RewardExecutor
from asyncrl.rewards.loader import RewardLoadError
from asyncrl.rewards.protocol import Failure, RewardFn, RewardRequest, RewardResult
from asyncrl.rewards.reward_model_pool import RewardModelPool, check_reward_model
from asyncrl.rewards.scorer import Scorer
from asyncrl.rewards.startup import check_reward_function

__all__ = ["Failure", "RewardExecutor", "RewardFn", "RewardLoadError", "RewardModelPool", "RewardRequest",
           "RewardResult", "Scorer", "check_reward_function", "check_reward_model"]
