"""What an update computes, sent with every update call (never read from a config the worker kept).

The reference system built its workers from a serialized config and later changed the driver's copy,
so the loss the driver asked for never reached the workers (its pitfall P13). Here the driver builds a
spec per call and the worker runs exactly that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from asyncrl.algos import PolicyLossKnobs
from asyncrl.config.schema import AsyncRLConfig


@dataclass(frozen=True)
class PolicyUpdateSpec:
    loss_mode: str                      # a key of algos.POLICY_LOSSES
    policy_loss: PolicyLossKnobs        # the loss's configuration (its aggregation also reduces entropy and KL)
    entropy_coeff: float
    use_kl_loss: bool
    kl_loss_coef: float
    kl_loss_type: str
    ppo_epochs: int
    num_mini_batches: int               # optimizer steps per epoch; each rank splits its shard into this many
    micro_batch_size: int               # rows per forward/backward on one rank
    max_tokens_per_micro_batch: Optional[int]   # dynamic micro-batching budget, None = by rows
    shuffle: bool
    seed: int
    temperature: float
    grad_clip: float
    norm_length: int                    # constant normaliser of seq-mean-token-sum-norm: max response length
    # Bypass-mode correction, computed per micro-batch from current vs rollout log-probs.
    bypass_is_level: Optional[str] = None
    bypass_is_threshold: float = 2.0
    bypass_rs_level: Optional[str] = None
    bypass_rs_threshold: Optional[float] = None
    bypass_rs_threshold_lower: Optional[float] = None
    # Mixture-of-experts models (`train/routing.py`): replay the rollout's experts; the load-balancing loss weight
    # (None: the model's config.json router_aux_loss_coef).
    routing_replay: bool = False
    router_aux_loss_coef: Optional[float] = None

    @classmethod
    def from_config(cls, config: AsyncRLConfig, num_rows: int, step: int) -> "PolicyUpdateSpec":
        """The spec for a batch of `num_rows` responses at training step `step`."""
        actor, correction = config.actor, config.algorithm.rollout_correction
        loss_mode = actor.policy_loss.loss_mode
        bypass = correction.bypass_mode
        if bypass and correction.loss_type == "reinforce":
            loss_mode = "reinforce"
        return cls(
            loss_mode=loss_mode, policy_loss=PolicyLossKnobs.from_sections(actor.policy_loss, actor),
            entropy_coeff=actor.entropy_coeff, use_kl_loss=actor.use_kl_loss, kl_loss_coef=actor.kl_loss_coef,
            kl_loss_type=actor.kl_loss_type, ppo_epochs=actor.ppo_epochs,
            num_mini_batches=num_mini_batches(num_rows, actor.ppo_mini_batch_size * config.rollout.n),
            micro_batch_size=actor.ppo_micro_batch_size_per_gpu,
            max_tokens_per_micro_batch=actor.ppo_max_token_len_per_gpu if actor.use_dynamic_bsz else None,
            shuffle=actor.shuffle, seed=config.trainer.seed * 100003 + step, temperature=config.rollout.temperature,
            grad_clip=actor.grad_clip, norm_length=config.data.max_response_length,
            bypass_is_level=correction.rollout_is if bypass else None,
            bypass_is_threshold=correction.rollout_is_threshold,
            bypass_rs_level=correction.rollout_rs if bypass else None,
            bypass_rs_threshold=correction.rollout_rs_threshold,
            bypass_rs_threshold_lower=correction.rollout_rs_threshold_lower,
            routing_replay=config.algorithm.routing_replay,
            router_aux_loss_coef=actor.router_aux_loss_coef,
        )


@dataclass(frozen=True)
class CriticUpdateSpec:
    loss_agg_mode: str
    cliprange_value: float
    ppo_epochs: int
    num_mini_batches: int
    micro_batch_size: int
    max_tokens_per_micro_batch: Optional[int]
    shuffle: bool
    seed: int
    grad_clip: float
    norm_length: int

    @classmethod
    def from_config(cls, config: AsyncRLConfig, num_rows: int, step: int) -> "CriticUpdateSpec":
        critic = config.critic
        return cls(
            loss_agg_mode=critic.loss_agg_mode, cliprange_value=critic.cliprange_value, ppo_epochs=critic.ppo_epochs,
            num_mini_batches=num_mini_batches(num_rows, critic.ppo_mini_batch_size * config.rollout.n),
            micro_batch_size=critic.ppo_micro_batch_size_per_gpu,
            max_tokens_per_micro_batch=config.actor.ppo_max_token_len_per_gpu if config.actor.use_dynamic_bsz else None,
            shuffle=config.actor.shuffle, seed=config.trainer.seed * 100019 + step, grad_clip=critic.grad_clip,
            norm_length=config.data.max_response_length)


def num_mini_batches(num_rows: int, rows_per_mini_batch: int) -> int:
    """Optimizer steps per epoch; a batch smaller than one mini-batch (the last of an epoch) is one step."""
    return max(1, -(-num_rows // rows_per_mini_batch))
