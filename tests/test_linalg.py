import math

import numpy as np
import pytest
import scipy.linalg
import torch

from conftest import public_names_are_exported
from gaugebook.linalg import (loglog_slope, numerical_rank, principal_cosines, random_gl,
                              relative_change, remove_components)

F64 = torch.float64


def test_numerical_rank_counts_and_reports_the_gap():
    rank, tolerance, gap = numerical_rank(torch.tensor([2.0, 1.0, 1e-20], dtype=F64), (3, 3))
    assert rank == 2 and tolerance == 2.0 * 3 * torch.finfo(F64).eps
    assert math.isclose(gap, 1e20)
    assert numerical_rank(torch.tensor([2.0, 1.0], dtype=F64), (2, 2))[2] == math.inf


def test_numerical_rank_of_empty_and_zero_matrices_is_zero():
    assert numerical_rank(torch.zeros(0, dtype=F64), (0, 3)) == (0, 0.0, math.inf)
    assert numerical_rank(torch.zeros(3, dtype=F64), (3, 3)) == (0, 0.0, math.inf)


def test_one_by_one_elements_take_both_signs():
    g = torch.Generator().manual_seed(0)
    signs = {random_gl(1, 1.0, generator=g).sign().item() for _ in range(20)}
    assert signs == {-1.0, 1.0}


def test_principal_cosines_match_scipy_and_ignore_the_basis():
    g = torch.Generator().manual_seed(1)
    A, B = torch.randn(9, 3, generator=g, dtype=F64), torch.randn(9, 4, generator=g, dtype=F64)
    cos = principal_cosines(A, B)
    expected = np.cos(scipy.linalg.subspace_angles(A.numpy(), B.numpy()))
    assert cos.shape == (3,) and (cos[:-1] >= cos[1:]).all()  # descending
    assert np.allclose(cos.numpy(), np.sort(expected)[::-1], atol=1e-12)
    # another (rank-deficient) spanning set of the same span: all cosines 1
    same = torch.cat([A @ random_gl(3, 10.0, generator=g), A[:, :1]], dim=1)
    assert torch.allclose(principal_cosines(A, same), torch.ones(3, dtype=F64), atol=1e-12)


def test_principal_cosines_of_a_known_angle_and_of_orthogonal_spans():
    t = 0.3
    e = torch.eye(3, dtype=F64)
    line = (math.cos(t) * e[:, 0] + math.sin(t) * e[:, 1])[:, None]
    assert math.isclose(principal_cosines(e[:, :1], line).item(), math.cos(t), rel_tol=1e-14)
    assert principal_cosines(e[:, :2], e[:, 2:]).abs().max() < 1e-15
    with pytest.raises(ValueError, match="same number of rows"):
        principal_cosines(e, torch.ones(4, 1, dtype=F64))


def test_remove_components_leaves_the_orthogonal_part():
    g = torch.Generator().manual_seed(2)
    basis = torch.randn(8, 3, generator=g, dtype=F64)  # not orthonormal
    V = torch.randn(8, 5, generator=g, dtype=F64)
    R = remove_components(V, basis)
    assert (basis.T @ R).abs().max() < 1e-13 * V.norm()  # orthogonal to the span
    assert torch.allclose(remove_components(R, basis), R, atol=1e-14)  # a projection
    assert remove_components(basis @ torch.randn(3, 2, generator=g, dtype=F64),
                             basis).abs().max() < 1e-13  # the span itself is removed
    assert torch.allclose(remove_components(V[:, 0], basis), R[:, 0], atol=1e-14)  # a vector
    assert torch.equal(remove_components(V, torch.zeros(8, 0, dtype=F64)), V)
    with pytest.raises(ValueError, match="rows"):
        remove_components(V, torch.ones(7, 1, dtype=F64))


def test_loglog_slope_recovers_power_laws_column_by_column():
    x = torch.logspace(-8, -2, 7, dtype=F64)
    assert math.isclose(loglog_slope(x, 3.0 * x), 1.0, rel_tol=1e-12)
    both = torch.stack([x**2, 5.0 * x**2], 1)  # (7, 2): the mean of the columns' slopes
    assert math.isclose(loglog_slope(x, both), 2.0, rel_tol=1e-12)
    with pytest.raises(ValueError):
        loglog_slope(x, x[:3])
    for bad in (torch.zeros_like(x), -x, x * float("nan")):  # no log: a clear error
        with pytest.raises(ValueError, match="positive, finite y"):
            loglog_slope(x, bad)
    with pytest.raises(ValueError, match="positive, finite x"):
        loglog_slope(-x, x)


def test_numerical_rank_scale_judges_a_map_of_round_off():
    s = torch.tensor([2e-16, 1e-16], dtype=F64)  # all round-off of a map of size 2
    assert numerical_rank(s, (4, 2))[0] == 2  # relative to its own s_max: "full rank"
    assert numerical_rank(s, (4, 2), scale=2.0)[0] == 0


def test_relative_change_and_spread_refuse_what_would_mislead():
    with pytest.raises(ValueError, match="one shape"):
        relative_change(torch.ones(2, 3), torch.ones(3))  # would broadcast to a number
    for n in (0, -1, 2.0):
        with pytest.raises(ValueError, match="positive integer"):
            random_gl(n, 2.0)


@pytest.mark.parametrize("cond", [0.5, float("nan"), float("inf")])
def test_a_condition_number_must_be_finite_and_at_least_one(cond):
    with pytest.raises(ValueError, match="condition number cond must be finite and >= 1"):
        random_gl(3, cond)


def test_all_lists_the_public_names():
    from gaugebook import linalg
    public_names_are_exported(linalg)
    assert {"DTYPE", "ZERO_RTOL"} <= set(linalg.__all__)
