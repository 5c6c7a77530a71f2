"""KL estimators between the policy and a reference policy, KL-in-reward, and KL coefficient controllers.

Estimators (Schulman's k1/k2/k3), with delta = log_probs - ref_log_probs, all of signature
``fn(log_probs (B, T), ref_log_probs (B, T)) -> kl (B, T)``:

    k1 / kl           delta
    abs               |delta|
    k2 / mse          delta^2 / 2
    k3 / low_var_kl   exp(-delta) + delta - 1, with -delta clamped to [-20, 20] and the result to [-10, 10]

Each name also exists with a ``+`` suffix (``k1+``, ``k3+``, ``low_var_kl+``, ...): a straight-through variant
whose forward value is the base estimator and whose gradient is the gradient of k2 (i.e. delta), an unbiased
gradient of KL(policy || reference) for samples of the policy. Every name, ``+`` forms included, is an entry of
``KL_ESTIMATORS``, which config validation reads.

The estimators are elementwise: their values on padded positions are meaningless (garbage in, garbage out);
callers select the valid tokens with ``torch.where`` (``apply_kl_penalty`` does).
"""

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from asyncrl.algos.masked import as_bool_mask, count_valid, fill_invalid, masked_mean, metrics_to_floats
from asyncrl.registry import Entry, Registry

_MAX_LOG_RATIO = 20.0
_MAX_K3 = 10.0

KL_ESTIMATORS: Registry[Entry] = Registry("KL estimator", Entry)


@KL_ESTIMATORS.register("k1", summary="delta = log p - log p_ref: unbiased, high variance")
def k1(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """delta = log p - log p_ref; unbiased but high-variance; (B, T)."""
    return log_probs - ref_log_probs


KL_ESTIMATORS.register("kl", summary="another name for k1")(k1)


@KL_ESTIMATORS.register("abs", summary="|delta|")
def absolute(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """|delta|; (B, T)."""
    return (log_probs - ref_log_probs).abs()


@KL_ESTIMATORS.register("k2", summary="delta^2 / 2: low variance, biased; its gradient is delta")
def k2(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """delta^2 / 2; low variance, biased; its gradient is delta; (B, T)."""
    return 0.5 * (log_probs - ref_log_probs).square()


KL_ESTIMATORS.register("mse", summary="another name for k2")(k2)


@KL_ESTIMATORS.register("k3", summary="exp(-delta) + delta - 1 >= 0: unbiased, low variance, clamped to [-10, 10]")
def k3(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """exp(-delta) + delta - 1 >= 0, unbiased and low-variance; clamped so a bad token cannot explode; (B, T)."""
    negative_delta = (ref_log_probs - log_probs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return (torch.exp(negative_delta) - negative_delta - 1.0).clamp(-_MAX_K3, _MAX_K3)


KL_ESTIMATORS.register("low_var_kl", summary="another name for k3")(k3)


def _straight_through(base):
    """Builds the ``+`` variant of ``base``: forward value of ``base``, gradient of k2."""

    def estimator(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
        value = base(log_probs, ref_log_probs)
        surrogate = k2(log_probs, ref_log_probs)
        return surrogate + (value - surrogate).detach()

    estimator.__name__ = f"{base.__name__}_straight_through"
    estimator.__doc__ = f"Forward value of {base.__name__}, gradient of k2 (delta); (B, T)."
    return estimator


def _register_straight_through_variants() -> None:
    for base in KL_ESTIMATORS.specs():
        KL_ESTIMATORS.register(f"{base.name}+", summary=f"forward value of {base.name}, gradient of k2 (unbiased "
                                                        f"for KL(policy || ref))")(_straight_through(base.fn))


_register_straight_through_variants()


def kl_penalty(name: str, log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """Per-token KL estimate ``name`` between the policy and the reference; (B, T).

    A trailing ``+`` selects the straight-through variant of the base estimator named without it (each base
    name has its ``+`` entry in the registry, so ``k3+`` works; pitfall P14 of the reference).
    """
    return KL_ESTIMATORS[name](log_probs, ref_log_probs)


def apply_kl_penalty(
    token_level_scores: Tensor,  # (B, T) task reward per token
    old_log_probs: Tensor,  # (B, T) log-probs of the policy that is being updated (before the update)
    ref_log_probs: Tensor,  # (B, T)
    response_mask: Tensor,  # (B, T)
    kl_coef: float,
    kl_type: str,
) -> tuple[Tensor, dict[str, float]]:
    """KL in the reward: token_level_rewards = scores - kl_coef * kl_penalty(kl_type, old, ref), 0 on padding.

    Metrics: ``actor/reward_kl_penalty`` = batch mean of the per-sequence mean KL (sequences without a valid
    token are left out), which is what a KL controller's ``update`` takes, and ``actor/reward_kl_penalty_coeff``.
    """
    valid = as_bool_mask(response_mask)
    with torch.no_grad():
        kl = fill_invalid(kl_penalty(kl_type, old_log_probs, ref_log_probs), valid)  # (B, T)
        token_level_rewards = fill_invalid(token_level_scores - kl_coef * kl, valid)
        sequence_kl = masked_mean(kl, valid, dim=-1)  # (B,)
        has_tokens = count_valid(valid, dim=-1) > 0
        current_kl = masked_mean(sequence_kl, has_tokens)
    metrics = metrics_to_floats({"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": kl_coef})
    return token_level_rewards, metrics


@dataclass
class FixedKLController:
    """A constant KL coefficient."""

    kl_coef: float

    def update(self, current_kl: float, num_steps: int) -> None:
        """Does nothing: the coefficient is fixed."""

    def state_dict(self) -> dict[str, float]:
        return {"kl_coef": self.kl_coef}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.kl_coef = float(state["kl_coef"])


@dataclass
class AdaptiveKLController:
    """Adaptive KL coefficient of Ziegler et al. (2019): steers the observed KL towards ``target_kl``.

    error = clip(current_kl / target_kl - 1, -0.2, 0.2); kl_coef <- kl_coef * (1 + error * num_steps / horizon),
    where num_steps is the number of samples seen since the last update (the batch size).
    """

    kl_coef: float
    target_kl: float
    horizon: int

    def __post_init__(self) -> None:
        if self.target_kl <= 0 or self.horizon <= 0:
            raise ValueError(
                f"AdaptiveKLController needs target_kl > 0 and horizon > 0, got {self.target_kl} and {self.horizon}"
            )

    def update(self, current_kl: float, num_steps: int) -> None:
        if not math.isfinite(current_kl):
            raise ValueError(f"AdaptiveKLController.update got a non-finite current_kl {current_kl}")
        error = min(max(current_kl / self.target_kl - 1.0, -0.2), 0.2)
        self.kl_coef *= 1.0 + error * num_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"kl_coef": self.kl_coef, "target_kl": self.target_kl, "horizon": self.horizon}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.kl_coef = float(state["kl_coef"])
        self.target_kl = float(state["target_kl"])
        self.horizon = int(state["horizon"])
