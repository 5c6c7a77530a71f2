"""Off-policy correction of a batch in decoupled mode (three policies), on the driver, once per batch.

In bypass mode the trainer computes correction per micro-batch inside the loss (the spec carries it);
here, decoupled mode weighs rollout -> proximal with importance weights and may reject tokens or whole
sequences (their response mask goes to 0). Diagnostics (KL between rollout and proximal policy) are
reported whenever both log-probs exist.
"""

from __future__ import annotations

from asyncrl.algos import compute_rollout_correction
from asyncrl.config.schema import RolloutCorrectionConfig
from asyncrl.train import TrainBatch


def rollout_correction(batch: TrainBatch, config: RolloutCorrectionConfig, metrics: dict[str, float]) -> TrainBatch:
    if config.bypass_mode or batch.rollout_log_probs is None or batch.old_log_probs is None:
        return batch
    weights, mask, correction_metrics = compute_rollout_correction(
        batch.old_log_probs, batch.rollout_log_probs, batch.response_mask, is_level=config.rollout_is,
        is_threshold=config.rollout_is_threshold, is_batch_normalize=config.rollout_is_batch_normalize,
        rs_level=config.rollout_rs, rs_threshold=config.rollout_rs_threshold,
        rs_threshold_lower=config.rollout_rs_threshold_lower)
    metrics.update(correction_metrics)
    return batch.replace(rollout_is_weights=weights, response_mask=mask)
