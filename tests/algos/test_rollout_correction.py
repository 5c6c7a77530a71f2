"""Rollout correction: IS weights per level, truncation, normalisation, rejection masks, metrics, bypass helper."""

import math

import pytest
import torch

from asyncrl.algos import CORRECTION_LEVELS, REJECTION_LEVELS, compute_bypass_correction, compute_rollout_correction

from .helpers import append_padding, fill_padding, valid_positions

MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.float32)
# log pi_old - log pi_rollout per valid token
LOG_RATIOS = torch.tensor(
    [[0.1, -0.2, 0.3, 0], [1.0, 0.5, 0, 0], [-0.05, 0.02, 0.01, -0.9], [0, 0, 0, 0]], dtype=torch.float64
)
ROLLOUT_LOG_PROBS = torch.tensor(
    [[-1.0, -0.5, -2.0, 0], [-0.3, -1.2, 0, 0], [-0.7, -0.1, -3.0, -0.4], [0, 0, 0, 0]], dtype=torch.float64
)
OLD_LOG_PROBS = ROLLOUT_LOG_PROBS + LOG_RATIOS


def inputs_with_garbage():
    return fill_padding(OLD_LOG_PROBS, MASK, math.nan), fill_padding(ROLLOUT_LOG_PROBS, MASK, -math.inf)


def unit_log_ratios(level: str) -> list[float]:
    """One log-ratio per unit: every valid token (token) or every non-empty sequence."""
    rows = valid_positions(MASK)
    if level == "token":
        return [float(LOG_RATIOS[i, t]) for i, row in enumerate(rows) for t in row]
    sums = [sum(float(LOG_RATIOS[i, t]) for t in row) for i, row in enumerate(rows) if row]
    if level == "sequence":
        return sums
    return [s / len(row) for s, row in zip(sums, [row for row in rows if row])]


def expected_weight_matrix(level: str, threshold: float | None, normalize: bool) -> torch.Tensor:
    units = [math.exp(x) for x in unit_log_ratios(level)]
    truncated = [min(w, threshold) if threshold is not None else w for w in units]
    mean = sum(truncated) / len(truncated)
    final = [w / mean for w in truncated] if normalize else truncated
    matrix = torch.zeros(MASK.shape, dtype=torch.float64)
    rows, position = valid_positions(MASK), 0
    for i, row in enumerate(rows):
        for t in row:
            matrix[i, t] = final[position]
            position += level == "token"
        position += level != "token" and bool(row)
    return matrix, final, units


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("threshold", [1.2, None])
def test_importance_weights_and_metrics(level, normalize, threshold):
    old_log_probs, rollout_log_probs = inputs_with_garbage()
    weights, new_mask, metrics = compute_rollout_correction(
        old_log_probs, rollout_log_probs, MASK, is_level=level, is_threshold=threshold, is_batch_normalize=normalize
    )
    expected, final, raw = expected_weight_matrix(level, threshold, normalize)
    torch.testing.assert_close(weights, expected)
    assert weights.requires_grad is False and new_mask is MASK
    assert metrics["rollout_corr/is_mean"] == pytest.approx(sum(final) / len(final))
    assert metrics["rollout_corr/is_max"] == pytest.approx(max(final))
    assert metrics["rollout_corr/is_min"] == pytest.approx(min(final))
    mean = sum(final) / len(final)
    ess = 1.0 / (sum((w / mean) ** 2 for w in final) / len(final))
    assert metrics["rollout_corr/is_eff_sample_size"] == pytest.approx(ess)
    if threshold is not None:
        truncated = sum(1 for w in raw if w > threshold) / len(raw)
        assert truncated > 0 and metrics["rollout_corr/is_fraction_truncated"] == pytest.approx(truncated)
    else:
        assert "rollout_corr/is_fraction_truncated" not in metrics


