import math

import torch

from gaugebook.linalg import numerical_rank, random_gl

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
