"""Random matrices with a prescribed condition number, checks of group elements (invertible
matrices, permutations), numerical rank, the relative change of a tensor, and the comparison of
subspaces (principal angles, orthogonal complements)."""
from __future__ import annotations

import math

import torch

from gaugebook.checks import check_integer_dtype, check_number, check_positive_ints

__all__ = ["DTYPE", "ZERO_RTOL", "relative_change", "random_orthogonal", "spread", "random_gl",
           "numerical_rank", "principal_cosines", "loglog_slope", "remove_components",
           "check_invertible", "check_permutation"]

DTYPE = torch.float64
ZERO_RTOL = 1e-12
"""A float64 quantity below ``ZERO_RTOL`` times its scale counts as zero where no rank
tolerance (:func:`numerical_rank`) applies: about ``10^4 eps``, the round-off of a few thousand
operations, and far above it for the book's sizes."""


def relative_change(new: torch.Tensor, old: torch.Tensor) -> float:
    """``max |new - old| / max |old|`` over all entries: how much a tensor (an output, a score
    matrix) changed, relative to its own size. For a layer, pass its outputs:
    ``relative_change(m_new(X), m(X))``. An all-zero ``old`` has no size to compare with
    (ValueError), and so do tensors of different shapes (which would broadcast)."""
    if new.shape != old.shape:
        raise ValueError(f"relative_change compares tensors of one shape, got "
                         f"{tuple(new.shape)} and {tuple(old.shape)}")
    with torch.no_grad():
        scale = old.abs().max()
        if scale == 0:
            raise ValueError("the reference tensor is all zero, so a change relative to it is "
                             "undefined: compare on inputs where it is non-zero")
        return ((new - old).abs().max() / scale).item()


def random_orthogonal(n: int, *, generator: torch.Generator | None = None) -> torch.Tensor:
    """A Haar-random matrix of O(n): QR of a Gaussian matrix with the signs of R's diagonal fixed."""
    q, r = torch.linalg.qr(torch.randn(n, n, generator=generator, dtype=DTYPE))
    return q * torch.sign(torch.diagonal(r))[None, :]


def spread(n: int, cond: float, *, generator: torch.Generator | None = None) -> torch.Tensor:
    r"""``n`` positive numbers in :math:`[\kappa^{-1/2}, \kappa^{1/2}]` (:math:`\kappa` is
    ``cond``), log-uniform, in random order, whose largest/smallest ratio is exactly ``cond``
    (for ``n >= 2``; a single number is 1)."""
    cond = check_number("the condition number cond", cond, low=1.0, strict=False)
    check_positive_ints(n=n)
    if n == 1:
        return torch.ones(1, dtype=DTYPE)
    u = torch.rand(n, generator=generator, dtype=DTYPE)
    u[:2] = torch.tensor([0.0, 1.0], dtype=DTYPE)
    u = u[torch.randperm(n, generator=generator)]
    return torch.tensor(cond, dtype=DTYPE) ** (u - 0.5)


def random_gl(n: int, cond: float, *, generator: torch.Generator | None = None) -> torch.Tensor:
    r""":math:`U \operatorname{diag}(s) V^\top` with Haar-random orthogonal :math:`U, V` and
    singular values :math:`s` from :func:`spread`: an element of :math:`\mathrm{GL}(n)` with
    2-norm condition number exactly ``cond`` (1 when ``n == 1``)."""
    s = spread(n, cond, generator=generator)
    return random_orthogonal(n, generator=generator) @ torch.diag(s) @ \
        random_orthogonal(n, generator=generator).T


def numerical_rank(s: torch.Tensor, shape, rtol: float | None = None, *,
                   scale: float = 0.0) -> tuple[int, float, float]:
    """``(rank, tolerance, gap)`` of a matrix of ``shape`` from its singular values ``s``
    (descending).

    A singular value counts as zero when it is at most ``tolerance = rtol * max(s_max, scale)``,
    by default ``rtol = max(shape) * eps_float64`` (the convention of ``numpy.linalg.matrix_rank``).
    ``scale`` is the size the matrix has when it is not zero, for a matrix built from others that
    may cancel to round-off (a commutator with ``-I``): its ``s_max`` is then round-off itself and
    no measure of what is small. ``gap = s_rank / s_{rank+1}``, the last kept over the first
    dropped value, is infinite when nothing is kept or nothing dropped. An empty or all-zero
    ``s`` has rank 0.
    """
    if rtol is not None:
        rtol = check_number("rtol", rtol, low=0.0, strict=False)
    else:
        rtol = max(shape) * torch.finfo(DTYPE).eps
    if s.numel() == 0 or s[0] == 0:
        return 0, 0.0, math.inf
    tolerance = rtol * max(s[0].item(), scale)
    rank = int((s > tolerance).sum())
    gap = (s[rank - 1] / s[rank]).item() if 0 < rank < len(s) else math.inf
    return rank, tolerance, gap


