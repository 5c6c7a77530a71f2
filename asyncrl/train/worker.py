"""One trainer rank: the policy, and when the config asks for them the reference policy and the critic.

A `TrainerWorker` lives in one process per device (a Ray actor in a run; plain objects in unit tests).
All ranks of a run receive the same calls with their own shard of the batch.

    worker = TrainerWorker(config, rank=0, world_size=1, master_addr="127.0.0.1", master_port=29500,
                           total_training_steps=100)
    log_probs, entropy = worker.compute_log_prob(batch)
    metrics = worker.update_actor(batch, PolicyUpdateSpec.from_config(config, batch.num_rows, step))
    worker.save_checkpoint("ckpt/step_3"); worker.load_checkpoint("ckpt/step_3")
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from typing import Any, Iterator, Optional

import torch
from torch import Tensor

from asyncrl.config import AsyncRLConfig, needs_critic, needs_reference
from asyncrl.models import (CausalLM, avoid_per_shape_attention_plans, compile_decoder_layers, load_model,
                            load_named_tensors, read_config, save_model)
from asyncrl.models.lora import adapters_disabled, add_adapters, is_adapter_name, lora_spec
from asyncrl.train.actor import PolicyTrainer
from asyncrl.train.batch import TrainBatch
from asyncrl.train.checkpoint import Component, load_trainer_state, save_trainer_state
from asyncrl.train.critic import CriticTrainer
from asyncrl.train.fast.selection import fast_update
from asyncrl.train.forward import batched_log_probs
from asyncrl.train.lora_export import export_lora_policy, size_metrics
from asyncrl.train.optim import build_optimizer, build_scheduler
from asyncrl.train.parallel import init_process_group, iter_full_tensors, iter_unit_tensors, is_unsharded, rank, shard_model
from asyncrl.train.update_spec import CriticUpdateSpec, PolicyUpdateSpec

# Intra-op threads of a GPU rank's host. Its CPU ops are bookkeeping on small tensors (selecting and packing
# micro-batches, a few thousand elements); with a thread per core, on a 16-core H200 host such an op took 8 ms
# instead of 0.1 ms whenever a pool thread was descheduled, in about half of the processes measured, which
# doubled a graphed 0.5B update (0.55 vs 0.29 s).
GPU_HOST_THREADS = 1


def resolve_device(setting: str) -> torch.device:
    if setting == "cuda" or (setting == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("trainer.device=cuda but this process sees no CUDA device")
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def compute_dtype(setting: str, device: torch.device) -> Optional[torch.dtype]:
    """Mixed-precision compute dtype (None = the fp32 parameters' own)."""
    if setting == "bfloat16" or (setting == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


class TrainerWorker:
    def __init__(self, config: AsyncRLConfig, rank: int, world_size: int, master_addr: str, master_port: int,
                 total_training_steps: int):
        self.config = config
        self.device = resolve_device(config.trainer.device)
        self.param_dtype = compute_dtype(config.model.dtype, self.device)
        if self.device.type == "cuda":
            avoid_per_shape_attention_plans()  # micro-batch shapes change from one to the next
            torch.set_num_threads(GPU_HOST_THREADS)
        torch.manual_seed(config.trainer.seed)
        self.rank = rank
        self.mesh = init_process_group(rank, world_size, master_addr, master_port, self.device)
        self.lora = lora_spec(config)
        self.actor = self.build_actor(total_training_steps)
        # With LoRA the reference policy is the actor with its adapters off (`reference_forward`): no second copy.
        self.reference: Optional[CausalLM] = self.build_reference() \
            if needs_reference(config) and self.lora is None else None
        self.critic: Optional[CriticTrainer] = self.build_critic(total_training_steps) if needs_critic(config) \
            else None
        self.persistent_sync_tensors: Optional[list[tuple[str, Tensor]]] = None

    def build_actor(self, total_steps: int) -> PolicyTrainer:
        # actor.cuda_graphs (one rank, checked with the config): no FSDP, whose gathered copies move every step; the
        # fast update keeps fixed-address compute copies instead, so its micro-batch step can be replayed from graphs.
        actor = self.config.actor
        model = self.load(self.config.model.path, "causal_lm", shard=not actor.cuda_graphs, adapted=True)
        update = fast_update(model, actor, self.param_dtype, self.device)
        optimizer = build_optimizer(model, actor.optim) if update is None else update.optimizer
        return PolicyTrainer(model, optimizer, build_scheduler(optimizer, actor.optim, total_steps), self.device,
                             self.config.trainer.max_consecutive_nonfinite, fast_update=update,
                             routing_replay=self.config.algorithm.routing_replay)

    def build_reference(self) -> CausalLM:
        model = self.load(self.config.model.path, "causal_lm")
        model.requires_grad_(False)
        return model.eval()

    def build_critic(self, total_steps: int) -> CriticTrainer:
        model = self.load(self.config.critic.model_path or self.config.model.path, "value")
        optimizer = build_optimizer(model, self.config.critic.optim)
        return CriticTrainer(model, optimizer, build_scheduler(optimizer, self.config.critic.optim, total_steps),
                             self.device, self.config.trainer.max_consecutive_nonfinite)

    def load(self, folder: str, kind: str, shard: bool = True, adapted: bool = False) -> torch.nn.Module:
        # Master weights stay fp32; FSDP's mixed-precision policy (or the fast update's compute copies) casts them to
        # the compute dtype.
        model = load_model(folder, dtype=torch.float32, device=self.device, kind=kind)
        if adapted and self.lora is not None:
            add_adapters(model, self.lora)  # only the adapters train (and have optimizer state)
        model.set_gradient_checkpointing(self.config.model.gradient_checkpointing)
        if self.config.model.compile and self.device.type == "cuda":
            compile_decoder_layers(model)
        return shard_model(model, self.mesh, self.param_dtype) if shard else model

    # ---- stages ---------------------------------------------------------------------------------------
    def compute_log_prob(self, batch: TrainBatch) -> tuple[Tensor, Tensor]:
        actor = self.config.actor
        max_tokens = actor.ppo_max_token_len_per_gpu if actor.use_dynamic_bsz else None
        return self.actor.compute_log_prob(batch, self.config.rollout.temperature,
                                           actor.log_prob_micro_batch_size_per_gpu, max_tokens, with_entropy=True)

    def compute_ref_log_prob(self, batch: TrainBatch) -> Tensor:
        if self.reference is None and self.lora is None:
            raise RuntimeError("compute_ref_log_prob: no reference policy (neither algorithm.use_kl_in_reward "
                               "nor actor.use_kl_loss is set)")
        actor = self.config.actor
        max_tokens = actor.ppo_max_token_len_per_gpu if actor.use_dynamic_bsz else None
        model = self.reference if self.reference is not None else self.actor.model.eval()
        with self.reference_forward():
            log_probs, _ = batched_log_probs(model, batch, self.config.rollout.temperature,
                                             self.config.ref.log_prob_micro_batch_size_per_gpu, max_tokens,
                                             with_entropy=False, device=self.device)
        return log_probs

    def reference_forward(self) -> contextlib.AbstractContextManager:
        """With LoRA the actor computes the reference: its adapters off, its base weights are the base model."""
        return adapters_disabled(self.actor.model) if self.lora is not None else contextlib.nullcontext()

    def compute_values(self, batch: TrainBatch) -> Tensor:
        critic = self.require_critic("compute_values")
        max_tokens = self.config.actor.ppo_max_token_len_per_gpu if self.config.actor.use_dynamic_bsz else None
        return critic.compute_values(batch, self.config.critic.ppo_micro_batch_size_per_gpu, max_tokens)

    def update_actor(self, batch: TrainBatch, spec: PolicyUpdateSpec) -> dict[str, float]:
        metrics = self.actor.update(batch, spec)
        return metrics | size_metrics(self.actor.model, self.actor.optimizer, self.reference, self.sync_tensor_names(),
                                      self.param_dtype or torch.float32)

    def update_critic(self, batch: TrainBatch, spec: CriticUpdateSpec) -> dict[str, float]:
        return self.require_critic("update_critic").update(batch, spec)

    def require_critic(self, stage: str) -> CriticTrainer:
        if self.critic is None:
            raise RuntimeError(f"{stage}: this run has no critic (critic.enable / algorithm.adv_estimator=gae)")
        return self.critic

    # ---- weights --------------------------------------------------------------------------------------
    def iter_policy_tensors(self) -> Iterator[tuple[str, Tensor]]:
        """Full policy tensors one at a time, HF names; every rank must iterate (collective)."""
        return iter_full_tensors(self.actor.model)

    def iter_sync_tensors(self) -> Iterator[tuple[str, Tensor]]:
        """The policy for a weight sync: like `iter_policy_tensors`, gathered an FSDP unit at a time (none on
        one rank); each tensor is valid until the next is asked for (unless `sync_tensors_persist`), and
        the receiver casts it. With LoRA only the adapters: the engines hold the same base weights, never trained."""
        if not self.sync_tensors_persist:
            return self.synced(iter_unit_tensors(self.actor.model))
        if self.persistent_sync_tensors is None:
            # Listed once: asking FSDP for ~300 local shards costs milliseconds, a sync's whole budget.
            self.persistent_sync_tensors = list(self.synced(iter_unit_tensors(self.actor.model)))
        return iter(self.persistent_sync_tensors)

    def synced(self, named_tensors: Iterator[tuple[str, Tensor]]) -> Iterator[tuple[str, Tensor]]:
        """The tensors a sync moves, in the order given (every rank still takes part in every unit's gather)."""
        if self.lora is None:
            return named_tensors
        return ((name, tensor) for name, tensor in named_tensors if is_adapter_name(name))

    def sync_tensor_names(self) -> list[str]:
        """The names `iter_sync_tensors` yields, in order (the weight group's transfer plan follows them)."""
        names = [name for name, _ in self.actor.model.named_parameters()]
        return names if self.lora is None else [name for name in names if is_adapter_name(name)]

    @functools.cached_property
    def sync_tensors_persist(self) -> bool:
        """On one rank the sync tensors are the weights themselves: they outlive a sync, and the optimizer,
        snapshot swaps and checkpoint loads all update them in place."""
        return is_unsharded(self.actor.model)

    def policy_state_numpy(self) -> dict[str, Any]:
        """Full policy weights as numpy (rank 0's view; tests compare them bitwise with engines)."""
        # A copy: numpy views would pin FSDP's parameter storage, which it frees and regrows.
        return {name: tensor.to("cpu", torch.float32, copy=True).numpy() for name, tensor in self.iter_policy_tensors()}

    def export_policy(self, folder: str | Path) -> None:
        """Write the policy as an HF folder (rank 0 writes; every rank must call: it gathers). With LoRA the
        folder holds the merged weights, and `folder/adapter` the adapter in PEFT's format."""
        tensors = {name: tensor.cpu() for name, tensor in self.iter_policy_tensors()}
        if rank() != 0:
            return
        if self.lora is not None:
            tensors = export_lora_policy(tensors, self.lora, self.config.model.path, Path(folder) / "adapter")
        config, _ = read_config(self.config.model.path)
        with torch.device("meta"):
            model = CausalLM(config)
        model.to_empty(device="cpu")
        model.tie_weights()
        load_named_tensors(model, tensors.items())
        save_model(model, folder, tokenizer_folder=self.config.model.tokenizer_path or self.config.model.path)

    # ---- checkpoints ----------------------------------------------------------------------------------
    def components(self) -> dict[str, Component]:
        components: dict[str, Component] = {"actor": (self.actor.model, self.actor.optimizer, self.actor.scheduler)}
        if self.critic is not None:
            components["critic"] = (self.critic.model, self.critic.optimizer, self.critic.scheduler)
        return components

    def save_checkpoint(self, folder: str | Path) -> None:
        save_trainer_state(folder, self.components(), extra={"actor_skipped": self.actor.guard.num_skipped})

    def load_checkpoint(self, folder: str | Path) -> None:
        extra = load_trainer_state(folder, self.components())
        self.persistent_sync_tensors = None  # listed again, in case loading replaced a tensor
        self.actor.guard.num_skipped = extra["actor_skipped"]
