"""The value model on one trainer rank: values and clipped value-loss updates.

    critic = CriticTrainer(model, optimizer, scheduler, device)
    values = critic.compute_values(batch, micro_batch_size, max_tokens)        # (B, R)
    metrics = critic.update(batch, spec)                                       # needs values and returns
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from asyncrl.algos import count_sequences, explained_variance, value_loss
from asyncrl.models import ValueModel
from asyncrl.train.batch import TrainBatch
from asyncrl.train.forward import batched_values, response_values
from asyncrl.train.metric_sums import MetricSums
from asyncrl.train.nonfinite import NonFiniteGuard
from asyncrl.train.micro_batches import micro_batches
from asyncrl.train.mini_batches import mini_batch_plan
from asyncrl.train.parallel import accumulating, all_reduce_sum, world_size
from asyncrl.train.update_spec import CriticUpdateSpec


class CriticTrainer:
    def __init__(self, model: ValueModel, optimizer: torch.optim.Optimizer,
                 scheduler: torch.optim.lr_scheduler.LRScheduler, device: torch.device,
                 max_consecutive_nonfinite: int = 3):
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.device = device
        self.guard = NonFiniteGuard("critic", max_consecutive_nonfinite)

    def compute_values(self, batch: TrainBatch, micro_batch_size: int, max_tokens: Optional[int]) -> Tensor:
        self.model.eval()
        return batched_values(self.model, batch, micro_batch_size, max_tokens, self.device)

    def update(self, batch: TrainBatch, spec: CriticUpdateSpec) -> dict[str, float]:
        old_values = batch.need("values", "update_critic")
        returns = batch.need("returns", "update_critic")
        self.model.train()
        sums = MetricSums()
        plan = mini_batch_plan(batch.num_rows, spec.num_mini_batches, spec.ppo_epochs, spec.shuffle, spec.seed)
        for rows in plan:
            self.optimizer_step(batch.select(rows), spec, sums)
        self.scheduler.step()
        metrics = {f"critic/{name}": value for name, value in sums.finish(len(plan)).items()}
        metrics["critic/vf_explained_var"] = explained_variance(returns, old_values, batch.response_mask)
        metrics["critic/lr"] = self.optimizer.param_groups[0]["lr"]
        return metrics

    def optimizer_step(self, mini_batch: TrainBatch, spec: CriticUpdateSpec, sums: MetricSums) -> None:
        num_tokens, num_seqs = all_reduce_sum(
            [float(mini_batch.response_mask.sum()), float(count_sequences(mini_batch.response_mask))], self.device)
        self.optimizer.zero_grad(set_to_none=True)
        plan = micro_batches(mini_batch, spec.micro_batch_size, spec.max_tokens_per_micro_batch, self.device)
        for _, micro in accumulating(self.model, plan):
            micro = micro.to(self.device)
            predicted = response_values(self.model, micro)
            loss, loss_metrics = value_loss(
                predicted, micro.values, micro.returns, micro.response_mask, cliprange_value=spec.cliprange_value,
                loss_agg_mode=spec.loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs,
                norm_length=spec.norm_length)
            (loss * world_size()).backward()
            sums.add("vf_loss", loss)
            sums.add_token_mean("vf_clipfrac", loss_metrics["vf_clipfrac"], micro.response_mask.sum())
        grad_norm = self.guard.step(self.optimizer, self.model, spec.grad_clip)
        sums.add_step_value("grad_norm", grad_norm)
        self.optimizer.zero_grad(set_to_none=True)
