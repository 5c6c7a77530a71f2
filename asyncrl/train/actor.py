"""The policy on one trainer rank: log-probs, PPO-family updates, weight export and host snapshots.

    actor = PolicyTrainer(model, optimizer, scheduler, device)
    log_probs, entropy = actor.compute_log_prob(batch, temperature, micro_batch_size, max_tokens)
    metrics = actor.update(batch, spec)       # spec: PolicyUpdateSpec, sent by the driver with the call

Gradient accumulation is exact: every micro-batch's loss is normalised by the mini-batch's global token
(or sequence) count over all ranks, and multiplied by the world size because FSDP averages gradients
over ranks. A non-finite gradient skips the optimizer step and is counted. With `actor.cuda_graphs` the
micro-batches run a `FastUpdate` instead (`fast/graphed_update.py`, chosen by `fast/selection.py`).
"""

from __future__ import annotations

import contextlib
from typing import Optional, Protocol

import torch
from torch import Tensor

from asyncrl.algos import count_sequences
from asyncrl.models import CausalLM
from asyncrl.train.batch import TrainBatch
from asyncrl.train.forward import batched_log_probs, response_log_probs, with_token_index
from asyncrl.train.metric_sums import MetricSums
from asyncrl.train.micro_batches import micro_batches
from asyncrl.train.mini_batches import mini_batch_plan
from asyncrl.train.nonfinite import NonFiniteGuard
from asyncrl.train.parallel import accumulating, all_reduce_sum, local_shard, reshard_all, world_size
from asyncrl.train.policy_loss import LossMetrics, policy_loss_terms
from asyncrl.train.routing import router_terms, trainer_routing
from asyncrl.train.update_spec import PolicyUpdateSpec


class FastUpdate(Protocol):
    """A speed path that runs the update's micro-batches on weights of its own (`fast/graphed_update.py`)."""

    def computing(self) -> contextlib.AbstractContextManager:
        """The model computes with the path's weights inside the block."""

    def begin_accumulation(self) -> None:
        """Zeroes the gradients a mini-batch's micro-batches add into."""

    def run(self, micro: TrainBatch, spec: PolicyUpdateSpec, num_tokens: float, num_seqs: float) -> LossMetrics:
        """Forward, loss and backward of one micro-batch; its metrics."""


class PolicyTrainer:
    def __init__(self, model: CausalLM, optimizer: torch.optim.Optimizer,
                 scheduler: torch.optim.lr_scheduler.LRScheduler, device: torch.device,
                 max_consecutive_nonfinite: int = 3, fast_update: Optional[FastUpdate] = None,
                 routing_replay: bool = False):
        """`fast_update` (`actor.cuda_graphs`, from `fast.selection.fast_update`) runs every update micro-batch,
        into gradients it keeps itself; `optimizer` then steps its weights. `routing_replay` (MoE): log-probs
        computed outside an update (`compute_log_prob`) replay the rollout's experts."""
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.device = device
        self.guard = NonFiniteGuard("actor", max_consecutive_nonfinite)
        self.snapshot_tensors: Optional[list[Tensor]] = None
        self.fast_update = fast_update
        self.routing_replay = routing_replay

    def compute_log_prob(self, batch: TrainBatch, temperature: float, micro_batch_size: int,
                         max_tokens: Optional[int], with_entropy: bool = True) -> tuple[Tensor, Optional[Tensor]]:
        self.model.eval()
        with self.computing():
            return batched_log_probs(self.model, batch, temperature, micro_batch_size, max_tokens, with_entropy,
                                     self.device, self.routing_replay)

    def computing(self) -> contextlib.AbstractContextManager:
        """The model computes with the fast update's weights when there is one, with the masters themselves
        otherwise (FSDP casts them)."""
        return contextlib.nullcontext() if self.fast_update is None else self.fast_update.computing()

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
        self.begin_accumulation()
        plan = micro_batches(mini_batch, spec.micro_batch_size, spec.max_tokens_per_micro_batch, self.device)
        for _, micro in accumulating(self.model, plan):
            if self.fast_update is None:
                on_device, token_index = with_token_index(micro, self.device)
                loss = self.micro_batch_loss(on_device, token_index, spec, num_tokens, num_seqs, sums)
                (loss * world_size()).backward()
            else:
                self.fast_update.run(micro, spec, num_tokens, num_seqs).record(sums)
        grad_norm = self.guard.step(self.optimizer, self.model, spec.grad_clip)
        sums.add_step_value("grad_norm", grad_norm)
        if self.fast_update is None:
            self.optimizer.zero_grad(set_to_none=True)  # frees the gradients until the next step

    def micro_batch_loss(self, micro: TrainBatch, token_index: Tensor, spec: PolicyUpdateSpec, num_tokens: float,
                         num_seqs: float, sums: MetricSums) -> Tensor:
        """The loss of one dense micro-batch on the device (`token_index`: its `response_token_index`); its
        metrics go to `sums`. An MoE model adds its load-balancing loss, weighted by the micro-batch's share of
        the mini-batch's rows (summed over micro-batches and ranks: the rows' mean)."""
        routing = trainer_routing(self.model, micro, spec.routing_replay)
        log_probs, entropy = response_log_probs(self.model, micro, spec.temperature, with_entropy=True,
                                                token_index=token_index, routing=routing)
        terms = policy_loss_terms(log_probs, entropy, micro, spec, num_tokens, num_seqs)
        terms.metrics.record(sums)
        if routing is None:
            return terms.loss
        config = self.model.config
        router = router_terms(routing, micro, config.num_experts)
        router.record(sums, log_probs, micro, micro.num_rows)
        coef = config.router_aux_loss_coef if spec.router_aux_loss_coef is None else spec.router_aux_loss_coef
        return terms.loss + coef * router.aux_loss * (micro.num_rows / max(num_seqs, 1.0))

    def begin_accumulation(self) -> None:
        """Gradients zeroed before a step's micro-batches (by the fast update where it keeps them)."""
        if self.fast_update is None:
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.fast_update.begin_accumulation()

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
