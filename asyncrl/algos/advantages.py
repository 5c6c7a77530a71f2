"""Advantage estimators: from per-token rewards to per-token advantages and returns.

Every estimator has the same signature, so the driver calls ``ADVANTAGE_ESTIMATORS[name](...)`` with one knob
record and the batch's own tensors, and each entry reads what it needs:

    fn(token_level_rewards,      # (B, T) reward per response token; an outcome reward sits on the last valid token
       response_mask,            # (B, T) float or bool, 1 on valid response tokens
       group_ids,                # (B,) integer, equal for the n responses of one prompt
       knobs=AdvantageKnobs(),   # the configuration: gamma, lam, norm_adv_by_std_in_grpo
       *, values=None,           # (B, T) critic values, needed by gae
       reward_baselines=None,    # (B,) score of the greedy response of the same prompt, needed by remax;
                                 #   row i holds the score of its own prompt's greedy response
    ) -> (advantages (B, T), returns (B, T))

Both outputs are 0 on padded positions, whatever the inputs hold there. The sequence score r_i is the sum of
the valid token rewards of row i. Groups are the rows sharing a group id; they may have unequal sizes.

Each estimator is registered with what it needs (``AdvantageEstimatorSpec``), which config validation reads:
a new one is a function of this signature plus ``@ADVANTAGE_ESTIMATORS.register(name, summary=..., ...)``.

Choices:
- A group of one sample has nobody to be compared with, so every group estimator gives it advantage 0
  (grpo, dr_grpo, rloo, opo, gpg, grpo_passk, and reinforce_plus_plus_baseline before the batch whitening). The
  reference system keeps A = r for an RLOO singleton and uses std 1 for a GRPO singleton; we do not push a
  prompt whose group collapsed to a single sample in any direction.
- Whitening is (x - mean) / sqrt(var + 1e-8) over the valid tokens of the batch, with the population variance.
- Outcome-only estimators return ``returns = advantages`` (no critic consumes them).
"""

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from asyncrl.algos.knobs import Knobs
from asyncrl.algos.masked import as_bool_mask, count_valid, fill_invalid, masked_sum, masked_whiten
from asyncrl.registry import Entry, Registry, column


@dataclass(frozen=True)
class AdvantageEstimatorSpec(Entry):
    """What an advantage estimator needs from the run."""

    needs_critic: bool = column("needs a critic", False)  # reads ``values`` (B, T)
    needs_groups: bool = column("compares a prompt's responses (rollout.n >= 2)", False)
    # Reads ``reward_baselines``, the reward of a greedy response per prompt, which generation then adds in every mode.
    needs_greedy_baseline: bool = column("needs a greedy response per prompt (generated beside the group)", False)


ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimatorSpec] = Registry("advantage estimator", AdvantageEstimatorSpec)


@dataclass(frozen=True)
class AdvantageKnobs(Knobs):
    """Every estimator's configuration, one record under the config's names (`algorithm.*`; each estimator reads
    what it needs): `AdvantageKnobs.from_sections(config.algorithm)`. A new knob is a field here and a key of that
    name in the schema."""

    gamma: float = 1.0                      # discount of gae and reinforce_plus_plus
    lam: float = 1.0                        # gae's lambda
    norm_adv_by_std_in_grpo: bool = True    # grpo and grpo_passk divide by the group std (false: Dr.GRPO)


DEFAULT_KNOBS = AdvantageKnobs()
GROUP_STD_EPSILON = 1e-6  # added to a group's std before dividing by it


# ----------------------------------------------------------------------------------------------- helpers
def _float_dtype(tensor: Tensor) -> torch.dtype:
    # Statistics in at least float32 even when rewards arrive in bf16.
    return torch.promote_types(tensor.dtype, torch.float32)


def _check_shapes(token_level_rewards: Tensor, response_mask: Tensor, group_ids: Tensor) -> None:
    if token_level_rewards.dim() != 2 or token_level_rewards.shape != response_mask.shape:
        raise ValueError(
            f"token_level_rewards and response_mask must both be (B, T), got "
            f"{tuple(token_level_rewards.shape)} and {tuple(response_mask.shape)}"
        )
    if group_ids.shape != token_level_rewards.shape[:1]:
        raise ValueError(f"group_ids must be (B,) = {tuple(token_level_rewards.shape[:1])}, got {tuple(group_ids.shape)}")


def _sequence_scores(token_level_rewards: Tensor, response_mask: Tensor) -> Tensor:
    """r_i = sum of the valid token rewards of row i; (B,)."""
    return masked_sum(token_level_rewards.to(_float_dtype(token_level_rewards)), response_mask, dim=-1)


