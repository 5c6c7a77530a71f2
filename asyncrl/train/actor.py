"""The policy on one trainer rank: log-probs, PPO-family updates, weight export and host snapshots.

    actor = PolicyTrainer(model, optimizer, scheduler, device)
    log_probs, entropy = actor.compute_log_prob(batch, temperature, micro_batch_size, max_tokens)
    metrics = actor.update(batch, spec)       # spec: PolicyUpdateSpec, sent by the driver with the call

Gradient accumulation is exact: every micro-batch's loss is normalised by the mini-batch's global token
(or sequence) count over all ranks, and multiplied by the world size because FSDP averages gradients
over ranks. A non-finite gradient skips the optimizer step and is counted.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from asyncrl.algos import POLICY_LOSSES, aggregate_loss, compute_bypass_correction, count_sequences, kl_penalty
from asyncrl.models import CausalLM
from asyncrl.train.batch import TrainBatch
from asyncrl.train.forward import batched_log_probs, response_log_probs, with_token_index
from asyncrl.train.metric_sums import MetricSums
from asyncrl.train.nonfinite import NonFiniteGuard
from asyncrl.train.micro_batches import micro_batches
from asyncrl.train.mini_batches import mini_batch_plan
from asyncrl.train.parallel import accumulating, all_reduce_sum, clip_gradients, local_shard, reshard_all, world_size
from asyncrl.train.update_spec import PolicyUpdateSpec

# Token-mean metrics of the policy losses and rollout correction, reduced over tokens of all ranks.
LOSS_TOKEN_METRICS = ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "pg_covfrac")


class PolicyTrainer:
    def __init__(self, model: CausalLM, optimizer: torch.optim.Optimizer,
                 scheduler: torch.optim.lr_scheduler.LRScheduler, device: torch.device,
                 max_consecutive_nonfinite: int = 3):
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.device = device
        self.guard = NonFiniteGuard("actor", max_consecutive_nonfinite)
        self.snapshot_tensors: Optional[list[Tensor]] = None

    def compute_log_prob(self, batch: TrainBatch, temperature: float, micro_batch_size: int,
                         max_tokens: Optional[int], with_entropy: bool = True) -> tuple[Tensor, Optional[Tensor]]:
        self.model.eval()
        return batched_log_probs(self.model, batch, temperature, micro_batch_size, max_tokens, with_entropy,
                                 self.device)

    def update(self, batch: TrainBatch, spec: PolicyUpdateSpec) -> dict[str, float]:
        batch.need("advantages", "update_actor")
        batch.need("old_log_probs", "update_actor")
        self.model.train()
        sums = MetricSums()
        plan = mini_batch_plan(batch.num_rows, spec.num_mini_batches, spec.ppo_epochs, spec.shuffle, spec.seed)
        for rows in plan:
            self.optimizer_step(batch.select(rows), spec, sums)
        self.scheduler.step()
        metrics = {f"actor/{name}": value for name, value in sums.finish(len(plan)).items()}
        metrics["actor/lr"] = self.optimizer.param_groups[0]["lr"]
        metrics["actor/num_skipped_steps"] = float(self.guard.num_skipped)
        return metrics

    def optimizer_step(self, mini_batch: TrainBatch, spec: PolicyUpdateSpec, sums: MetricSums) -> None:
        num_tokens, num_seqs = all_reduce_sum(
            [float(mini_batch.response_mask.sum()), float(count_sequences(mini_batch.response_mask))], self.device)
        self.optimizer.zero_grad(set_to_none=True)
        plan = micro_batches(mini_batch, spec.micro_batch_size, spec.max_tokens_per_micro_batch, self.device)
        for _, micro in accumulating(self.model, plan):
            on_device, token_index = with_token_index(micro, self.device)
            loss = self.micro_batch_loss(on_device, token_index, spec, num_tokens, num_seqs, sums)
            (loss * world_size()).backward()
        grad_norm = clip_gradients(self.model, spec.grad_clip)
        sums.add_step_value("grad_norm", grad_norm)
        self.guard.step(self.optimizer, grad_norm)
        self.optimizer.zero_grad(set_to_none=True)

    def micro_batch_loss(self, micro: TrainBatch, token_index: Tensor, spec: PolicyUpdateSpec, num_tokens: float,
                         num_seqs: float, sums: MetricSums) -> Tensor:
        log_probs, entropy = response_log_probs(self.model, micro, spec.temperature, with_entropy=True,
                                                token_index=token_index)
        mask = micro.response_mask
        is_weights = micro.rollout_is_weights
        local_tokens = mask.sum()  # a device tensor: metrics stay on the device until the update ends
        if spec.bypass_is_level or spec.bypass_rs_level:
            is_weights, mask, correction_metrics = compute_bypass_correction(
                log_probs, micro.need("rollout_log_probs", "bypass correction"), mask,
                is_level=spec.bypass_is_level, is_threshold=spec.bypass_is_threshold,
                rs_level=spec.bypass_rs_level, rs_threshold=spec.bypass_rs_threshold,
                rs_threshold_lower=spec.bypass_rs_threshold_lower)
            for name, value in correction_metrics.items():
                sums.add_token_mean(name, value, local_tokens)
        counts = dict(num_tokens=num_tokens, num_seqs=num_seqs, norm_length=spec.norm_length)
        pg_loss, pg_metrics = POLICY_LOSSES[spec.loss_mode](
            log_probs, micro.old_log_probs, micro.advantages, mask, clip_ratio_low=spec.clip_ratio_low,
            clip_ratio_high=spec.clip_ratio_high, clip_ratio_c=spec.clip_ratio_c, rollout_is_weights=is_weights,
            clip_cov_ratio=spec.clip_cov_ratio, clip_cov_lb=spec.clip_cov_lb, clip_cov_ub=spec.clip_cov_ub,
            kl_cov_ratio=spec.kl_cov_ratio, ppo_kl_coef=spec.ppo_kl_coef, loss_agg_mode=spec.loss_agg_mode,
            **counts)
        sums.add("pg_loss", pg_loss)
        for name in LOSS_TOKEN_METRICS:
            if name in pg_metrics:
                sums.add_token_mean(name, pg_metrics[name], local_tokens)
        loss = pg_loss
        entropy_loss = aggregate_loss(entropy, mask, spec.loss_agg_mode, **counts)
        sums.add("entropy", entropy_loss)
        if spec.entropy_coeff:
            loss = loss - spec.entropy_coeff * entropy_loss
        if spec.use_kl_loss:
            kl = kl_penalty(spec.kl_loss_type, log_probs, micro.need("ref_log_probs", "update_actor (KL loss)"))
            kl_loss = aggregate_loss(kl, mask, spec.loss_agg_mode, **counts)
            sums.add("kl_loss", kl_loss)
            loss = loss + spec.kl_loss_coef * kl_loss
        return loss

    def snapshot(self) -> None:
        """Copy this rank's parameter shards to host memory (the proximal policy of decoupled mode)."""
        reshard_all(self.model)
        self.snapshot_tensors = [local_shard(p).detach().to("cpu", copy=True) for p in self.model.parameters()]

    def swap_snapshot(self) -> None:
        """Exchange the live parameters with the snapshot (call twice to come back)."""
        if self.snapshot_tensors is None:
            raise RuntimeError("swap_snapshot called before snapshot")
        reshard_all(self.model)
        with torch.no_grad():
            for parameter, saved in zip(self.model.parameters(), self.snapshot_tensors):
                live = local_shard(parameter)
                current = live.detach().to("cpu", copy=True)
                live.copy_(saved.to(live.device))
                saved.copy_(current)