def test_no_levels_gives_diagnostics_only():
    old_log_probs, rollout_log_probs = inputs_with_garbage()
    weights, new_mask, metrics = compute_rollout_correction(old_log_probs, rollout_log_probs, MASK)
    assert weights is None and new_mask is MASK
    tokens = unit_log_ratios("token")
    assert metrics["rollout_corr/kl"] == pytest.approx(-sum(tokens) / len(tokens))
    assert metrics["rollout_corr/k3_kl"] == pytest.approx(sum(math.exp(x) - 1 - x for x in tokens) / len(tokens))
    geometric = unit_log_ratios("geometric")
    assert metrics["rollout_corr/log_ppl_diff"] == pytest.approx(-sum(geometric) / len(geometric))
    assert metrics["rollout_corr/abs_log_ratio_mean"] == pytest.approx(sum(abs(x) for x in tokens) / len(tokens))
    assert metrics["rollout_corr/abs_log_ratio_max"] == pytest.approx(max(abs(x) for x in tokens))
    above = sum(1 for x in tokens if abs(x) > 1e-2) / len(tokens)
    assert 0 < above and metrics["rollout_corr/frac_abs_log_ratio_above_1e-2"] == pytest.approx(above)
    assert set(metrics) == {"rollout_corr/kl", "rollout_corr/k3_kl", "rollout_corr/log_ppl_diff",
                            "rollout_corr/abs_log_ratio_mean", "rollout_corr/abs_log_ratio_max",
                            "rollout_corr/frac_abs_log_ratio_above_1e-2"}
    assert all(math.isfinite(value) for value in metrics.values())


def test_token_rejection_with_default_lower_bound():
    old_log_probs, rollout_log_probs = inputs_with_garbage()
    # upper 1.5 -> log 0.405; lower defaults to 1 / 1.5 -> log -0.405
    _, new_mask, metrics = compute_rollout_correction(old_log_probs, rollout_log_probs, MASK,
                                                      rs_level="token", rs_threshold=1.5)
    expected = MASK.clone()
    expected[1, 0] = expected[1, 1] = 0  # 1.0 and 0.5 exceed log 1.5
    expected[2, 3] = 0  # -0.9 is below log(1 / 1.5)
    torch.testing.assert_close(new_mask, expected)
    assert new_mask.dtype == MASK.dtype
    assert metrics["rollout_corr/rs_fraction_rejected"] == pytest.approx(3 / 9)
    assert metrics["rollout_corr/rs_seq_fraction_rejected"] == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    ("level", "upper", "lower", "rejected_rows"),
    [
        # sums of log-ratios: 0.2, 1.5, -0.92 -> ratios 1.22, 4.48, 0.40
        ("sequence", 1.3, 0.5, [1, 2]),
        ("sequence", 5.0, 0.3, []),
        # means of log-ratios: 0.067, 0.75, -0.23 -> ratios 1.07, 2.12, 0.79
        ("geometric", 1.5, 0.7, [1]),
    ],
)
def test_sequence_rejection_masks_whole_sequences(level, upper, lower, rejected_rows):
    old_log_probs, rollout_log_probs = inputs_with_garbage()
    _, new_mask, metrics = compute_rollout_correction(old_log_probs, rollout_log_probs, MASK.bool(), rs_level=level,
                                                      rs_threshold=upper, rs_threshold_lower=lower)
    expected = MASK.bool().clone()
    expected[rejected_rows] = False
    assert new_mask.dtype == torch.bool and torch.equal(new_mask, expected)
    assert metrics["rollout_corr/rs_seq_fraction_rejected"] == pytest.approx(len(rejected_rows) / 3)
    rejected_tokens = sum(int(MASK[i].sum()) for i in rejected_rows)
    assert metrics["rollout_corr/rs_fraction_rejected"] == pytest.approx(rejected_tokens / 9)


def k2(x: float) -> float:
    return 0.5 * x * x


def k3(x: float) -> float:
    return math.exp(x) - 1.0 - x


def sequence_statistic(level: str) -> list[float]:
    """A plain loop over the valid tokens of each non-empty row: sum, mean or max of k2 or k3."""
    estimate = k2 if level.endswith("k2") else k3
    reduce = {"seq_sum": sum, "seq_mean": lambda xs: sum(xs) / len(xs), "seq_max": max}[level[:-3]]
    return [reduce([estimate(float(LOG_RATIOS[i, t])) for t in row]) for i, row in enumerate(valid_positions(MASK))
            if row]


