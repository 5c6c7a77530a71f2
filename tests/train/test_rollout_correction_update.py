"""Rollout correction through a trainer worker's `update_actor`: the bypass-mode rejection and IS weights
computed inside the loss, and the decoupled-mode weights and mask computed on the driver, must reach the
gradient the optimizer steps with, as the same update with the tokens masked or weighted by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from asyncrl.config import AsyncRLConfig
from asyncrl.core.advantage import rollout_correction
from asyncrl.models import build_tiny_model
from asyncrl.train import PolicyUpdateSpec, TrainBatch, TrainerWorker
from asyncrl.train.parallel import full_tensor

from .helpers import make_batch, run_in_processes, trainer_config

# lr 0 keeps the weights, so every update of one worker sees the same policy; no clipping, so the captured
# gradient is the loss's own. One mini-batch: one optimizer step per update. A sequence normaliser: bypass
# mode counts a mini-batch's tokens before rejection (documented in algos/rollout_correction.py), so with
# token-mean a rejected token would still dilute the loss; every sequence keeps a token, so the number of
# sequences is the same with and without rejection.
GRADIENT_ONLY = ("actor.optim.lr=0.0", "actor.grad_clip=0.0", "actor.ppo_mini_batch_size=6",
                 "actor.loss_agg_mode=seq-mean-token-sum")
CORRECTION = "algorithm.rollout_correction"
BYPASS_REINFORCE = (f"{CORRECTION}.bypass_mode=true", f"{CORRECTION}.loss_type=reinforce")
REJECT_OUTSIDE_HALF_TO_TWO = (f"{CORRECTION}.rollout_rs=token", f"{CORRECTION}.rollout_rs_threshold=2.0")
IS_TRUNCATED_AT = 1.5
WEIGH_TOKENS = (f"{CORRECTION}.rollout_is=token", f"{CORRECTION}.rollout_is_threshold={IS_TRUNCATED_AT}")
# log pi_current - log pi_rollout of kept tokens: weights exp(.) = 0.61, 1.22 and 1.82 (truncated to 1.5),
# all inside the rejection band [0.5, 2]; rejected tokens get +-3 (ratios 20 and 0.05).
KEPT_LOG_RATIOS = torch.tensor([-0.5, 0.2, 0.6])
REJECTED_LOG_RATIO = 3.0


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", family="qwen2", seed=3)


def update_gradient(worker: TrainerWorker, config: AsyncRLConfig, batch: TrainBatch
                    ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """The gradient one `update_actor` hands the optimizer (read by a step pre-hook), and its metrics."""
    gradient: dict[str, np.ndarray] = {}

    def read(optimizer, args, kwargs) -> None:
        for name, parameter in worker.actor.model.named_parameters():
            gradient[name] = full_tensor(parameter.grad).detach().clone().numpy()

    handle = worker.actor.optimizer.register_step_pre_hook(read)
    try:
        metrics = worker.update_actor(batch, PolicyUpdateSpec.from_config(config, batch.num_rows, step=0))
    finally:
        handle.remove()
    return gradient, metrics


def correction_gradients(rank, world_size, port, model_path):
    """Gradients of one worker's updates on one batch: corrected by the trainer or the driver, and by hand."""
    worker = TrainerWorker(trainer_config(model_path, *GRADIENT_ONLY), rank, world_size, "127.0.0.1", port,
                           total_training_steps=10)
    batch = make_batch(seed=6)
    log_probs, _ = worker.compute_log_prob(batch)  # the policy every update below computes with
    mask = batch.response_mask
    columns = torch.arange(mask.shape[1])[None, :].expand_as(mask)
    rows = torch.arange(mask.shape[0])[:, None].expand_as(mask)
    # Every odd response token is rejected, too likely under the rollout policy on even rows and too unlikely
    # on odd ones; token 0 of each sequence is always kept.
    is_rejected = (columns % 2 == 1) & (mask > 0)
    rejected_log_ratio = torch.where(rows % 2 == 0, REJECTED_LOG_RATIO, -REJECTED_LOG_RATIO)
    kept_log_ratio = KEPT_LOG_RATIOS[(rows + columns) % len(KEPT_LOG_RATIOS)]
    kept_mask = mask * ~is_rejected
    weights = torch.exp(kept_log_ratio).clamp(max=IS_TRUNCATED_AT) * mask

    def config(*overrides: str) -> AsyncRLConfig:
        return trainer_config(model_path, *GRADIENT_ONLY, *overrides)

    def from_rollout(log_ratio: torch.Tensor) -> TrainBatch:
        """The batch as bypass mode trains it: sampled with log pi_rollout = log pi_current - log_ratio, which
        is also the PPO anchor."""
        rollout_log_probs = (log_probs - log_ratio) * mask
        return batch.replace(rollout_log_probs=rollout_log_probs, old_log_probs=rollout_log_probs)

    mixed = from_rollout(torch.where(is_rejected, rejected_log_ratio, kept_log_ratio))
    gradients = {
        "rejected_in_loss": update_gradient(worker, config(*BYPASS_REINFORCE, *REJECT_OUTSIDE_HALF_TO_TWO), mixed),
        "masked_by_hand": update_gradient(worker, config(*BYPASS_REINFORCE),
                                          mixed.replace(response_mask=kept_mask)),
        "not_masked": update_gradient(worker, config(*BYPASS_REINFORCE), mixed),
    }
    weighed = from_rollout(kept_log_ratio)
    gradients["weighted_in_loss"] = update_gradient(worker, config(*BYPASS_REINFORCE, *WEIGH_TOKENS), weighed)
    # -w A log p is REINFORCE with advantages w A.
    gradients["weighted_by_hand"] = update_gradient(worker, config(*BYPASS_REINFORCE),
                                                    weighed.replace(advantages=batch.advantages * weights))
    # Decoupled: the proximal policy (here the current one) is the anchor; the driver weighs and rejects
    # rollout -> proximal once per batch, and the PPO clip bounds proximal -> current.
    decoupled = config(f"{CORRECTION}.bypass_mode=false", *WEIGH_TOKENS, *REJECT_OUTSIDE_HALF_TO_TWO)
    driver_metrics: dict[str, float] = {}
    corrected = rollout_correction(mixed.replace(old_log_probs=log_probs), decoupled.algorithm.rollout_correction,
                                   driver_metrics)
    gradients["corrected_on_driver"] = update_gradient(worker, decoupled, corrected)
    # PPO's clipped surrogate is positively homogeneous in the advantage: weights w act as advantages w A.
    by_hand = batch.replace(old_log_probs=log_probs, response_mask=kept_mask, advantages=batch.advantages * weights)
    gradients["corrected_by_hand"] = update_gradient(worker, config(f"{CORRECTION}.bypass_mode=false"), by_hand)
    hand = {"rejected_fraction": float(is_rejected.sum() / mask.sum()), "mask": mask.numpy(),
            "corrected_mask": corrected.response_mask.numpy(), "kept_mask": kept_mask.numpy(),
            "corrected_weights": corrected.rollout_is_weights.numpy(), "weights": weights.numpy(),
            "driver_metrics": driver_metrics}
    return gradients, hand


