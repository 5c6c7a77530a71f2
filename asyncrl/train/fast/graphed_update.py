"""The actor's micro-batches as fixed-capacity packed steps replayed from CUDA graphs (`actor.cuda_graphs`, one
trainer rank): the speed path that `PolicyTrainer` hands its micro-batch loop to.

    update = GraphedUpdate(model, torch.bfloat16, config.actor.optim, device, lm_head_kernels)
    with update.computing(): ...                              # the model computes with the compute copies
    update.begin_accumulation()                               # before a mini-batch's micro-batches
    metrics = update.run(micro, spec, num_tokens, num_seqs)   # forward, loss and backward of one micro-batch
    update.optimizer.step()                                   # AdamW over the flat masters

Why. A CUDA graph replays kernels on the addresses and shapes it captured. FSDP gathers its compute-dtype copies
into fresh memory at every step, so this path keeps its own copies at fixed addresses (`compute_weights.py`),
packs each micro-batch into buffers of a fixed capacity (`packed_batch.py`) and replays one graph per capacity
(`step_graphs.py`). Weight gradients are added straight into the fp32 masters' (`packed_forward.py`), and AdamW is
one kernel over the flat masters (`flat_adamw.py`). Without a GPU the same packed step runs eagerly.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Optional

import torch

from asyncrl.config.schema import OptimConfig
from asyncrl.models import CausalLM
from asyncrl.train.batch import TrainBatch
from asyncrl.train.fast.compute_weights import ComputeWeights
from asyncrl.train.fast.flat_adamw import FlatAdamW
from asyncrl.train.fast.packed_batch import PackCapacity, PackedMicroBatch, pack_micro_batch
from asyncrl.train.fast.packed_forward import GradientTargets, packed_response_log_probs
from asyncrl.train.fast.step_graphs import StepGraphs
from asyncrl.train.lm_head import FusedChunkKernels
from asyncrl.train.policy_loss import LossMetrics, policy_loss_terms
from asyncrl.train.update_spec import PolicyUpdateSpec


class GraphedUpdate:
    """Owns the policy's fixed-address compute copies, their optimizer and the graphs of the packed step.
    `lm_head_kernels`: the LM head's chunk math (None: torch's)."""

    def __init__(self, model: CausalLM, param_dtype: Optional[torch.dtype], optim: OptimConfig,
                 device: torch.device, lm_head_kernels: Optional[FusedChunkKernels] = None) -> None:
        self.model = model
        self.weights = ComputeWeights(model, param_dtype, compile_accumulation=model.is_compiled)
        self.optimizer = FlatAdamW(self.weights, optim)
        self.lm_head_kernels = lm_head_kernels
        self.graphs: StepGraphs[LossMetrics] = StepGraphs(self.packed_step, device, capture=device.type == "cuda")

    def computing(self) -> contextlib.AbstractContextManager:
        """The model computes with the compute-dtype copies of its masters inside the block (refreshed first: the
        masters may have changed since)."""
        self.weights.refresh()
        return self.weights.applied()

    def begin_accumulation(self) -> None:
        """Gradients zeroed in place (a captured step adds into them at fixed addresses) and the copies refreshed
        (the masters may have changed since: the last step, a snapshot swap, a checkpoint load)."""
        self.weights.zero_grads()
        self.weights.refresh()

    def run(self, micro: TrainBatch, spec: PolicyUpdateSpec, num_tokens: float, num_seqs: float) -> LossMetrics:
        """The micro-batch packed at a fixed capacity and run by `packed_step`, replayed from a CUDA graph of
        its capacity and loss (the spec's seed only orders mini-batches; everything else is baked in)."""
        capacity = PackCapacity.covering(micro, spec.max_tokens_per_micro_batch)
        packed = pack_micro_batch(micro, capacity, num_tokens, num_seqs)
        key = (capacity, tuple(packed.tensors()), dataclasses.replace(spec, seed=0))
        return self.graphs.run(key, packed, spec)

    def packed_step(self, packed: PackedMicroBatch, spec: PolicyUpdateSpec) -> LossMetrics:
        """Forward, loss and backward of one packed micro-batch; gradients added to the masters' in fp32.
        Capturable: static shapes, no host synchronisation."""
        weights = self.weights
        with weights.applied():
            # The LM head, the embedding and the MLPs add their weight gradients straight into the masters': no
            # bf16 gradient of theirs is written, read back and accumulated (the (V, H) ones also zeroed first).
            log_probs, entropy = packed_response_log_probs(
                self.model, packed, spec.temperature, GradientTargets.of(self.model, weights.gradient_of),
                self.lm_head_kernels)
        terms = policy_loss_terms(log_probs, entropy, packed, spec, packed.counts[0], packed.counts[1])
        weights.accumulate(torch.autograd.grad(terms.loss, weights.trainable, allow_unused=True))
        return terms.metrics.detached()
