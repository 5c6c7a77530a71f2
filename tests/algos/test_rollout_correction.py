"""Rollout correction: IS weights per level, truncation, normalisation, rejection masks, metrics, bypass helper."""

import math

import pytest
import torch

from asyncrl.algos import compute_bypass_correction, compute_rollout_correction

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
    assert set(metrics) == {"rollout_corr/kl", "rollout_corr/k3_kl", "rollout_corr/log_ppl_diff"}
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
@pytest.mark.parametrize("rs_level", [None, "token", "sequence", "geometric"])
def test_padding_never_changes_a_result(is_level, rs_level):
    old_log_probs, rollout_log_probs = inputs_with_garbage()
    keywords = dict(is_level=is_level, is_threshold=1.5, is_batch_normalize=True, rs_level=rs_level,
                    rs_threshold=2.0, rs_threshold_lower=0.6)
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
    with pytest.raises(ValueError, match="rs_level: unknown rollout-correction level 'seq_mean_k1'.* valid names: token"):
        compute_rollout_correction(OLD_LOG_PROBS, ROLLOUT_LOG_PROBS, MASK, rs_level="seq_mean_k1")
    with pytest.raises(ValueError, match="rs_threshold"):
        compute_rollout_correction(OLD_LOG_PROBS, ROLLOUT_LOG_PROBS, MASK, rs_level="token")
    with pytest.raises(ValueError, match="rs_threshold_lower < rs_threshold"):
        compute_rollout_correction(OLD_LOG_PROBS, ROLLOUT_LOG_PROBS, MASK, rs_level="token", rs_threshold=1.0,
                                   rs_threshold_lower=2.0)
    with pytest.raises(ValueError, match="is_threshold"):
        compute_rollout_correction(OLD_LOG_PROBS, ROLLOUT_LOG_PROBS, MASK, is_level="token", is_threshold=0.0)
