"""Advantage estimators against float64 loops, on a padded batch with garbage in the padding."""

import inspect
import math

import pytest
import torch

from asyncrl.algos import ADVANTAGE_ESTIMATORS, AdvantageKnobs

from .helpers import append_padding, fill_padding, reference_whiten, valid_positions

# 7 responses, T = 5. Groups (ids deliberately not contiguous): 7 -> rows 0, 2, 5; 3 -> rows 1, 4, 6
# (row 6 is empty); 11 -> row 3 alone. Row 3 has a hole at t = 1 (an observation token in multi-turn).
MASK = torch.tensor(
    [
        [1, 1, 1, 1, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 1, 1],
        [1, 0, 1, 1, 0],
        [1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0],
        [0, 0, 0, 0, 0],
    ],
    dtype=torch.float64,
)
GROUP_IDS = torch.tensor([7, 3, 7, 11, 3, 7, 3])
BASELINES = torch.tensor([0.5, -1.0, 0.25, 2.0, 0.0, 1.0, 0.3], dtype=torch.float64)


def make_inputs():
    generator = torch.Generator().manual_seed(0)
    rewards = torch.randn(MASK.shape, generator=generator, dtype=torch.float64)
    values = torch.randn(MASK.shape, generator=generator, dtype=torch.float64)
    rewards = fill_padding(rewards, MASK, math.nan)
    rewards[6, 0] = math.inf  # any garbage, not only nan
    return rewards, fill_padding(values, MASK, math.nan)


def scores_of(rewards) -> list[float]:
    return [sum(float(rewards[i, t]) for t in row) for i, row in enumerate(valid_positions(MASK))]


def groups_of(index: int) -> list[int]:
    return [j for j in range(len(GROUP_IDS)) if int(GROUP_IDS[j]) == int(GROUP_IDS[index])]


def broadcast(per_sequence: list[float]) -> torch.Tensor:
    return torch.tensor(per_sequence, dtype=torch.float64)[:, None] * MASK


def call(name, rewards, values, **knobs):
    """The estimator on the module's batch, with `knobs` (AdvantageKnobs fields) over the defaults."""
    return ADVANTAGE_ESTIMATORS[name](rewards, MASK, GROUP_IDS, AdvantageKnobs(**knobs), values=values,
                                      reward_baselines=BASELINES)


@pytest.mark.parametrize("norm_adv_by_std", [True, False])
def test_grpo_matches_loop(norm_adv_by_std):
    rewards, values = make_inputs()
    scores = scores_of(rewards)
    expected = []
    for i in range(len(scores)):
        members = [scores[j] for j in groups_of(i)]
        mean = sum(members) / len(members)
        if len(members) == 1:
            expected.append(0.0)
            continue
        std = math.sqrt(sum((x - mean) ** 2 for x in members) / (len(members) - 1))
        expected.append((scores[i] - mean) / (std + 1e-6) if norm_adv_by_std else scores[i] - mean)
    advantages, returns = call("grpo", rewards, values, norm_adv_by_std_in_grpo=norm_adv_by_std)
    torch.testing.assert_close(advantages, broadcast(expected))
    torch.testing.assert_close(returns, advantages)
    assert expected[3] == 0.0 and advantages[3].abs().max() == 0.0  # the singleton group


def test_dr_grpo_never_divides_by_std():
    rewards, values = make_inputs()
    expected, _ = call("grpo", rewards, values, norm_adv_by_std_in_grpo=False)
    advantages, _ = call("dr_grpo", rewards, values, norm_adv_by_std_in_grpo=True)
    torch.testing.assert_close(advantages, expected)
    assert not torch.allclose(advantages, call("grpo", rewards, values, norm_adv_by_std_in_grpo=True)[0])


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "gpg", "opo"])
def test_group_advantages_have_zero_mean_within_each_group(name):
    rewards, values = make_inputs()
    advantages = call(name, rewards, values)[0]
    lengths = MASK.sum(dim=1)
    for group_id in (7, 3):
        rows = (GROUP_IDS == group_id) & (lengths > 0)
        per_sequence = advantages[rows, 0]  # column 0 is valid in every non-empty row
        # opo's baseline is length-weighted, so the length-weighted mean is the one that vanishes
        weights = lengths[rows] if name == "opo" else torch.ones_like(per_sequence)
        assert per_sequence.abs().max() > 1e-3  # not trivially zero
        if group_id == 3 and name != "opo":
            continue  # group 3 holds an empty row (score 0) that is part of the mean but has no token
        assert abs(float((weights * per_sequence).sum())) < 1e-9


