"""The tolerance helpers fail where they must and say by how much (CONTRIBUTING.md, "Numeric tolerances")."""

from __future__ import annotations

import pytest
import torch

from tests.tolerances import (
    GRAD_RTOL,
    OUTPUT_ATOL,
    assert_close,
    assert_grads_close,
    assert_identical,
    grad_atol,
)


def test_assert_close_passes_fp32_rounding_and_reports_a_real_difference():
    want = torch.zeros(2, 3)
    assert_close(want + OUTPUT_ATOL / 2, want)  # a few ulps of a unit-scale output
    got = want.clone()
    got[1, 2] = 2e-5
    with pytest.raises(AssertionError, match=r"^hidden: max abs diff 2e-05 > 1e-05 at \(1, 2\)"):
        assert_close(got, want, what="hidden")


def test_assert_close_fails_on_nan_and_on_a_shape_mismatch():
    with pytest.raises(AssertionError, match="max abs diff nan"):
        assert_close(torch.tensor([float("nan")]), torch.tensor([0.0]))
    with pytest.raises(AssertionError, match=r"shapes differ: \(3,\) vs \(1, 3\)"):
        assert_close(torch.zeros(3), torch.zeros(1, 3))  # no broadcasting hides a missing dimension


def test_gradient_bound_scales_with_the_reference_magnitude():
    assert grad_atol(torch.tensor([0.01])) == GRAD_RTOL  # small values: never below the output bound
    assert grad_atol(torch.tensor([-300.0, 2.0])) == pytest.approx(300 * GRAD_RTOL)
    assert_grads_close(torch.tensor(-11.1166), torch.tensor(-11.1166) + 1.9e-6)  # a loss summed over a batch
    with pytest.raises(AssertionError, match="loss: max abs diff"):
        assert_grads_close(torch.tensor(-11.1166), torch.tensor(-11.1176), what="loss")


def test_assert_identical_is_bit_equality():
    assert_identical(torch.ones(2), torch.ones(2))
    with pytest.raises(AssertionError, match=r"reload: not identical \(max abs diff 1.19e-07\)"):
        assert_identical(torch.ones(2), torch.ones(2) + torch.finfo(torch.float32).eps, what="reload")