def _broadcast(per_sequence: Tensor, response_mask: Tensor) -> Tensor:
    """(B,) -> (B, T): the sequence value on every valid token, 0 on padding."""
    return torch.where(as_bool_mask(response_mask), per_sequence[:, None], 0.0)


def _group_sum(per_sequence: Tensor, inverse: Tensor, num_groups: int) -> Tensor:
    """Sum of a (B,) tensor within each group; (G,)."""
    return per_sequence.new_zeros(num_groups).index_add_(0, inverse, per_sequence)


def _group_index(group_ids: Tensor) -> tuple[Tensor, int]:
    """Maps arbitrary group ids (B,) to dense indices in [0, G); returns (indices (B,), G)."""
    unique_ids, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, unique_ids.numel()


def _group_statistics(scores: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-row group mean, unbiased group std (0 for a singleton) and group size, each (B,)."""
    inverse, num_groups = _group_index(group_ids)
    sizes = _group_sum(torch.ones_like(scores), inverse, num_groups)  # (G,)
    means = _group_sum(scores, inverse, num_groups) / sizes
    squared = _group_sum((scores - means[inverse]) ** 2, inverse, num_groups)
    stds = torch.sqrt(squared / (sizes - 1.0).clamp_min(1.0))  # a singleton has squared = 0, hence std 0
    return means[inverse], stds[inverse], sizes[inverse]


def _discounted_returns(token_level_rewards: Tensor, response_mask: Tensor, gamma: float) -> Tensor:
    """G_t = r_t + gamma * G_next over valid tokens; padded positions carry G through. (B, T), 0 on padding."""
    valid = as_bool_mask(response_mask)
    rewards = fill_invalid(token_level_rewards.to(_float_dtype(token_level_rewards)), valid)
    if gamma == 1.0:
        # Undiscounted: a reverse cumulative sum (padding adds 0, so it carries the return through).
        returns = rewards.flip(-1).cumsum(-1).flip(-1)
        return fill_invalid(returns, valid)
    returns = torch.zeros_like(rewards)
    running = rewards.new_zeros(rewards.shape[0])  # (B,)
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(valid[:, t], rewards[:, t] + gamma * running, running)
        returns[:, t] = running
    return fill_invalid(returns, valid)


# ------------------------------------------------------------------------------------------- estimators
@ADVANTAGE_ESTIMATORS.register(
    "gae", needs_critic=True,
    summary="generalised advantage estimation from the critic's values (gamma, lam), whitened over the batch")
def gae(token_level_rewards, response_mask, group_ids, knobs=DEFAULT_KNOBS, *,
        values=None, reward_baselines=None):
    """Generalised advantage estimation (Schulman et al.) from critic ``values`` (B, T).

    Backward over t on valid tokens: delta_t = r_t + gamma V_next - V_t, A_t = delta_t + gamma lam A_next.
    A padded position (e.g. an observation token in multi-turn) carries V_next and A_next through unchanged.
    returns = A + V (before whitening); advantages = whiten(A) over the valid tokens of the batch.
    """
    _check_shapes(token_level_rewards, response_mask, group_ids)
    if values is None:
        raise ValueError("advantage estimator 'gae' needs values (B, T) from the critic, got None")
    valid = as_bool_mask(response_mask)
    dtype = _float_dtype(token_level_rewards)
    rewards = fill_invalid(token_level_rewards.to(dtype), valid)
    values = fill_invalid(values.to(dtype), valid)
    advantages = torch.zeros_like(rewards)
    next_value = rewards.new_zeros(rewards.shape[0])  # (B,)
    next_advantage = rewards.new_zeros(rewards.shape[0])  # (B,)
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + knobs.gamma * next_value - values[:, t]
        advantage = delta + knobs.gamma * knobs.lam * next_advantage
        next_advantage = torch.where(valid[:, t], advantage, next_advantage)
        next_value = torch.where(valid[:, t], values[:, t], next_value)
        advantages[:, t] = next_advantage
    returns = fill_invalid(advantages + values, valid)
    return masked_whiten(advantages, valid), returns


@ADVANTAGE_ESTIMATORS.register(
    "grpo", needs_groups=True,
    summary="(r - group mean) / (group std + epsilon); no division with algorithm.norm_adv_by_std_in_grpo=false")
def grpo(token_level_rewards, response_mask, group_ids, knobs=DEFAULT_KNOBS, *,
         values=None, reward_baselines=None):
    """GRPO: A_i = (r_i - mean_g) / (std_g + epsilon) with the unbiased group std, broadcast over tokens.

    With ``knobs.norm_adv_by_std_in_grpo`` false it is Dr.GRPO: A_i = r_i - mean_g. A singleton group gets 0.
    """
    _check_shapes(token_level_rewards, response_mask, group_ids)
    scores = _sequence_scores(token_level_rewards, response_mask)  # (B,)
    means, stds, _ = _group_statistics(scores, group_ids)
    advantages = scores - means  # exactly 0 for a singleton (its mean is its own score)
    if knobs.norm_adv_by_std_in_grpo:
        advantages = advantages / (stds + GROUP_STD_EPSILON)
    advantages = _broadcast(advantages, response_mask)
    return advantages, advantages


@ADVANTAGE_ESTIMATORS.register(
    "dr_grpo", needs_groups=True,
    summary="Dr.GRPO: r - group mean, never divided by the std")
def dr_grpo(token_level_rewards, response_mask, group_ids, knobs=DEFAULT_KNOBS, *,
            values=None, reward_baselines=None):
    """Dr.GRPO (Liu et al.): A_i = r_i - mean_g, never divided by the std (``norm_adv_by_std_in_grpo`` is ignored)."""
    return grpo(token_level_rewards, response_mask, group_ids, replace(knobs, norm_adv_by_std_in_grpo=False))


@ADVANTAGE_ESTIMATORS.register(
    "rloo", needs_groups=True,
    summary="REINFORCE leave-one-out: r minus the mean of the prompt's other responses")
def rloo(token_level_rewards, response_mask, group_ids, knobs=DEFAULT_KNOBS, *,
         values=None, reward_baselines=None):
    """REINFORCE leave-one-out: A_i = r_i - mean of the other samples = n/(n-1) (r_i - mean_g).

    A singleton group has no other sample: its advantage is 0 (the reference system keeps r_i there).
    """
    _check_shapes(token_level_rewards, response_mask, group_ids)
    scores = _sequence_scores(token_level_rewards, response_mask)
    means, _, sizes = _group_statistics(scores, group_ids)
    factor = torch.where(sizes > 1, sizes / (sizes - 1.0).clamp_min(1.0), 0.0)
    advantages = _broadcast(factor * (scores - means), response_mask)
    return advantages, advantages


@ADVANTAGE_ESTIMATORS.register(
    "reinforce_plus_plus",
    summary="REINFORCE++: discounted return-to-go (gamma), whitened over the batch")
def reinforce_plus_plus(token_level_rewards, response_mask, group_ids, knobs=DEFAULT_KNOBS, *,
                        values=None, reward_baselines=None):
    """REINFORCE++: G = discounted return-to-go with ``gamma``; A = whiten(G) over the batch; returns = G."""
    _check_shapes(token_level_rewards, response_mask, group_ids)
    returns = _discounted_returns(token_level_rewards, response_mask, knobs.gamma)
    return masked_whiten(returns, response_mask), returns


@ADVANTAGE_ESTIMATORS.register(
    "reinforce_plus_plus_baseline", needs_groups=True,
    summary="REINFORCE++ with a group baseline: r - group mean, whitened over the batch")
def reinforce_plus_plus_baseline(token_level_rewards, response_mask, group_ids, knobs=DEFAULT_KNOBS, *,
                                 values=None, reward_baselines=None):
    """REINFORCE++ with a group baseline: r_i - mean_g broadcast over tokens, then whitened over the batch."""
    _check_shapes(token_level_rewards, response_mask, group_ids)
    scores = _sequence_scores(token_level_rewards, response_mask)
    means, _, _ = _group_statistics(scores, group_ids)
    advantages = masked_whiten(_broadcast(scores - means, response_mask), response_mask)
    return advantages, advantages


@ADVANTAGE_ESTIMATORS.register(
    "remax", needs_greedy_baseline=True,
    summary="ReMax: reward-to-go minus the score of the prompt's greedy response")
def remax(token_level_rewards, response_mask, group_ids, knobs=DEFAULT_KNOBS, *,
          values=None, reward_baselines=None):
    """ReMax: A_t = G_t - b_i with G the undiscounted reward-to-go (``gamma`` is ignored, as in the paper)
    and b_i = ``reward_baselines`` (B,), the score of the greedy response of the same prompt; returns = G."""
    _check_shapes(token_level_rewards, response_mask, group_ids)
    if reward_baselines is None:
        raise ValueError("advantage estimator 'remax' needs reward_baselines (B,) (greedy-response scores), got None")
    if reward_baselines.shape != group_ids.shape:
        # A (B, 1) or (B, T) baseline would broadcast silently into a wrong advantage.
        raise ValueError(f"reward_baselines must be (B,) = {tuple(group_ids.shape)}, got {tuple(reward_baselines.shape)}")
    returns = _discounted_returns(token_level_rewards, response_mask, 1.0)
    baselines = reward_baselines.to(returns.dtype)[:, None]  # (B, 1)
    return fill_invalid(returns - baselines, response_mask), returns


@ADVANTAGE_ESTIMATORS.register("opo", needs_groups=True, summary="OPO: r minus the length-weighted group mean")
def opo(token_level_rewards, response_mask, group_ids, knobs=DEFAULT_KNOBS, *,
        values=None, reward_baselines=None):
    """OPO: length-weighted group baseline b_g = sum_j l_j r_j / sum_j l_j (l = valid length); A_i = r_i - b_g."""
    _check_shapes(token_level_rewards, response_mask, group_ids)
    scores = _sequence_scores(token_level_rewards, response_mask)
    lengths = count_valid(response_mask, dim=-1).to(scores.dtype)  # (B,)
    inverse, num_groups = _group_index(group_ids)
    weighted = _group_sum(lengths * scores, inverse, num_groups)
    # A group whose lengths are all 0 has all scores 0: the clamp makes its baseline 0 instead of 0/0.
    baselines = weighted / _group_sum(lengths, inverse, num_groups).clamp_min(1.0)
    advantages = _broadcast(scores - baselines[inverse], response_mask)
    return advantages, advantages


@ADVANTAGE_ESTIMATORS.register(
    "gpg", needs_groups=True,
    summary="GPG: (r - group mean) x B / number of non-zero scores")
def gpg(token_level_rewards, response_mask, group_ids, knobs=DEFAULT_KNOBS, *,
        values=None, reward_baselines=None):
    """GPG: A_i = alpha (r_i - mean_g) with alpha = B / max(1, number of non-zero scores); no std division."""
    _check_shapes(token_level_rewards, response_mask, group_ids)
    scores = _sequence_scores(token_level_rewards, response_mask)
    means, _, _ = _group_statistics(scores, group_ids)
    alpha = scores.shape[0] / max(1, int(torch.count_nonzero(scores)))
    advantages = _broadcast(alpha * (scores - means), response_mask)
    return advantages, advantages


@ADVANTAGE_ESTIMATORS.register(
    "grpo_passk", needs_groups=True,
    summary="pass@k: the best response of a group gets (best - second best) / (group std + epsilon), the others 0; "
            "no division with algorithm.norm_adv_by_std_in_grpo=false")
def grpo_passk(token_level_rewards, response_mask, group_ids, knobs=DEFAULT_KNOBS, *,
               values=None, reward_baselines=None):
    """Pass@k training (Chen et al., arXiv 2503.19595): only the best response of a group is pushed, by how much
    it beats the second best: A_best = (r_max - r_second) / (std_g + epsilon) with the unbiased group std (no
    division with ``norm_adv_by_std_in_grpo`` false); every other response gets 0. A group's pass@k rises only through
    its best sample, so the others get no gradient, neither up nor down.

    When several responses tie for the best, r_max - r_second = 0, so the choice among them does not matter (the
    lowest row index is taken). A singleton group gets 0 (the reference system refuses groups below 2).
    """
    _check_shapes(token_level_rewards, response_mask, group_ids)
    scores = _sequence_scores(token_level_rewards, response_mask)  # (B,)
    inverse, num_groups = _group_index(group_ids)
    _, stds, sizes = _group_statistics(scores, group_ids)
    rows = torch.arange(scores.shape[0], device=scores.device)  # (B,)
    best = scores.new_full((num_groups,), -torch.inf).scatter_reduce(0, inverse, scores, "amax")  # (G,)
    # The first row (lowest index) holding its group's maximum; every group has one, so no index stays at B.
    is_maximum = scores == best[inverse]
    first = torch.full_like(best, scores.shape[0], dtype=torch.long).scatter_reduce(
        0, inverse, torch.where(is_maximum, rows, scores.shape[0]), "amin")  # (G,)
    is_best = rows == first[inverse]  # (B,), one row per group
    second = scores.new_full((num_groups,), -torch.inf).scatter_reduce(
        0, inverse, torch.where(is_best, -torch.inf, scores), "amax")  # (G,); -inf for a singleton
    gap = best[inverse] - second[inverse]
    if knobs.norm_adv_by_std_in_grpo:
        gap = gap / (stds + GROUP_STD_EPSILON)
    advantages = _broadcast(torch.where(is_best & (sizes > 1), gap, 0.0), response_mask)
    return advantages, advantages