def test_rloo_matches_leave_one_out_loop():
    rewards, values = make_inputs()
    scores = scores_of(rewards)
    expected = []
    for i in range(len(scores)):
        others = [scores[j] for j in groups_of(i) if j != i]
        expected.append(scores[i] - sum(others) / len(others) if others else 0.0)  # singleton: 0 (documented)
    advantages, returns = call("rloo", rewards, values)
    torch.testing.assert_close(advantages, broadcast(expected))
    torch.testing.assert_close(returns, advantages)


def test_opo_uses_length_weighted_baseline():
    rewards, values = make_inputs()
    scores = scores_of(rewards)
    lengths = [len(row) for row in valid_positions(MASK)]
    expected = []
    for i in range(len(scores)):
        members = groups_of(i)
        baseline = sum(lengths[j] * scores[j] for j in members) / sum(lengths[j] for j in members)
        expected.append(scores[i] - baseline)
    advantages, _ = call("opo", rewards, values)
    torch.testing.assert_close(advantages, broadcast(expected))
    assert advantages[3].abs().max() < 1e-12  # singleton


def test_gpg_scales_by_fraction_of_nonzero_scores():
    rewards, values = make_inputs()
    scores = scores_of(rewards)
    alpha = len(scores) / max(1, sum(1 for s in scores if s != 0.0))
    assert alpha == pytest.approx(7 / 6)  # the empty row scores exactly 0
    expected = []
    for i in range(len(scores)):
        members = [scores[j] for j in groups_of(i)]
        expected.append(alpha * (scores[i] - sum(members) / len(members)))
    torch.testing.assert_close(call("gpg", rewards, values)[0], broadcast(expected))


def reference_return_to_go(rewards, gamma) -> list[list[float]]:
    result = [[0.0] * MASK.shape[1] for _ in range(MASK.shape[0])]
    for i, row in enumerate(valid_positions(MASK)):
        running = 0.0
        for t in reversed(row):
            running = float(rewards[i, t]) + gamma * running
            result[i][t] = running
    return result


def test_reinforce_plus_plus_discounts_and_whitens():
    rewards, values = make_inputs()
    expected_returns = reference_return_to_go(rewards, 0.9)
    advantages, returns = call("reinforce_plus_plus", rewards, values, gamma=0.9)
    torch.testing.assert_close(returns, torch.tensor(expected_returns, dtype=torch.float64))
    torch.testing.assert_close(advantages, torch.tensor(reference_whiten(expected_returns, MASK), dtype=torch.float64))
    # the hole at (3, 1) is skipped: G(3, 0) = r(3, 0) + 0.9 * G(3, 2)
    assert float(returns[3, 0]) == pytest.approx(float(rewards[3, 0]) + 0.9 * float(returns[3, 2]))


def test_reinforce_plus_plus_baseline_centres_then_whitens():
    rewards, values = make_inputs()
    scores = scores_of(rewards)
    centred = [scores[i] - sum(scores[j] for j in groups_of(i)) / len(groups_of(i)) for i in range(len(scores))]
    matrix = broadcast(centred).tolist()
    expected = torch.tensor(reference_whiten(matrix, MASK), dtype=torch.float64)
    advantages, returns = call("reinforce_plus_plus_baseline", rewards, values)
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, advantages)


def test_remax_subtracts_greedy_baseline_from_reward_to_go():
    rewards, values = make_inputs()
    expected_returns = torch.tensor(reference_return_to_go(rewards, 1.0), dtype=torch.float64)
    advantages, returns = call("remax", rewards, values, gamma=0.5)  # gamma is ignored by remax
    torch.testing.assert_close(returns, expected_returns)
    torch.testing.assert_close(advantages, (expected_returns - BASELINES[:, None]) * MASK)


def test_remax_by_hand():
    """Two prompts' responses with an outcome reward on the last valid token (and a shaping reward on row 1)."""
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.5, 0.0, math.nan]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.float64)
    baselines = torch.tensor([0.25, 1.0], dtype=torch.float64)  # each row's greedy response scored 0.25 and 1.0
    advantages, returns = ADVANTAGE_ESTIMATORS["remax"](rewards, mask, torch.tensor([0, 1]),
                                                        reward_baselines=baselines)
    # reward-to-go: row 0 is 1 everywhere; row 1 is 0.5 + 0 = 0.5 at t=0, then 0
    torch.testing.assert_close(returns, torch.tensor([[1.0, 1.0, 1.0], [0.5, 0.0, 0.0]], dtype=torch.float64))
    torch.testing.assert_close(advantages, torch.tensor([[0.75, 0.75, 0.75], [-0.5, -1.0, 0.0]], dtype=torch.float64))
    with pytest.raises(ValueError, match=r"reward_baselines must be \(B,\) = \(2,\), got \(2, 1\)"):
        ADVANTAGE_ESTIMATORS["remax"](rewards, mask, torch.tensor([0, 1]), reward_baselines=baselines[:, None])


