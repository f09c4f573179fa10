import math

import pytest
import torch

from gaugebook.attention import MultiHeadAttention
from gaugebook.commutant import commutant, commutator_map
from gaugebook.gauge import GaugeElement, QKTransform, invariance_error
from gaugebook.rope import rope_frequencies, rotation_matrix

F64 = torch.float64


def rotations(frequencies, d_head, T=12):
    freqs = torch.as_tensor(frequencies, dtype=F64)
    return torch.stack([rotation_matrix(float(t), freqs, d_head) for t in range(T)])


def max_commutator(X, matrices):
    """max over basis elements and matrices of |X R - R X|."""
    return (X[:, None] @ matrices[None] - matrices[None] @ X[:, None]).abs().max().item()


def test_commutator_map_matches_matrix_products(generator):
    R = torch.randn(3, 4, 4, generator=generator, dtype=F64)
    X = torch.randn(4, 4, generator=generator, dtype=F64)
    expected = torch.cat([(X @ Ri - Ri @ X).reshape(-1) for Ri in R])
    torch.testing.assert_close(commutator_map(R) @ X.reshape(-1), expected, rtol=0, atol=1e-13)


@pytest.mark.parametrize("d_head", [2, 4, 8])
def test_standard_rope_has_a_complex_scalar_per_plane(d_head):
    R = rotations(rope_frequencies(d_head), d_head)
    c = commutant(R)
    assert c.dimension == d_head  # 2 per plane
    assert max_commutator(c.basis, R) < 1e-13
    gram = torch.einsum("aij,bij->ab", c.basis, c.basis)
    torch.testing.assert_close(gram, torch.eye(c.dimension, dtype=F64), rtol=0, atol=1e-12)
    assert c.gap > 1e8


@pytest.mark.parametrize("frequencies, expected", [
    ([1.0, 1.0, 0.1, 0.01], 2 * 2**2 + 2 + 2),  # two planes share: GL(2, C)
    ([1.0, 1.0, 1.0, 0.1], 2 * 3**2 + 2),
    ([0.3, 0.3, 0.3, 0.3], 2 * 4**2),
    ([1.0, 0.1, 0.01, 0.0], 2 + 2 + 2 + 2**2),  # a zero frequency: full GL(2) on its plane
    ([1.0, 0.0, 0.1, 0.0], 2 + 2 + 4**2),  # two zero frequencies: GL(4) on four coordinates
])
def test_repeated_and_zero_frequencies(frequencies, expected):
    R = rotations(frequencies, 8)
    c = commutant(R)
    assert c.dimension == expected
    assert max_commutator(c.basis, R) < 1e-13


def test_partial_rotary_keeps_gl_on_the_unrotated_block():
    R = rotations(rope_frequencies(4), 8)  # 4 of 8 coordinates rotated
    c = commutant(R)
    assert c.dimension == 4 + 4**2
    # no basis element mixes the rotated and the unrotated coordinates
    assert c.basis[:, :4, 4:].abs().max() < 1e-13 and c.basis[:, 4:, :4].abs().max() < 1e-13


def test_one_generic_matrix_has_a_commutant_of_dimension_d(generator):
    # a matrix with distinct eigenvalues commutes only with polynomials in itself
    A = torch.randn(1, 6, 6, generator=generator, dtype=F64)
    assert commutant(A).dimension == 6


@pytest.mark.parametrize("angle", [math.pi, 2 * math.pi])
def test_a_turn_by_a_multiple_of_pi_commutes_with_everything(angle):
    # R(pi) = -I and R(2 pi) = I up to rounding: the commutator map is round-off, not rank 2
    R = rotation_matrix(1.0, torch.tensor([angle], dtype=F64), 2)[None]
    assert commutant(R).dimension == 4
    assert commutant(-torch.eye(3, dtype=F64)[None]).dimension == 9
    near = torch.eye(2, dtype=F64) + 1e-16 * torch.tensor([[0.0, 1.0], [-1.0, 0.0]], dtype=F64)
    assert commutant(near[None]).dimension == 4


def test_scalar_matrices_commute_with_everything():
    c = commutant([torch.eye(3, dtype=F64), 2.5 * torch.eye(3, dtype=F64)])
    assert c.dimension == 9 and c.gap == float("inf")


def test_gates_and_rotations_leave_one_scaling_per_plane(generator):
    R = rotations(rope_frequencies(6), 6)
    gates = torch.diag_embed(torch.rand(2, 6, generator=generator, dtype=F64) + 0.5)
    assert commutant(torch.cat([R, gates])).dimension == 3


def test_the_commutant_is_an_algebra(generator):
    R = rotations([1.0, 1.0, 0.1, 0.0], 8)
    c = commutant(R)
    a, b = (torch.einsum("k,kij->ij", torch.randn(c.dimension, generator=generator, dtype=F64),
                         c.basis) for _ in range(2))
    assert max_commutator((a @ b)[None], R) < 1e-12
    assert max_commutator(torch.eye(8, dtype=F64)[None], R) == 0


def test_float32_input_is_computed_in_float64():
    R = rotations(rope_frequencies(4), 4).float()
    c = commutant(R)
    assert c.basis.dtype == F64 and c.dimension == 4


def test_commutant_elements_are_symmetries_of_a_rope_layer_with_repeated_frequencies(generator):
    m = MultiHeadAttention(8, 2, 8, rope=True, dtype=F64, generator=generator)
    m.rope_freqs = torch.tensor([1.0, 1.0, 0.1, 0.01], dtype=F64)
    x = torch.randn(3, 10, 8, generator=generator, dtype=F64)
    c = commutant(rotations(m.rope_freqs, 8))
    coefficients = torch.randn(2, c.dimension, generator=generator, dtype=F64)
    M = torch.eye(8, dtype=F64) + 0.3 * torch.einsum("gk,kij->gij", coefficients, c.basis)
    assert invariance_error(GaugeElement([QKTransform(M)]), m, x) < 1e-12
    # a generic matrix does not commute with the rotations and breaks the layer
    generic = torch.eye(8, dtype=F64) + 0.3 * torch.randn(2, 8, 8, generator=generator, dtype=F64)
    assert invariance_error(GaugeElement([QKTransform(generic)]), m, x) > 1e-3


@pytest.mark.parametrize("matrices, message", [
    (torch.zeros(2, 3, 4), "square"),
    (torch.zeros(3, 3), "square"),
    (torch.zeros(0, 3, 3), "at least one"),
    ([], "at least one"),
    (torch.full((1, 2, 2), float("nan")), "non-finite"),
])
def test_invalid_input_is_rejected(matrices, message):
    with pytest.raises(ValueError, match=message):
        commutant(matrices)
