"""The policy on one trainer rank: log-probs, PPO-family updates, weight export and host snapshots.

    actor = PolicyTrainer(model, optimizer, scheduler, device)
    log_probs, entropy = actor.compute_log_prob(batch, temperature, micro_batch_size, max_tokens)
    metrics = actor.update(batch, spec)       # spec: PolicyUpdateSpec, sent by the driver with the call

Gradient accumulation is exact: every micro-batch's loss is normalised by the mini-batch's global token
(or sequence) count over all ranks, and multiplied by the world size because FSDP averages gradients
over ranks. A non-finite gradient skips the optimizer step and is counted.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Optional

import torch
from torch import Tensor

from asyncrl.algos import count_sequences
from asyncrl.models import CausalLM
from asyncrl.train.batch import TrainBatch
from asyncrl.train.compute_weights import ComputeWeights
from asyncrl.train.forward import (GradientTargets, batched_log_probs, packed_response_log_probs, response_log_probs,
                                   with_token_index)
from asyncrl.train.metric_sums import MetricSums
from asyncrl.train.micro_batches import micro_batches
from asyncrl.train.mini_batches import mini_batch_plan
from asyncrl.train.nonfinite import NonFiniteGuard
from asyncrl.train.packed_batch import PackCapacity, PackedMicroBatch, pack_micro_batch
from asyncrl.train.parallel import accumulating, all_reduce_sum, local_shard, reshard_all, world_size
from asyncrl.train.policy_loss import LossMetrics, policy_loss_terms
from asyncrl.train.step_graphs import StepGraphs
from asyncrl.train.update_spec import PolicyUpdateSpec


class PolicyTrainer:
    def __init__(self, model: CausalLM, optimizer: torch.optim.Optimizer,
                 scheduler: torch.optim.lr_scheduler.LRScheduler, device: torch.device,
                 max_consecutive_nonfinite: int = 3, compute_weights: Optional[ComputeWeights] = None):
        """`compute_weights` (one rank, no FSDP: `actor.cuda_graphs`) runs every update micro-batch as the
        fixed-capacity `packed_step`, replayed from CUDA graphs on a GPU."""
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.device = device
        self.guard = NonFiniteGuard("actor", max_consecutive_nonfinite)
        self.snapshot_tensors: Optional[list[Tensor]] = None
        self.compute_weights = compute_weights
        self.step_graphs: Optional[StepGraphs[LossMetrics]] = None if compute_weights is None else StepGraphs(
            self.packed_step, device, capture=device.type == "cuda")

    def compute_log_prob(self, batch: TrainBatch, temperature: float, micro_batch_size: int,
                         max_tokens: Optional[int], with_entropy: bool = True) -> tuple[Tensor, Optional[Tensor]]:
        self.model.eval()
        with self.computing():
            return batched_log_probs(self.model, batch, temperature, micro_batch_size, max_tokens, with_entropy,
                                     self.device)

    def computing(self) -> contextlib.AbstractContextManager:
        """The model computes with the compute-dtype copies of its masters when it has them (refreshed first:
        the masters may have changed since), with the masters themselves otherwise (FSDP casts them)."""
        if self.compute_weights is None:
            return contextlib.nullcontext()
        self.compute_weights.refresh()
        return self.compute_weights.applied()

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
            if self.step_graphs is None:
                on_device, token_index = with_token_index(micro, self.device)
                loss = self.micro_batch_loss(on_device, token_index, spec, num_tokens, num_seqs, sums)
                (loss * world_size()).backward()
            else:
                self.replay_step(micro, spec, num_tokens, num_seqs).record(sums)
        grad_norm = self.guard.step(self.optimizer, self.model, spec.grad_clip)
        sums.add_step_value("grad_norm", grad_norm)
        if self.compute_weights is None:
            self.optimizer.zero_grad(set_to_none=True)  # frees the gradients until the next step

    def micro_batch_loss(self, micro: TrainBatch, token_index: Tensor, spec: PolicyUpdateSpec, num_tokens: float,
                         num_seqs: float, sums: MetricSums) -> Tensor:
        """The loss of one dense micro-batch on the device (`token_index`: its `response_token_index`); its
        metrics go to `sums`."""
        log_probs, entropy = response_log_probs(self.model, micro, spec.temperature, with_entropy=True,
                                                token_index=token_index)
        terms = policy_loss_terms(log_probs, entropy, micro, spec, num_tokens, num_seqs)
        terms.metrics.record(sums)
        return terms.loss

    def begin_accumulation(self) -> None:
        """Gradients zeroed before a step's micro-batches: with `compute_weights` in place (a captured step
        adds into them at fixed addresses) and the copies refreshed (the masters may have changed since: the
        last step, a snapshot swap, a checkpoint load)."""
        if self.compute_weights is None:
            self.optimizer.zero_grad(set_to_none=True)
            return
        self.compute_weights.zero_grads()
        self.compute_weights.refresh()

    def replay_step(self, micro: TrainBatch, spec: PolicyUpdateSpec, num_tokens: float,
                    num_seqs: float) -> LossMetrics:
        """The micro-batch packed at a fixed capacity and run by `packed_step`, replayed from a CUDA graph of
        its capacity and loss (the spec's seed only orders mini-batches; everything else is baked in)."""
        capacity = PackCapacity.covering(micro, spec.max_tokens_per_micro_batch)
        packed = pack_micro_batch(micro, capacity, num_tokens, num_seqs)
        key = (capacity, tuple(packed.tensors()), dataclasses.replace(spec, seed=0))
        return self.step_graphs.run(key, packed, spec)

    def packed_step(self, packed: PackedMicroBatch, spec: PolicyUpdateSpec) -> LossMetrics:
        """Forward, loss and backward of one packed micro-batch; gradients added to the masters' in fp32.
        Capturable: static shapes, no host synchronisation."""
        weights = self.compute_weights
        with weights.applied():
            # The LM head, the embedding and the MLPs add their weight gradients straight into the masters': no
            # bf16 gradient of theirs is written, read back and accumulated (the (V, H) ones also zeroed first).
            log_probs, entropy = packed_response_log_probs(
                self.model, packed, spec.temperature, GradientTargets.of(self.model, weights.gradient_of))
        terms = policy_loss_terms(log_probs, entropy, packed, spec, packed.counts[0], packed.counts[1])
        weights.accumulate(torch.autograd.grad(terms.loss, weights.trainable, allow_unused=True))
        return terms.metrics.detached()

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
