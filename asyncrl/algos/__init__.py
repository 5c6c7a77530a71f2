"""Pure tensor functions of RL post-training: advantages, policy and value losses, loss aggregation, KL,
entropy, rollout correction and reward shaping (the overlong penalty). Imports nothing but torch; every function
documents its tensor shapes (B = responses, T = padded response length) and returns ``(result, metrics)`` where it has metrics.

Each family that a config chooses by name is a `Registry` (`asyncrl/registry.py`) whose entries carry their own
metadata: ADVANTAGE_ESTIMATORS, POLICY_LOSSES, KL_ESTIMATORS, LOSS_AGG_MODES, CORRECTION_LEVELS,
REJECTION_LEVELS, and the named settings of the rollout correction, ROLLOUT_CORRECTION_PRESETS.
"""

from asyncrl.algos.advantages import ADVANTAGE_ESTIMATORS, AdvantageEstimatorSpec, AdvantageKnobs
from asyncrl.algos.aggregation import LOSS_AGG_MODES, aggregate_loss, count_sequences
from asyncrl.algos.correction_presets import ROLLOUT_CORRECTION_PRESETS, RolloutCorrectionPreset
from asyncrl.algos.entropy import entropy_from_logits
from asyncrl.algos.kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    kl_penalty,
)
from asyncrl.algos.masked import masked_mean, masked_sum, masked_whiten
from asyncrl.algos.moe import RoutingStatistics, balance_coefficient, load_balancing_loss, routing_statistics
from asyncrl.algos.overlong import overlong_penalty
from asyncrl.algos.policy_losses import POLICY_LOSSES, PolicyLossKnobs, PolicyLossSpec
from asyncrl.algos.rollout_correction import (
    CORRECTION_LEVELS,
    REJECTION_LEVELS,
    RejectionLevelSpec,
    compute_bypass_correction,
    compute_rollout_correction,
)
from asyncrl.algos.value_loss import explained_variance, value_loss

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AdaptiveKLController",
    "AdvantageEstimatorSpec",
    "AdvantageKnobs",
    "CORRECTION_LEVELS",
    "FixedKLController",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "PolicyLossKnobs",
    "PolicyLossSpec",
    "REJECTION_LEVELS",
    "ROLLOUT_CORRECTION_PRESETS",
    "RejectionLevelSpec",
    "RolloutCorrectionPreset",
    "aggregate_loss",
    "apply_kl_penalty",
    "compute_bypass_correction",
    "compute_rollout_correction",
    "count_sequences",
    "entropy_from_logits",
    "explained_variance",
    "kl_penalty",
    "balance_coefficient",
    "load_balancing_loss",
    "masked_mean",
    "masked_sum",
    "masked_whiten",
    "routing_statistics",
    "RoutingStatistics",
    "overlong_penalty",
    "value_loss",
]
