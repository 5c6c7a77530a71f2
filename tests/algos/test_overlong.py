"""DAPO's overlong penalty against hand computations: budget 10, buffer 4, so the penalty starts after 6 tokens."""

import pytest
import torch

from asyncrl.algos import overlong_penalty


def test_penalty_is_zero_within_the_budget_then_linear_to_the_factor():
    lengths = torch.tensor([0, 3, 6, 7, 8, 10])
    penalties = overlong_penalty(lengths, max_response_length=10, buffer_length=4, penalty_factor=1.0)
    # 7 tokens: 1 past 10 - 4 = 6, so -1/4; 8: -2/4; 10: the whole buffer, -1.
    assert penalties.tolist() == [0.0, 0.0, 0.0, -0.25, -0.5, -1.0]
    assert penalties.dtype == torch.float32
    assert not torch.signbit(penalties[:3]).any()  # +0.0, not -0.0, within the budget


def test_factor_scales_and_a_buffer_as_long_as_the_budget_penalises_from_the_first_token():
    lengths = torch.tensor([1, 5, 10])
    half = overlong_penalty(lengths, max_response_length=10, buffer_length=4, penalty_factor=0.5)
    assert half.tolist() == [0.0, 0.0, -0.5]
    whole = overlong_penalty(lengths, max_response_length=10, buffer_length=10, penalty_factor=2.0)
    assert whole.tolist() == pytest.approx([-0.2, -1.0, -2.0])


def test_reference_formula_min_of_negative_exceed_and_zero():
    """The reference system's expression, min(-(L - (M - b)) / b * f, 0), for every length up to the budget."""
    lengths = torch.arange(0, 33)
    penalties = overlong_penalty(lengths, max_response_length=32, buffer_length=12, penalty_factor=1.5)
    expected = [min(-(length - (32 - 12)) / 12 * 1.5, 0.0) for length in range(33)]
    assert penalties.tolist() == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("kwargs, message", [
    (dict(buffer_length=0), r"buffer_length must be within 1 \.\. max_response_length \(10\), got 0"),
    (dict(buffer_length=11), r"buffer_length must be within 1 \.\. max_response_length \(10\), got 11"),
    (dict(penalty_factor=-1.0), r"penalty_factor must be >= 0, got -1\.0"),
])
def test_bad_settings_are_named(kwargs, message):
    settings = dict(max_response_length=10, buffer_length=4, penalty_factor=1.0) | kwargs
    with pytest.raises(ValueError, match=message):
        overlong_penalty(torch.tensor([3]), **settings)


def test_lengths_must_be_one_per_row():
    with pytest.raises(ValueError, match=r"response_lengths must be \(B,\), got \(2, 1\)"):
        overlong_penalty(torch.tensor([[3], [4]]), max_response_length=10, buffer_length=4, penalty_factor=1.0)