@pytest.mark.parametrize(
    ("level", "upper", "rejected_rows"),
    [
        # k2 per token: row 0 .005 .02 .045; row 1 .5 .125; row 2 .00125 .0002 .00005 .405
        ("seq_sum_k2", 0.5, [1]),  # sums .07, .625, .40645
        ("seq_mean_k2", 0.1, [1, 2]),  # means .0233, .3125, .1016
        ("seq_max_k2", 0.45, [1]),  # maxima .045, .5, .405
        # k3 per token: row 0 .00517 .01873 .04986; row 1 .71828 .14872; row 2 .00123 .00020 .00005 .30657
        ("seq_sum_k3", 0.3, [1, 2]),  # sums .0738, .8670, .3080
        ("seq_mean_k3", 0.1, [1]),  # means .0246, .4335, .0770
        ("seq_mean_k3", 0.01, [0, 1, 2]),  # the reference system's k3 presets' bound
        ("seq_max_k3", 0.05, [1, 2]),  # maxima .0499, .7183, .3066
    ],
)
def test_kl_rejection_masks_whole_sequences(level, upper, rejected_rows):
    statistics = sequence_statistic(level)
    assert [i for i, value in enumerate(statistics) if value > upper] == rejected_rows  # the hand numbers above
    old_log_probs, rollout_log_probs = inputs_with_garbage()
    _, new_mask, metrics = compute_rollout_correction(old_log_probs, rollout_log_probs, MASK, rs_level=level,
                                                      rs_threshold=upper)
    expected = MASK.clone()
    expected[rejected_rows] = 0
    torch.testing.assert_close(new_mask, expected)
    assert metrics["rollout_corr/rs_seq_fraction_rejected"] == pytest.approx(len(rejected_rows) / 3)
    rejected_tokens = sum(int(MASK[i].sum()) for i in rejected_rows)
    assert metrics["rollout_corr/rs_fraction_rejected"] == pytest.approx(rejected_tokens / 9)


@pytest.mark.parametrize(("level", "upper", "rejected"), [
    ("token_k2", 0.04, [(0, 2), (1, 0), (1, 1), (2, 3)]),  # .045, .5, .125, .405 exceed 0.04
    ("token_k3", 0.1, [(1, 0), (1, 1), (2, 3)]),  # .718, .149, .307 exceed 0.1; row 0's largest is .0499
])
def test_kl_rejection_of_single_tokens(level, upper, rejected):
    estimate = k2 if level == "token_k2" else k3
    assert [(i, t) for i, row in enumerate(valid_positions(MASK)) for t in row
            if estimate(float(LOG_RATIOS[i, t])) > upper] == rejected
    old_log_probs, rollout_log_probs = inputs_with_garbage()
    _, new_mask, metrics = compute_rollout_correction(old_log_probs, rollout_log_probs, MASK.bool(), rs_level=level,
                                                      rs_threshold=upper)
    expected = MASK.bool().clone()
    for i, t in rejected:
        expected[i, t] = False
    assert new_mask.dtype == torch.bool and torch.equal(new_mask, expected)
    assert metrics["rollout_corr/rs_fraction_rejected"] == pytest.approx(len(rejected) / 9)
    assert metrics["rollout_corr/rs_seq_fraction_rejected"] == pytest.approx(len({i for i, _ in rejected}) / 3)


def test_kl_levels_reject_only_and_by_an_upper_bound():
    divergences = {spec.name for spec in REJECTION_LEVELS.builtin_specs() if spec.is_divergence}
    assert divergences == {f"{reduce}_{estimate}" for reduce in ("token", "seq_sum", "seq_mean", "seq_max")
                           for estimate in ("k2", "k3")}
    # every ratio level rejects too, by the very function that weighs
    ratio_levels = {spec.name: spec.fn for spec in REJECTION_LEVELS.builtin_specs() if not spec.is_divergence}
    assert ratio_levels == dict(CORRECTION_LEVELS) and list(CORRECTION_LEVELS) == ["token", "sequence", "geometric"]
    with pytest.raises(ValueError, match=r"is_level='seq_mean_k3' is a KL estimate.*use one of token, sequence, "
                                         r"geometric"):
        compute_rollout_correction(OLD_LOG_PROBS, ROLLOUT_LOG_PROBS, MASK, is_level="seq_mean_k3")
    with pytest.raises(ValueError, match="needs rs_threshold and no rs_threshold_lower, got 0.1 and 0.01"):
        compute_rollout_correction(OLD_LOG_PROBS, ROLLOUT_LOG_PROBS, MASK, rs_level="seq_mean_k3", rs_threshold=0.1,
                                   rs_threshold_lower=0.01)
    with pytest.raises(ValueError, match="needs rs_threshold and no rs_threshold_lower, got None and None"):
        compute_rollout_correction(OLD_LOG_PROBS, ROLLOUT_LOG_PROBS, MASK, rs_level="token_k2")
    with pytest.raises(ValueError, match="positive rs_threshold, got 0.0"):
        compute_rollout_correction(OLD_LOG_PROBS, ROLLOUT_LOG_PROBS, MASK, rs_level="token_k2", rs_threshold=0.0)