def _orthonormal_columns(A: torch.Tensor) -> torch.Tensor:
    """``[n, rank]``: an orthonormal basis of the column span of ``A [n, p]`` (left singular
    vectors above :func:`numerical_rank`'s tolerance, so rank-deficient ``A`` is fine)."""
    A = torch.as_tensor(A).to(DTYPE)
    if A.ndim != 2:
        raise ValueError(f"expected a matrix [n, p] of column vectors, got shape {tuple(A.shape)}")
    if A.shape[1] == 0:
        return A
    U, s, _ = torch.linalg.svd(A, full_matrices=False)
    return U[:, :numerical_rank(s, A.shape)[0]]


def principal_cosines(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """Cosines of the principal angles between the column spans of ``A [n, p]`` and
    ``B [n, q]``, descending: ``sigma(U^T V)`` for orthonormal bases ``U``, ``V`` of the spans
    (chapter 2's definition), ``min(rank A, rank B)`` of them, float64. All are 1 exactly when
    the smaller span lies in the larger."""
    U, V = _orthonormal_columns(A), _orthonormal_columns(B)
    if U.shape[0] != V.shape[0]:
        raise ValueError(f"A and B must have the same number of rows, got {U.shape[0]} and "
                         f"{V.shape[0]}")
    return torch.linalg.svdvals(U.T @ V).clamp(max=1.0)


def loglog_slope(x: torch.Tensor, y: torch.Tensor) -> float:
    r"""Least-squares slope of ``log10 y`` against ``log10 x`` for ``x [n]`` and ``y [n]`` or
    ``[n, k]`` (positive), averaged over the ``k`` columns: the exponent ``p`` of a power law
    :math:`y \propto x^p` (chapter 10 fits how singular values vanish near a special point)."""
    x, y = torch.as_tensor(x).to(DTYPE), torch.as_tensor(y).to(DTYPE)
    if y.ndim == 1:
        y = y[:, None]  # (n, 1)
    if y.shape[0] != x.shape[0] or x.ndim != 1:
        raise ValueError(f"x must be [n] and y [n] or [n, k], got {tuple(x.shape)} and "
                         f"{tuple(y.shape)}")
    for name, v in (("x", x), ("y", y)):
        if not (torch.isfinite(v).all() and (v > 0).all()):
            raise ValueError(f"a log-log slope needs positive, finite {name}, got "
                             f"{v.flatten()[:8].tolist()}{'...' if v.numel() > 8 else ''}")
    design = torch.stack([torch.ones_like(x), x.log10()], 1)  # (n, 2)
    return torch.linalg.lstsq(design, y.log10()).solution[1].mean().item()


def remove_components(V: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """``V [n]`` or ``[n, k]`` minus its orthogonal projection onto the column span of
    ``basis [n, m]`` (any basis, not necessarily orthonormal): ``V - Q Q^T V`` with ``Q`` an
    orthonormal basis of the span. Float64."""
    Q = _orthonormal_columns(basis)
    V = torch.as_tensor(V).to(DTYPE)
    if V.shape[0] != Q.shape[0]:
        raise ValueError(f"V has {V.shape[0]} rows, basis {Q.shape[0]}")
    return V - Q @ (Q.T @ V)


def check_invertible(matrices: torch.Tensor, name: str) -> torch.Tensor:
    """Validate a stack ``[n, d, d]`` of invertible matrices; return it as float64.

    Raises ``ValueError`` for a wrong shape, a non-finite entry, or a matrix whose condition
    number exceeds ``1/eps`` (numerically singular).
    """
    matrices = torch.as_tensor(matrices).detach().to(DTYPE)
    if matrices.ndim != 3 or matrices.shape[-1] != matrices.shape[-2]:
        raise ValueError(f"{name} must be a stack of square matrices [n_groups, d, d], "
                         f"got shape {tuple(matrices.shape)}")
    if not torch.isfinite(matrices).all():
        raise ValueError(f"{name} has non-finite entries")
    cond = torch.linalg.cond(matrices)
    limit = 1 / torch.finfo(DTYPE).eps
    bad = torch.nonzero(~(cond < limit)).flatten().tolist()
    if bad:
        c = cond[bad[0]].item()  # NaN where LAPACK divides by a zero singular value
        raise ValueError(f"{name}[{bad[0]}] is singular (condition number "
                         f"{c if c == c else math.inf:.3g} >= 1/eps = {limit:.3g})")
    return matrices


def check_permutation(perm, n: int | None = None, name: str = "perm") -> torch.Tensor:
    """Validate a permutation of ``0..n-1`` (``n = len(perm)`` when ``None``); return it as a
    ``long`` tensor on the CPU, wherever ``perm`` lives (the check compares with a CPU
    ``arange``; actions move it to their module's device)."""
    given = torch.as_tensor(perm).detach()
    check_integer_dtype(name, given, "indices", f" ({given.tolist()}): a float would be truncated")
    perm = given.to(torch.long).cpu()
    n = perm.numel() if n is None else n
    if perm.shape != (n,) or not torch.equal(perm.sort().values, torch.arange(n)):
        raise ValueError(f"{name} must be a permutation of 0..{n - 1}, got {perm.tolist()}")
    return perm
