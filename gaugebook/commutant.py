r"""The commutant of a set of matrices: all :math:`X` with :math:`X R = R X` for every :math:`R`
in the set.

With rotary position embeddings a QK transformation :math:`M` must commute with every position
rotation :math:`R_t` (chapter 5), so the QK gauge group of a RoPE head is the group of invertible
elements of the commutant of :math:`\{R_t\}`. The commutant is a linear space (indeed an algebra:
it contains :math:`I` and is closed under products), and its invertible elements are an open
subset of it, so the group and the space have the same dimension.

We compute it as the null space of the linear map
:math:`X \mapsto (X R_1 - R_1 X, \dots, X R_n - R_n X)`. With row-major vectorisation,
:math:`\operatorname{vec}(X R) = (I \otimes R^\top) \operatorname{vec}(X)` and
:math:`\operatorname{vec}(R X) = (R \otimes I) \operatorname{vec}(X)`, so the map's matrix is the
stack of :math:`I \otimes R_i^\top - R_i \otimes I`, of shape ``[n d^2, d^2]``; its null space
comes from the SVD. A singular value counts as zero when it is at most
:math:`\mathrm{rtol} \cdot \max(s_{\max}, 2 \max_i \|R_i\|_2)` with
``rtol = max(shape) * eps_float64`` (as in :mod:`gaugebook.redundancy`; :func:`commutant` says
why the second scale).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from gaugebook.linalg import DTYPE, numerical_rank

__all__ = ["Commutant", "commutant", "commutator_map"]


@dataclass(frozen=True)
class Commutant:
    """Result of :func:`commutant`."""

    basis: torch.Tensor  #: [dimension, d, d], orthonormal for <X, Y> = tr(X^T Y)
    singular_values: torch.Tensor  #: of the commutator map, descending, float64
    tolerance: float
    gap: float  #: last kept over first dropped singular value; inf when nothing is dropped

    @property
    def dimension(self) -> int:
        """The commutant's dimension, the number of basis elements."""
        return self.basis.shape[0]

    @property
    def freedom(self) -> torch.Tensor:
        r"""How free each entry is, ``[d, d]``: :math:`\sum_k (B_k)_{ij}^2` over the orthonormal
        basis :math:`B_k`, the squared length of the unit matrix :math:`E_{ij}` projected onto the
        commutant: 1 for an entry that varies alone, :math:`1/2` for one tied to another (the
        :math:`a I + b J` of a rotation plane), 0 for an entry that must vanish. The entries sum
        to the dimension."""
        return (self.basis ** 2).sum(0)

    def __str__(self) -> str:
        d = self.basis.shape[-1]
        return (f"commutant of dimension {self.dimension} in gl({d}) (dimension {d * d}), "
                f"spectral gap {self.gap:.2g}")


def _as_stack(matrices) -> torch.Tensor:
    """Validate ``matrices`` (a tensor ``[n, d, d]`` or a sequence of ``[d, d]``); float64."""
    if not torch.is_tensor(matrices):
        matrices = list(matrices)
        if not matrices:
            raise ValueError("the commutant needs at least one matrix")
        matrices = torch.stack([torch.as_tensor(R) for R in matrices])
    matrices = matrices.detach().to(DTYPE)
    if matrices.ndim != 3 or matrices.shape[-1] != matrices.shape[-2]:
        raise ValueError(f"expected square matrices [n, d, d], got shape {tuple(matrices.shape)}")
    if matrices.shape[0] == 0:
        raise ValueError("the commutant needs at least one matrix")
    if not torch.isfinite(matrices).all():
        raise ValueError("the matrices have non-finite entries")
    return matrices


def commutator_map(matrices) -> torch.Tensor:
    r"""The matrix ``[n d^2, d^2]`` of
    :math:`\operatorname{vec}(X) \mapsto (\operatorname{vec}(X R_i - R_i X))_i` (row-major
    :math:`\operatorname{vec}`)."""
    R = _as_stack(matrices)  # (n, d, d)
    n, d = R.shape[0], R.shape[-1]
    eye = torch.eye(d, dtype=DTYPE)
    # entry [(i, j), (k, l)] of I kron R^T is eye[i, k] R[l, j]; of R kron I it is R[i, k] eye[j, l]
    A = torch.einsum("ik,nlj->nijkl", eye, R) - torch.einsum("nik,jl->nijkl", R, eye)
    return A.reshape(n * d * d, d * d)


def commutant(matrices, *, rtol: float | None = None) -> Commutant:
    r"""Basis of :math:`\{X \in \R^{d \times d} : X R = R X \text{ for all } R\}`, :math:`R` over
    ``matrices`` (SVD null space).

    Examples: one rotation plane turning by an angle that is not a multiple of :math:`\pi` has
    the commutant :math:`\{a I + b J\}` (dimension 2, the complex numbers); the identity, and
    :math:`-I` (a turn by :math:`\pi`), have all of :math:`\mathfrak{gl}(d)`. The rank tolerance
    is relative to :math:`2 \max_i \|R_i\|_2`, the size of the commutator map unless it vanishes,
    so that a map that is round-off (:math:`R` equal to :math:`\pm I` up to rounding) has rank 0.
    """
    R = _as_stack(matrices)
    A = commutator_map(R)
    d = math.isqrt(A.shape[1])
    _, s, Vh = torch.linalg.svd(A, full_matrices=False)  # s (d^2,), Vh (d^2, d^2): n d^2 >= d^2
    scale = 2 * torch.linalg.matrix_norm(R, ord=2).max().item()
    rank, tol, gap = numerical_rank(s, A.shape, rtol, scale=scale)
    basis = Vh[rank:].reshape(-1, d, d)  # rows of Vh are orthonormal
    return Commutant(basis, s, tol, gap)