def reference_passk(scores: list[float], norm_adv_by_std: bool) -> list[float]:
    """Pass@k advantages by plain loops: the first row holding its group's maximum gets max - second max."""
    expected = [0.0] * len(scores)
    for group_id in dict.fromkeys(int(g) for g in GROUP_IDS):
        members = [j for j in range(len(scores)) if int(GROUP_IDS[j]) == group_id]
        if len(members) < 2:
            continue
        best = max(members, key=lambda j: (scores[j], -j))
        second = max(scores[j] for j in members if j != best)
        gap = scores[best] - second
        if norm_adv_by_std:
            mean = sum(scores[j] for j in members) / len(members)
            gap /= math.sqrt(sum((scores[j] - mean) ** 2 for j in members) / (len(members) - 1)) + 1e-6
        expected[best] = gap
    return expected


@pytest.mark.parametrize("norm_adv_by_std", [True, False])
def test_grpo_passk_matches_loop(norm_adv_by_std):
    rewards, values = make_inputs()
    scores = scores_of(rewards)
    expected = reference_passk(scores, norm_adv_by_std)
    assert sum(1 for a in expected if a != 0.0) == 2  # groups 7 and 3 push one row each; singleton 11 pushes none
    advantages, returns = call("grpo_passk", rewards, values, norm_adv_by_std_in_grpo=norm_adv_by_std)
    torch.testing.assert_close(advantages, broadcast(expected))
    torch.testing.assert_close(returns, advantages)


def test_grpo_passk_by_hand():
    """Group 5: scores 0, 1, 0.25, 0.5 -> row 1 gets 1 - 0.5; group 9: a tie at the top -> 0 for all; 2 is alone."""
    scores = torch.tensor([0.0, 1.0, 0.25, 0.5, 1.0, 1.0, 0.0, 3.0], dtype=torch.float64)
    mask = torch.tensor([[1, 1]] * 7 + [[1, 0]], dtype=torch.float64)
    rewards = torch.stack([torch.zeros_like(scores), scores], dim=1)  # outcome on the last token...
    rewards[7] = torch.tensor([3.0, math.nan], dtype=torch.float64)  # ...which for row 7 is t = 0
    group_ids = torch.tensor([5, 5, 5, 5, 9, 9, 9, 2])
    unnormalised, _ = ADVANTAGE_ESTIMATORS["grpo_passk"](rewards, mask, group_ids, AdvantageKnobs(norm_adv_by_std_in_grpo=False))
    torch.testing.assert_close(unnormalised[:, 0], torch.tensor([0, 0.5, 0, 0, 0, 0, 0, 0], dtype=torch.float64))
    # group 5: mean 0.4375, squared deviations 0.19140625 + 0.31640625 + 0.03515625 + 0.00390625 = 0.546875
    std = math.sqrt(0.546875 / 3)
    normalised, _ = ADVANTAGE_ESTIMATORS["grpo_passk"](rewards, mask, group_ids, AdvantageKnobs(norm_adv_by_std_in_grpo=True))
    torch.testing.assert_close(normalised, torch.tensor([0, 0.5 / (std + 1e-6), 0, 0, 0, 0, 0, 0],
                                                        dtype=torch.float64)[:, None] * mask)


def test_gae_matches_loop_with_holes():
    rewards, values = make_inputs()
    gamma, lam = 0.9, 0.8
    raw = [[0.0] * MASK.shape[1] for _ in range(MASK.shape[0])]
    expected_returns = [[0.0] * MASK.shape[1] for _ in range(MASK.shape[0])]
    for i, row in enumerate(valid_positions(MASK)):
        next_value, next_advantage = 0.0, 0.0
        for t in reversed(row):
            value = float(values[i, t])
            delta = float(rewards[i, t]) + gamma * next_value - value
            next_advantage = delta + gamma * lam * next_advantage
            next_value = value
            raw[i][t] = next_advantage
            expected_returns[i][t] = next_advantage + value
    advantages, returns = call("gae", rewards, values, gamma=gamma, lam=lam)
    torch.testing.assert_close(returns, torch.tensor(expected_returns, dtype=torch.float64))
    torch.testing.assert_close(advantages, torch.tensor(reference_whiten(raw, MASK), dtype=torch.float64))


def test_gae_with_unit_gamma_lambda_and_zero_values_is_reward_to_go():
    rewards, _ = make_inputs()
    zero_values = fill_padding(torch.zeros_like(rewards), MASK, math.nan)
    _, returns = call("gae", rewards, zero_values, gamma=1.0, lam=1.0)
    torch.testing.assert_close(returns, torch.tensor(reference_return_to_go(rewards, 1.0), dtype=torch.float64))


