r"""The gauge orbit through a point: its tangent vectors, dimension and stabiliser.

For an attention layer with parameters :math:`\theta`, the continuous gauge group acts per
key/value group :math:`g` (:mod:`gaugebook.gauge`). Differentiating each factor at the identity
gives the tangent vectors of the orbit :math:`G \cdot \theta` at :math:`\theta`, one per
Lie-algebra direction (:math:`W_Q^{(h)}` is the slice ``W_Q[h]``):

* QK, :math:`X` in the QK Lie algebra (all of :math:`\mathfrak{gl}(d_\text{head})`; with RoPE the
  commutant of the rotations): :math:`dW_Q^{(h)} = W_Q^{(h)} X`, :math:`db_Q^{(h)} = b_Q^{(h)} X`
  for the query heads :math:`h` of group :math:`g`, :math:`dW_K^{(g)} = -W_K^{(g)} X^\top`,
  :math:`db_K^{(g)} = -b_K^{(g)} X^\top`;
* VO, :math:`Y` in :math:`\mathfrak{gl}(d_\text{value})`: :math:`dW_V^{(g)} = W_V^{(g)} Y`,
  :math:`db_V^{(g)} = b_V^{(g)} Y`, :math:`dW_O^{(h)} = -Y W_O^{(h)}`;
* key-bias translation :math:`e_i`: :math:`db_K^{(g)} = e_i` (coordinates that RoPE leaves
  unrotated only);
* value-bias translation :math:`e_i`: :math:`db_V^{(g)} = e_i`,
  :math:`db_O = -\sum_h e_i W_O^{(h)}`.

The tangent map ``T [n_params, n_lie]`` has these vectors as columns. Its rank is the orbit
dimension; the rest of the Lie algebra, :math:`n_\text{lie} - \rank T`, is the Lie algebra of the
stabiliser (group elements near the identity that fix :math:`\theta`). The action is *free* near
the identity exactly when the stabiliser dimension is 0. Head permutations are discrete and add
no tangent vector. Chapters 4 and 10 of the book use these to compare the orbit with the fibre
(the null space of the Jacobian, :mod:`gaugebook.redundancy`). For a whole GPT the same measures
take the continuous symmetries of :mod:`gaugebook.gpt_gauge` that the GPT's count has terms for
as well (:func:`gaugebook.gpt_redundancy.redundant_directions`).

The *balanced point* of an orbit is where the gradient-flow invariants of
:mod:`gaugebook.mechanics` vanish: :math:`\tilde W_Q^\top \tilde W_Q = \tilde W_K^\top \tilde W_K`
and :math:`\tilde W_V^\top \tilde W_V = W_O W_O^\top` (summed over the query heads of a key/value
group; the tilde appends the biases as extra rows). Weight decay drives training towards it
(chapter 11). For a pair of factors :math:`A \to A M`, :math:`B \to B M^{-\top}` with
:math:`Q_A = A^\top A` and :math:`Q_B = B^\top B` positive definite, balance means
:math:`M^\top Q_A M = M^{-1} Q_B M^{-\top}`. It holds for :math:`M = W^{1/2}`, where :math:`W` is
the unique positive definite solution of :math:`W Q_A W = Q_B` (the matrix geometric mean of
:math:`Q_A^{-1}` and :math:`Q_B`):
:math:`W = Q_A^{-1/2} (Q_A^{1/2} Q_B Q_A^{1/2})^{1/2} Q_A^{-1/2}`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from gaugebook.attention import MultiHeadAttention
from gaugebook.checks import check_finite_tensors
from gaugebook.gauge import (ATTENTION_ALGEBRA, GaugeElement, QKTransform, VOTransform,
                             grouped_weights, qk_algebra)
from gaugebook.gpt import GPT
from gaugebook.gpt_redundancy import LogProbabilities, redundant_directions
from gaugebook.lie import tangent_map
from gaugebook.linalg import ZERO_RTOL, numerical_rank

__all__ = ["orbit_tangents", "OrbitDimension", "orbit_dimension",
           "balancing_element"]


def _check(m) -> None:
    if not isinstance(m, MultiHeadAttention):
        raise TypeError(f"expected a MultiHeadAttention, got {type(m).__name__}")


def orbit_tangents(m: MultiHeadAttention | GPT | LogProbabilities) -> torch.Tensor:
    r"""The tangent map ``T [n_params, n_lie]`` of the continuous gauge action at ``m``'s weights.

    Rows follow ``m.named_parameters()`` (each flattened, row-major), as in
    :func:`gaugebook.redundancy.jacobian` when every parameter is trainable. Columns, for a
    :class:`~gaugebook.attention.MultiHeadAttention`: per key/value group, the QK basis of
    :func:`~gaugebook.gauge.qk_algebra`, :math:`\mathfrak{gl}(d_\text{value})` (:math:`E_{ij}`
    in row-major order), then key- and value-bias translations (with biases). For a
    :class:`~gaugebook.gpt.GPT` or :class:`~gaugebook.gpt_redundancy.LogProbabilities`: the
    directions of every term of :func:`~gaugebook.gpt_redundancy.redundant_directions`, in the
    order of :data:`~gaugebook.gpt_redundancy.TERMS` (not at LayerNorm ``eps = 0``, where the
    residual-stream scaling, which has no term, is exact too). Each family's columns are
    :func:`gaugebook.lie.tangent_map` of its factor. Float64.
    """
    whole_gpt = isinstance(m, (GPT, LogProbabilities))
    if not whole_gpt:
        _check(m)
    check_finite_tensors(m)
    if whole_gpt:
        return torch.cat(list(redundant_directions(m, trainable_only=False).values()), dim=1)
    per_family = [tangent_map(m, family, trainable_only=False).unflatten(1, (m.n_kv_heads, -1))
                  for family in ATTENTION_ALGEBRA]  # (n_params, Hkv, k_family) each
    return torch.cat(per_family, dim=2).flatten(1)


@dataclass(frozen=True)
class OrbitDimension:
    """Result of :func:`orbit_dimension`: ``orbit = lie - stabiliser``."""

    lie: int  #: dimension of the continuous gauge group (its Lie algebra)
    orbit: int  #: rank of the tangent map
    stabiliser: int  #: lie - orbit
    singular_values: torch.Tensor  #: of the tangent map, descending
    tolerance: float  #: the largest singular value counted as zero
    gap: float  #: last kept over first dropped singular value (inf when none is dropped)

    @property
    def free(self) -> bool:
        """True when no one-parameter subgroup fixes the point (trivial stabiliser algebra)."""
        return self.stabiliser == 0


def orbit_dimension(m: MultiHeadAttention | GPT | LogProbabilities, *,
                    rtol: float | None = None) -> OrbitDimension:
    r"""Dimension of the orbit through ``m``'s weights (an attention layer, or a whole GPT with
    the continuous symmetries its count has terms for): the numerical rank of
    :func:`orbit_tangents` (zero when a singular value is at most ``rtol`` times the largest; by
    default ``rtol`` is :math:`\max(m, n)\, \epsilon` for :math:`T` of shape :math:`m \times n`,
    :math:`\epsilon` the float64 machine epsilon, as in :func:`gaugebook.redundancy.redundancy`)."""
    T = orbit_tangents(m)
    s = torch.linalg.svdvals(T)
    rank, tolerance, gap = numerical_rank(s, T.shape, rtol)
    return OrbitDimension(T.shape[1], rank, T.shape[1] - rank, s, tolerance, gap)


def _sym_power(Q: torch.Tensor, power: float) -> torch.Tensor:
    """``Q^power`` for symmetric positive definite ``Q [..., n, n]`` (eigendecomposition)."""
    lam, U = torch.linalg.eigh(Q)
    return U @ torch.diag_embed(lam**power) @ U.mT


def _balancing_matrix(A: torch.Tensor, B: torch.Tensor, what: str) -> torch.Tensor:
    r"""``M [n, k, k]`` with :math:`(AM)^\top AM = (BM^{-\top})^\top BM^{-\top}` for
    ``A [n, a, k]``, ``B [n, b, k]`` of full column rank."""
    QA, QB = A.mT @ A, B.mT @ B  # (n, k, k)
    for name, Q in ((f"{what} (first factor)", QA), (f"{what} (second factor)", QB)):
        lam = torch.linalg.eigvalsh(Q)  # (n, k), ascending
        if (lam[..., 0] <= ZERO_RTOL * lam[..., -1]).any():
            raise ValueError(f"{name} is rank deficient: its orbit has no balanced point")
    root, inv_root = _sym_power(QA, 0.5), _sym_power(QA, -0.5)
    W = inv_root @ _sym_power(root @ QB @ root, 0.5) @ inv_root
    return _sym_power((W + W.mT) / 2, 0.5)


def balancing_element(m: MultiHeadAttention, *, target: str = "") -> GaugeElement:
    r"""The gauge element that moves ``m`` to the balanced point of its orbit, where
    :func:`gaugebook.mechanics.flow_invariants` vanish. Among the points that the QK and VO
    transforms reach (:math:`M, N` in :math:`\GL`) it has the smallest
    :math:`\|\tilde W_Q\|_F^2 + \|\tilde W_K\|_F^2` and :math:`\|\tilde W_V\|_F^2 + \|W_O\|_F^2`
    (the tilde appends the biases as rows; for one head without biases, twice the nuclear norms
    of :math:`W_Q W_K^\top` and :math:`W_V W_O`). With biases it is not the smallest point of the
    whole orbit: the bias translations (:class:`~gaugebook.gauge.KeyBiasShift`,
    :class:`~gaugebook.gauge.ValueBiasShift`), which it does not use, can shrink :math:`b_K` and
    :math:`b_V` further.

    Needs full column rank factors (:math:`d_\text{head}, d_\text{value} \le d_\text{model}`) and
    no RoPE (the RoPE commutant cannot balance a general pair). ``target`` is the path of ``m``
    in the model the element will act on (``"blocks.0.attn"`` in a GPT; ``""``: ``m`` itself).
    """
    _check(m)
    check_finite_tensors(m)
    if m.rope:
        raise ValueError("balancing_element needs a layer without RoPE")
    W = grouped_weights(m)  # augmented and grouped per key/value head
    M = _balancing_matrix(W["Q"], W["K"], "the query/key pair")
    N = _balancing_matrix(W["V"], W["O"].mT, "the value/output pair")
    return GaugeElement([QKTransform(M, target=target), VOTransform(N, target=target)])