@pytest.fixture(scope="module")
def updates(model_path):
    (result,) = run_in_processes(correction_gradients, 1, model_path)
    return result


def assert_same_gradient(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    """Equal up to float32 summation order: within 1e-5 of each parameter's largest gradient entry (the
    differences the tests guard against are over 5% of it)."""
    assert list(got) == list(want)
    for name, gradient in want.items():
        np.testing.assert_allclose(got[name], gradient, rtol=0, atol=1e-5 * np.abs(gradient).max(), err_msg=name)


def distance(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> float:
    """The largest difference over every parameter, relative to the largest gradient entry."""
    scale = max(np.abs(gradient).max() for gradient in want.values())
    return max(np.abs(got[name] - gradient).max() for name, gradient in want.items()) / scale


def test_bypass_rejection_trains_as_if_the_rejected_tokens_were_masked_by_hand(updates):
    gradients, hand = updates
    rejected, rejected_metrics = gradients["rejected_in_loss"]
    masked, _ = gradients["masked_by_hand"]
    not_masked, _ = gradients["not_masked"]
    assert distance(not_masked, masked) > 0.05  # the rejected tokens carry a gradient of their own
    assert_same_gradient(rejected, masked)
    assert 0 < hand["rejected_fraction"] < 1
    assert rejected_metrics["actor/rollout_corr/rs_fraction_rejected"] == pytest.approx(hand["rejected_fraction"])


def test_bypass_importance_weights_scale_each_tokens_gradient(updates):
    gradients, hand = updates
    weighted, weighted_metrics = gradients["weighted_in_loss"]
    by_hand, _ = gradients["weighted_by_hand"]
    unweighted, _ = gradients["not_masked"]
    assert_same_gradient(weighted, by_hand)
    assert distance(unweighted, by_hand) > 0.05
    valid = hand["mask"] > 0
    assert hand["weights"][valid].max() == pytest.approx(IS_TRUNCATED_AT)  # some weights were truncated
    assert weighted_metrics["actor/rollout_corr/is_mean"] == pytest.approx(hand["weights"][valid].mean(), rel=1e-5)


def test_decoupled_weights_and_rejection_from_the_driver_reach_the_update(updates):
    gradients, hand = updates
    corrected, _ = gradients["corrected_on_driver"]
    by_hand, _ = gradients["corrected_by_hand"]
    assert np.array_equal(hand["corrected_mask"], hand["kept_mask"])
    kept = hand["kept_mask"] > 0
    np.testing.assert_allclose(hand["corrected_weights"][kept], hand["weights"][kept], rtol=1e-5)
    assert hand["driver_metrics"]["rollout_corr/rs_fraction_rejected"] == pytest.approx(hand["rejected_fraction"])
    assert_same_gradient(corrected, by_hand)
    assert distance(gradients["not_masked"][0], by_hand) > 0.05