def test_missing_inputs_raise_clear_errors():
    rewards, values = make_inputs()
    with pytest.raises(ValueError, match="gae.*values"):
        call("gae", rewards, None)
    with pytest.raises(ValueError, match="remax.*reward_baselines"):
        ADVANTAGE_ESTIMATORS["remax"](rewards, MASK, GROUP_IDS, values=values, reward_baselines=None)
    with pytest.raises(ValueError, match="valid names: .*grpo"):
        ADVANTAGE_ESTIMATORS["grpo_typo"]
    with pytest.raises(ValueError, match="group_ids"):
        ADVANTAGE_ESTIMATORS["grpo"](rewards, MASK, GROUP_IDS[:3])


def test_each_estimator_declares_what_it_needs():
    def names(keep):
        return {spec.name for spec in ADVANTAGE_ESTIMATORS.builtin_specs() if keep(spec)}
    assert names(lambda spec: spec.needs_critic) == {"gae"}
    assert names(lambda spec: spec.needs_groups) == {"grpo", "dr_grpo", "rloo", "reinforce_plus_plus_baseline", "opo",
                                                     "gpg", "grpo_passk"}
    assert names(lambda spec: spec.needs_greedy_baseline) == {"remax"}
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'nope'; did you mean 'opo'\? valid names: .*gae"):
        ADVANTAGE_ESTIMATORS.spec("nope")


def test_group_estimators_compare_within_groups_and_the_others_do_not():
    """needs_groups is true to the function: only a group estimator's result changes when the groups do."""
    rewards, values = make_inputs()
    keywords = dict(values=values, reward_baselines=BASELINES)
    for spec in ADVANTAGE_ESTIMATORS.specs():
        grouped, _ = spec.fn(rewards, MASK, GROUP_IDS, **keywords)
        one_group, _ = spec.fn(rewards, MASK, torch.zeros_like(GROUP_IDS), **keywords)
        assert spec.needs_groups == (not torch.allclose(grouped, one_group)), spec.name


def test_all_singletons_are_finite_and_zero():
    rewards, values = make_inputs()
    unique_ids = torch.arange(len(GROUP_IDS))
    for name in (spec.name for spec in ADVANTAGE_ESTIMATORS.specs() if spec.needs_groups):
        advantages, returns = ADVANTAGE_ESTIMATORS[name](rewards, MASK, unique_ids)
        assert torch.isfinite(advantages).all() and torch.isfinite(returns).all()
        assert advantages.abs().max() < 1e-9, name


def test_every_estimator_has_the_same_signature():
    signatures = {name: inspect.signature(fn) for name, fn in ADVANTAGE_ESTIMATORS.items()}
    assert len(set(map(str, signatures.values()))) == 1, signatures


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_padding_never_changes_a_result(name):
    rewards, values = make_inputs()
    keywords = dict(values=values, reward_baselines=BASELINES)
    knobs = AdvantageKnobs(gamma=0.95, lam=0.9, norm_adv_by_std_in_grpo=True)
    advantages, returns = ADVANTAGE_ESTIMATORS[name](rewards, MASK, GROUP_IDS, knobs, **keywords)
    assert torch.isfinite(advantages).all() and torch.isfinite(returns).all()
    assert (advantages[MASK == 0] == 0).all() and (returns[MASK == 0] == 0).all()
    keywords["values"] = append_padding(values, 3, math.nan)
    padded_advantages, padded_returns = ADVANTAGE_ESTIMATORS[name](
        append_padding(rewards, 3, math.inf), append_padding(MASK, 3, 0.0), GROUP_IDS, knobs, **keywords
    )
    torch.testing.assert_close(padded_advantages[:, :5], advantages)
    torch.testing.assert_close(padded_returns[:, :5], returns)
    assert (padded_advantages[:, 5:] == 0).all() and (padded_returns[:, 5:] == 0).all()


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32])
def test_bool_and_float_masks_agree(mask_dtype):
    rewards, values = make_inputs()
    expected, _ = ADVANTAGE_ESTIMATORS["grpo"](rewards, MASK, GROUP_IDS)
    actual, _ = ADVANTAGE_ESTIMATORS["grpo"](rewards, MASK.to(mask_dtype), GROUP_IDS)
    torch.testing.assert_close(actual, expected)


def test_the_knob_record_is_the_algorithm_section_s_by_name_with_the_schema_s_defaults():
    from asyncrl.config import load_config
    from asyncrl.config.schema import AsyncRLConfig
    assert AdvantageKnobs.from_sections(AsyncRLConfig().algorithm) == AdvantageKnobs()
    algorithm = load_config(None, ["algorithm.gamma=0.9", "algorithm.lam=0.8",
                                   "algorithm.norm_adv_by_std_in_grpo=false"]).algorithm
    assert AdvantageKnobs.from_sections(algorithm) == AdvantageKnobs(0.9, 0.8, False)
