"""Loss aggregation modes: hand-computed numbers, empty sequences, and gradient accumulation with global counts."""

import math

import pytest
import torch

from asyncrl.algos import LOSS_AGG_MODES, aggregate_loss, count_sequences

from .helpers import append_padding, reference_aggregate

NAN = math.nan
# Row 0: 3 tokens summing to 6; row 1: 1 token (4); row 2: empty. Padding holds nan and inf.
LOSS = torch.tensor([[1.0, 2.0, 3.0, NAN], [4.0, NAN, math.inf, NAN], [NAN, NAN, NAN, NAN]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 10 / 4),
        ("seq-mean-token-sum", 10 / 2),  # the empty row is not counted
        ("seq-mean-token-mean", (2 + 4) / 2),
        ("seq-mean-token-sum-norm", 10 / (2 * 4)),  # norm_length defaults to T = 4
    ],
)
def test_modes_with_local_counts(mode, expected):
    assert float(aggregate_loss(LOSS, MASK, mode)) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 10 / 8),
        ("seq-mean-token-sum", 10 / 5),
        ("seq-mean-token-mean", 6 / 5),
        ("seq-mean-token-sum-norm", 10 / (5 * 16)),
    ],
)
def test_modes_with_global_counts(mode, expected):
    actual = aggregate_loss(LOSS, MASK, mode, num_tokens=8, num_seqs=torch.tensor(5.0), norm_length=16)
    assert float(actual) == pytest.approx(expected)


def test_count_sequences_skips_empty_rows():
    assert float(count_sequences(MASK)) == 2.0
    assert float(count_sequences(MASK.float())) == 2.0


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_everything_masked_gives_zero_not_nan(mode):
    loss = aggregate_loss(torch.full((2, 3), NAN), torch.zeros(2, 3), mode)
    assert float(loss) == 0.0


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_matches_loop_on_random_batch(mode):
    generator = torch.Generator().manual_seed(1)
    loss = torch.randn(6, 7, generator=generator, dtype=torch.float64)
    mask = torch.rand(6, 7, generator=generator) > 0.4
    mask[2] = False
    expected = reference_aggregate(loss.tolist(), mask, mode, norm_length=7)
    assert float(aggregate_loss(loss, mask, mode)) == pytest.approx(expected)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_padding_never_changes_the_loss(mode):
    norm_length = 9  # explicit, as a trainer should pass it, so the extra columns do not change T's role
    expected = aggregate_loss(LOSS, MASK, mode, norm_length=norm_length)
    padded = aggregate_loss(append_padding(LOSS, 3, NAN), append_padding(MASK, 3, 0.0), mode, norm_length=norm_length)
    assert torch.isfinite(expected)
    torch.testing.assert_close(padded, expected)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_gradient_accumulation_with_global_counts_equals_whole_batch(mode):
    generator = torch.Generator().manual_seed(2)
    num_rows, max_length, norm_length = 8, 6, 6
    values = torch.randn(num_rows, max_length, generator=generator, dtype=torch.float64)
    mask = torch.rand(num_rows, max_length, generator=generator) > 0.3
    mask[5] = False  # an empty sequence

    whole_input = values.clone().requires_grad_(True)
    whole = aggregate_loss(whole_input.square(), mask, mode, norm_length=norm_length)
    whole.backward()

    accumulated_input = values.clone().requires_grad_(True)
    num_tokens, num_seqs = mask.sum(), count_sequences(mask)
    total = torch.zeros((), dtype=torch.float64)
    for rows in (slice(0, 3), slice(3, 4), slice(4, 8)):
        # each micro-batch is trimmed to its own longest response, as a remove-padding trainer would do
        used_columns = mask[rows].any(dim=0).nonzero()
        width = int(used_columns.max()) + 1 if used_columns.numel() else 1
        micro_loss = aggregate_loss(
            accumulated_input[rows, :width].square(), mask[rows, :width], mode,
            num_tokens=num_tokens, num_seqs=num_seqs, norm_length=norm_length,
        )
        micro_loss.backward()
        total = total + micro_loss.detach()
    torch.testing.assert_close(total, whole.detach())
    torch.testing.assert_close(accumulated_input.grad, whole_input.grad)
    assert whole_input.grad.abs().sum() > 0


def test_local_counts_would_not_accumulate_correctly():
    # the reason for global counts: averaging per micro-batch weights tokens of short micro-batches more
    loss = torch.tensor([[1.0, 1.0, 1.0], [5.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    whole = aggregate_loss(loss, mask, "token-mean")
    local = (aggregate_loss(loss[:1], mask[:1], "token-mean") + aggregate_loss(loss[1:], mask[1:], "token-mean")) / 2
    assert float(whole) == pytest.approx(2.0) and float(local) == pytest.approx(3.0)


def test_errors():
    with pytest.raises(ValueError, match=r"unknown loss aggregation mode 'token_mean'; did you mean 'token-mean'\?"):
        aggregate_loss(LOSS, MASK, "token_mean")
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        aggregate_loss(LOSS[:, :2], MASK, "token-mean")
    with pytest.raises(ValueError, match="norm_length"):
        aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm", norm_length=0)
