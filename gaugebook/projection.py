r"""Estimating redundancy from random directions in parameter space (source section 12.2).

The source's method: draw :math:`k` random directions :math:`v_1, \dots, v_k`, measure how much
the output changes along each, and read off the redundant dimension.
:func:`zero_change_estimate` does this literally: the first-order change along :math:`v` is
:math:`J v` (:math:`J` the Jacobian of the outputs with respect to the :math:`P` parameters), and
the estimate is :math:`P` times the fraction of directions with :math:`J v = 0`. The null space of
:math:`J` is a proper subspace, of measure zero, so a random direction lies in it with probability
zero: the estimate is 0 whatever the redundancy.

What random directions *can* do is sketch the Jacobian: :math:`Y = J \Omega` for a Gaussian
:math:`\Omega \in \R^{P \times k}` has :math:`\rank Y = \min(k, \rank J)` with probability one
(the range finder of randomized SVD, Halko, Martinsson and Tropp 2011). :func:`sketched_rank`
computes :math:`Y` with :math:`k` forward-mode products. :math:`\rank Y` is always a lower bound
on :math:`\rank J` (so :math:`P - \rank Y` an upper bound on the redundancy); once
:math:`\rank Y < k` the sketch has saturated and the two are equal. Because the redundancy is a
small fraction of :math:`P`, saturation needs :math:`k > \rank J`, nearly :math:`P` products: no
cheaper than the exact Jacobian for counting, but any budget :math:`k` certifies
:math:`\rank J \ge \rank Y`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.func import jvp, vmap

from gaugebook.attention import math_attention
from gaugebook.checks import check_number, check_positive_ints
from gaugebook.linalg import numerical_rank
from gaugebook.redundancy import parameter_function

__all__ = ["ZeroChangeEstimate", "SketchedRank", "directional_changes", "zero_change_estimate",
           "sketched_rank", "sketch"]


@dataclass(frozen=True)
class ZeroChangeEstimate:
    r"""Result of :func:`zero_change_estimate`: ``estimate`` :math:`= P\, n_\text{zero} / k` for
    ``n_params`` :math:`P`, ``n_zero`` and ``n_directions`` :math:`k`."""

    n_params: int
    n_directions: int
    changes: torch.Tensor  #: [k] ``|J v_i|`` for unit directions v_i
    threshold: float
    n_zero: int
    estimate: float


@dataclass(frozen=True)
class SketchedRank:
    r"""Result of :func:`sketched_rank` for the sketch :math:`Y = J \Omega` with ``n_columns``
    columns."""

    n_params: int
    n_columns: int
    rank: int
    singular_values: torch.Tensor  #: of Y, descending
    tolerance: float
    gap: float

    @property
    def saturated(self) -> bool:
        r""":math:`\rank Y < k`: then :math:`\rank Y = \rank J` (with probability one over
        :math:`\Omega`)."""
        return self.rank < self.n_columns

    @property
    def redundancy_bound(self) -> int:
        r""":math:`P - \rank Y`: at least the redundancy, equal to it when :attr:`saturated`."""
        return self.n_params - self.rank


def _unit_directions(n_params: int, k: int, generator) -> torch.Tensor:
    v = torch.randn(k, n_params, generator=generator, dtype=torch.float64)
    return v / v.norm(dim=1, keepdim=True)  # (k, P)


def sketch(model: nn.Module, *inputs, directions: torch.Tensor, chunk: int = 128) -> torch.Tensor:
    r""":math:`J V^\top` ``[n_outputs, k]`` for ``directions`` :math:`V` ``[k, n_params]``: one
    forward-mode product (``torch.func.jvp``) per direction, batched ``chunk`` at a time, in
    float64, on the model's device."""
    return _sketch(*parameter_function(model, *inputs), directions, chunk)


def _sketch(output, theta: torch.Tensor, directions: torch.Tensor,
            chunk: int = 128) -> torch.Tensor:
    """:func:`sketch` of the function ``output`` of the flat parameters at ``theta``."""
    if directions.ndim != 2 or directions.shape[1] != theta.numel():
        raise ValueError(f"directions must have shape [k, n_params={theta.numel()}], "
                         f"got {tuple(directions.shape)}")
    check_positive_ints(chunk=chunk)

    def along(v):  # J v
        return jvp(output, (theta,), (v,))[1]

    columns = []
    with math_attention():
        for block in directions.to(theta.device, torch.float64).split(chunk):  # (drawn on CPU)
            columns.append(vmap(along)(block))  # (chunk, n_outputs)
    return torch.cat(columns).T


def directional_changes(model: nn.Module, *inputs, directions: torch.Tensor) -> torch.Tensor:
    r""":math:`\lVert J v_i \rVert / \lVert v_i \rVert` for each row :math:`v_i` of ``directions
    [k, n_params]``: the first-order output change per unit step along :math:`v_i`."""
    return _changes(*parameter_function(model, *inputs), directions)


def _changes(output, theta: torch.Tensor, directions: torch.Tensor) -> torch.Tensor:
    Y = _sketch(output, theta, directions)  # (n_outputs, k)
    return Y.norm(dim=0) / directions.to(Y).norm(dim=1)


def zero_change_estimate(model: nn.Module, *inputs, n_directions: int, rtol: float = 1e-8,
                         generator: torch.Generator | None = None) -> ZeroChangeEstimate:
    r"""The source's random-projection estimate, read literally.

    Draws ``n_directions`` Gaussian unit directions, measures :math:`\lVert J v_i \rVert` and
    counts as "redundant" those with :math:`\lVert J v_i \rVert \le` ``rtol``
    :math:`\cdot \max_j \lVert J v_j \rVert`; the estimate of the redundant dimension is that
    fraction of ``n_params``. (The source's step "apply a gauge transformation
    to each direction" has no definite meaning for a random direction and is not done.)
    """
    check_positive_ints(n_directions=n_directions)
    check_number("rtol", rtol, low=0.0, strict=True)
    output, theta = parameter_function(model, *inputs)
    V = _unit_directions(theta.numel(), n_directions, generator)
    changes = _changes(output, theta, V)
    threshold = rtol * changes.max().item()
    n_zero = int((changes <= threshold).sum())
    return ZeroChangeEstimate(theta.numel(), n_directions, changes, threshold, n_zero,
                              theta.numel() * n_zero / n_directions)


def sketched_rank(model: nn.Module, *inputs, n_columns: int, rtol: float | None = None,
                  generator: torch.Generator | None = None, chunk: int = 128) -> SketchedRank:
    r"""Numerical rank of :math:`Y = J \Omega` for a Gaussian :math:`\Omega` ``[n_params,
    n_columns]``.

    Tolerance as in :func:`gaugebook.redundancy.redundancy`: singular values of :math:`Y` at most
    ``rtol`` :math:`\cdot s_{\max}`, with ``rtol`` :math:`= \max(m, k)\, \epsilon` for
    :math:`Y` of shape :math:`m \times k` and :math:`\epsilon` the float64 machine epsilon,
    count as zero; ``gap`` is the ratio of the last kept to the first dropped singular value
    (infinite when none is dropped).
    """
    check_positive_ints(n_columns=n_columns)
    output, theta = parameter_function(model, *inputs)
    omega = torch.randn(n_columns, theta.numel(), generator=generator, dtype=torch.float64)
    Y = _sketch(output, theta, omega, chunk)  # (n_outputs, k)
    s = torch.linalg.svdvals(Y)
    rank, tol, gap = numerical_rank(s, Y.shape, rtol)
    return SketchedRank(theta.numel(), n_columns, rank, s, tol, gap)
