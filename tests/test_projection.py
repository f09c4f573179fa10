"""Random-projection estimates of redundancy: the literal method finds nothing, the sketch finds the
rank once it has more columns than the rank."""
import pytest
import torch

from gaugebook.attention import MultiHeadAttention
from gaugebook.projection import (directional_changes, sketch, sketched_rank,
                                  zero_change_estimate)
from gaugebook.redundancy import jacobian, predicted_redundancy, redundancy


@pytest.fixture
def layer_and_input(generator):
    m = MultiHeadAttention(6, 2, 3, bias=True, dtype=torch.float64, generator=generator)
    x = torch.randn(8, 10, 6, generator=generator, dtype=torch.float64)
    return m, x


def test_sketch_is_jacobian_times_directions(layer_and_input, generator):
    m, x = layer_and_input
    J = jacobian(m, x)
    V = torch.randn(7, J.shape[1], generator=generator, dtype=torch.float64)
    assert torch.allclose(sketch(m, x, directions=V, chunk=3), J @ V.T, rtol=1e-12, atol=1e-12)
    assert torch.allclose(directional_changes(m, x, directions=V),
                          (J @ V.T).norm(dim=0) / V.norm(dim=1), rtol=1e-12)


def test_literal_random_directions_see_no_redundancy(layer_and_input, generator):
    m, x = layer_and_input
    assert predicted_redundancy(m) > 0
    est = zero_change_estimate(m, x, n_directions=50, generator=generator)
    assert est.n_zero == 0 and est.estimate == 0.0
    assert est.changes.min() > 1e-3 * est.changes.max()  # not even close to zero


def test_sketched_rank_saturates_at_the_jacobian_rank(layer_and_input, generator):
    m, x = layer_and_input
    r = redundancy(m, x)
    below = sketched_rank(m, x, n_columns=r.rank - 5, generator=generator)
    assert below.rank == r.rank - 5 and not below.saturated
    assert below.redundancy_bound > r.dimension  # only an upper bound
    above = sketched_rank(m, x, n_columns=r.rank + 5, generator=generator)
    assert above.saturated and above.rank == r.rank and above.redundancy_bound == r.dimension
    assert above.gap > 1e8


def test_bad_arguments(layer_and_input):
    m, x = layer_and_input
    with pytest.raises(ValueError, match="n_columns"):
        sketched_rank(m, x, n_columns=0)
    with pytest.raises(ValueError, match="n_directions"):
        zero_change_estimate(m, x, n_directions=0)
    with pytest.raises(ValueError, match=r"shape \[k, n_params="):
        sketch(m, x, directions=torch.zeros(3, 5))