def test_kl_estimates_of_extreme_log_ratios_stay_finite():
    """A log-ratio past +-20 (a token the engine found nearly impossible) is clamped, as for the weights: its
    sequence is rejected by any sane bound, and nothing turns into nan or inf."""
    log_ratios = torch.tensor([[300.0, 0.0], [-300.0, 0.0]], dtype=torch.float64)
    for level in ("seq_max_k2", "seq_max_k3", "seq_mean_k3"):
        statistic, _ = REJECTION_LEVELS[level](log_ratios, torch.ones(2, 2, dtype=torch.bool))
        assert torch.isfinite(statistic).all()
        _, new_mask, _ = compute_rollout_correction(log_ratios, torch.zeros(2, 2, dtype=torch.float64),
                                                    torch.ones(2, 2), rs_level=level, rs_threshold=1.0)
        assert new_mask.sum() == 0  # k2 = 200 and k3 >= 19 at |l| = 20


def test_bypass_helper_uses_current_policy_and_detaches():
    log_probs = OLD_LOG_PROBS.clone().requires_grad_(True)
    weights, new_mask, metrics = compute_bypass_correction(log_probs, ROLLOUT_LOG_PROBS, MASK, is_level="token",
                                                           is_threshold=2.0, rs_level="token", rs_threshold=2.0)
    expected_weights, expected_mask, expected_metrics = compute_rollout_correction(
        OLD_LOG_PROBS, ROLLOUT_LOG_PROBS, MASK, is_level="token", is_threshold=2.0, rs_level="token", rs_threshold=2.0
    )
    assert not weights.requires_grad
    torch.testing.assert_close(weights, expected_weights)
    torch.testing.assert_close(new_mask, expected_mask)
    assert metrics == expected_metrics


@pytest.mark.parametrize("is_level", [None, "token", "sequence", "geometric"])
@pytest.mark.parametrize("rs_level", [None, *REJECTION_LEVELS])
def test_padding_never_changes_a_result(is_level, rs_level):
    old_log_probs, rollout_log_probs = inputs_with_garbage()
    is_divergence = rs_level is not None and REJECTION_LEVELS.spec(rs_level).is_divergence
    keywords = dict(is_level=is_level, is_threshold=1.5, is_batch_normalize=True, rs_level=rs_level,
                    rs_threshold=0.1 if is_divergence else 2.0, rs_threshold_lower=None if is_divergence else 0.6)
    weights, new_mask, metrics = compute_rollout_correction(old_log_probs, rollout_log_probs, MASK, **keywords)
    padded_weights, padded_mask, padded_metrics = compute_rollout_correction(
        append_padding(old_log_probs, 3, math.nan), append_padding(rollout_log_probs, 3, math.inf),
        append_padding(MASK, 3, 0.0), **keywords,
    )
    assert padded_metrics == pytest.approx(metrics)
    assert all(math.isfinite(value) for value in metrics.values())
    torch.testing.assert_close(padded_mask[:, :4], new_mask)
    assert (padded_mask[:, 4:] == 0).all()
    if is_level is None:
        assert padded_weights is None and weights is None
    else:
        torch.testing.assert_close(padded_weights[:, :4], weights)
        assert (padded_weights[:, 4:] == 0).all() and (weights[MASK == 0] == 0).all()


def test_invalid_options_raise():
    with pytest.raises(ValueError, match=r"is_level: unknown rollout-correction level 'seq'; did you mean 'sequence'\?"):
        compute_rollout_correction(OLD_LOG_PROBS, ROLLOUT_LOG_PROBS, MASK, is_level="seq")
    with pytest.raises(ValueError, match="rs_level: unknown rollout rejection level 'seq_mean_k1'.* valid names: token"):
        compute_rollout_correction(OLD_LOG_PROBS, ROLLOUT_LOG_PROBS, MASK, rs_level="seq_mean_k1")
    with pytest.raises(ValueError, match="rs_threshold"):
        compute_rollout_correction(OLD_LOG_PROBS, ROLLOUT_LOG_PROBS, MASK, rs_level="token")
    with pytest.raises(ValueError, match="rs_threshold_lower < rs_threshold"):
        compute_rollout_correction(OLD_LOG_PROBS, ROLLOUT_LOG_PROBS, MASK, rs_level="token", rs_threshold=1.0,
                                   rs_threshold_lower=2.0)
    with pytest.raises(ValueError, match="is_threshold"):
        compute_rollout_correction(OLD_LOG_PROBS, ROLLOUT_LOG_PROBS, MASK, is_level="token", is_threshold=0.0)
