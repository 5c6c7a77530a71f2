"""Every registry entry gives the same numbers on CUDA as on CPU (skipped without a GPU)."""

import math

import pytest
import torch

from asyncrl.algos import (
    ADVANTAGE_ESTIMATORS,
    AdvantageKnobs,
    REJECTION_LEVELS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    PolicyLossKnobs,
    apply_kl_penalty,
    compute_rollout_correction,
    entropy_from_logits,
    value_loss,
)

from .helpers import fill_padding

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def make_batch(device):
    generator = torch.Generator().manual_seed(0)
    mask = torch.rand(16, 24, generator=generator) > 0.3
    log_probs = -torch.rand(16, 24, generator=generator)
    old_log_probs = log_probs + 0.3 * torch.randn(16, 24, generator=generator)
    advantages = torch.randn(16, 24, generator=generator)
    group_ids = torch.arange(16) // 4
    batch = dict(mask=mask, log_probs=fill_padding(log_probs, mask, math.nan), old_log_probs=old_log_probs,
                 advantages=advantages, group_ids=group_ids)
    return {name: tensor.to(device) for name, tensor in batch.items()}


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_policy_losses_on_cuda(name):
    results = []
    for device in ("cpu", "cuda"):
        batch = make_batch(device)
        log_probs = batch["log_probs"].clone().requires_grad_(True)
        generator = torch.Generator(device=device).manual_seed(3)  # exercises clip_cov on the device
        loss, metrics = POLICY_LOSSES[name](log_probs, batch["old_log_probs"], batch["advantages"], batch["mask"],
                                            PolicyLossKnobs(kl_cov_ratio=0.1),
                                            rollout_is_weights=torch.ones_like(log_probs), generator=generator)
        (gradient,) = torch.autograd.grad(loss, log_probs)
        results.append((loss.cpu(), gradient.cpu(), metrics))
    if name != "clip_cov":  # its random choice differs between CPU and CUDA generators
        torch.testing.assert_close(results[1][0], results[0][0])
        torch.testing.assert_close(results[1][1], results[0][1])
    assert torch.isfinite(results[1][1]).all()


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_advantages_on_cuda(name):
    outputs = []
    for device in ("cpu", "cuda"):
        batch = make_batch(device)
        rewards = fill_padding(batch["advantages"], batch["mask"], math.nan)
        outputs.append(ADVANTAGE_ESTIMATORS[name](
            rewards, batch["mask"], batch["group_ids"], AdvantageKnobs(gamma=0.99, lam=0.95),
            values=batch["old_log_probs"], reward_baselines=torch.zeros(16, device=device),
        ))
    torch.testing.assert_close(outputs[1][0].cpu(), outputs[0][0])
    torch.testing.assert_close(outputs[1][1].cpu(), outputs[0][1])


def test_kl_correction_value_entropy_on_cuda():
    results = []
    for device in ("cpu", "cuda"):
        batch = make_batch(device)
        kl = {name: fn(batch["old_log_probs"], batch["log_probs"]).nan_to_num(0.0).cpu()
              for name, fn in KL_ESTIMATORS.items()}
        rewards, kl_metrics = apply_kl_penalty(batch["advantages"], batch["old_log_probs"], batch["log_probs"],
                                               batch["mask"], 0.1, "low_var_kl")
        weights, new_mask, correction_metrics = compute_rollout_correction(
            batch["log_probs"], batch["old_log_probs"], batch["mask"], is_level="sequence", is_batch_normalize=True,
            rs_level="geometric", rs_threshold=1.1,
        )
        loss, value_metrics = value_loss(batch["log_probs"], batch["old_log_probs"], batch["advantages"],
                                         batch["mask"], cliprange_value=0.2, loss_agg_mode="seq-mean-token-mean")
        logits = batch["advantages"][..., None] * torch.arange(50.0, device=device)
        entropy = entropy_from_logits(logits, chunk_size=7).cpu()
        results.append((kl, rewards.cpu(), kl_metrics, weights.cpu(), new_mask.cpu(), correction_metrics,
                        loss.cpu(), value_metrics, entropy))
    for cpu_value, cuda_value in zip(*results):
        if isinstance(cpu_value, dict) and cpu_value and isinstance(next(iter(cpu_value.values())), torch.Tensor):
            for key in cpu_value:
                torch.testing.assert_close(cuda_value[key], cpu_value[key])
        elif isinstance(cpu_value, dict):
            assert cuda_value == pytest.approx(cpu_value, rel=1e-5, abs=1e-6)
        else:
            torch.testing.assert_close(cuda_value, cpu_value)


@pytest.mark.parametrize("level", [spec.name for spec in REJECTION_LEVELS.specs() if spec.is_divergence])
def test_kl_rejection_on_cuda(level):
    masks = []
    for device in ("cpu", "cuda"):
        batch = make_batch(device)
        upper = {"token": 0.05, "seq_mean": 0.05, "seq_max": 0.3, "seq_sum": 0.8}[level[:-3]]
        _, new_mask, metrics = compute_rollout_correction(batch["log_probs"], batch["old_log_probs"], batch["mask"],
                                                          rs_level=level, rs_threshold=upper)
        masks.append((new_mask.cpu(), metrics))
    assert torch.equal(masks[1][0], masks[0][0])
    assert 0 < masks[0][1]["rollout_corr/rs_fraction_rejected"] < 1  # the bound matters on this batch
    assert masks[1][1] == pytest.approx(masks[0][1], rel=1e-5, abs=1e-6)
