"""The reference's bound for half-type sums: legitimate rounding passes, a wrong sum does not."""

from __future__ import annotations

import pytest
import torch

from benchmarks.reference import assert_matches, assert_sum_within_rounding

# Six ranks' bfloat16 inputs whose partial sums reach 5, where bfloat16's step is 1/32, and cancel.
INPUTS = [torch.tensor([value, 0.5], dtype=torch.bfloat16) for value in (5.0, 0.047, 0.047, 0.047, -5.0, 0.0)]


def summed_in_order(inputs: list[torch.Tensor]) -> torch.Tensor:
    """Rounded to bfloat16 after each addition, as a reduction over ranks does."""
    total = inputs[0].clone()
    for tensor in inputs[1:]:
        total = total + tensor
    return total


def test_a_sum_rounded_as_a_reduction_rounds_passes_where_the_fixed_tolerance_fails() -> None:
    actual = summed_in_order(INPUTS)
    exact = torch.stack([tensor.double() for tensor in INPUTS]).sum(0).to(torch.bfloat16)
    with pytest.raises(AssertionError):
        assert_matches(actual, exact)  # off by 0.046 where 0.0457 is allowed
    assert_sum_within_rounding(actual, INPUTS)


def test_a_sum_missing_a_rank_still_fails() -> None:
    with pytest.raises(AssertionError, match="2 of 2 elements off"):
        assert_sum_within_rounding(summed_in_order(INPUTS[1:]), INPUTS)
