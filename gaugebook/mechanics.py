r"""Noether charges of the attention gauge and the invariants of gradient flow.

**Hamiltonian dynamics** ``H(theta, p) = |p|^2 / 2 + L(theta)``. ``L`` is invariant under all of
GL(d_head) x GL(d_value) per head, but the kinetic energy only under the orthogonal subgroup
(``p`` transforms like ``theta``). For an antisymmetric generator ``A`` the infinitesimal action
``delta W_Q = W_Q A``, ``delta W_K = W_K A`` (``= -W_K A^T``) has the conserved momentum map
``<p, delta theta> = <J, A> / 2`` with the *charge*

.. math::  J_{QK} = W_Q^T P_Q - P_Q^T W_Q + W_K^T P_K - P_K^T W_K \quad (d_k \times d_k),

and for ``delta W_V = W_V B``, ``delta W_O = -B W_O``

.. math::  J_{VO} = W_V^T P_V - P_V^T W_V - (P_O W_O^T - W_O P_O^T) \quad (d_v \times d_v).

Both are conserved exactly by leapfrog and by symplectic Euler (each kick moves ``p`` along
``grad L``, orthogonal to the orbit; each drift adds ``J(p, p) = 0``); explicit Euler changes them
by ``-h^2 J(p, grad L)`` per step.

**Gradient flow** ``dtheta/dt = -grad L`` conserves, for the whole GL group,

.. math::  C_{QK} = W_Q^T W_Q - W_K^T W_K, \qquad C_{VO} = W_V^T W_V - W_O W_O^T,

because invariance gives ``W_Q^T G_Q = G_K^T W_K`` and ``W_V^T G_V = G_O W_O^T`` at every
point; a gradient-descent step of size ``lr`` changes them by ``O(lr^2)``.

Conventions: learned biases that transform with the weights enter in augmented form,
``W~_Q = [W_Q; b_Q]`` (``[D + 1, d_k]``), likewise ``b_K`` and ``b_V``. Under GQA the query heads
of a key/value group share one group element, so their terms add up into one charge per group.
With RoPE only the commutant of the rotations survives (per plane ``a I + b J``); the model-level
functions then return the orthogonal projection onto that subalgebra. The model-level functions
derive both from the gauge action itself (:func:`gaugebook.lie.momentum_map`: the momentum
dotted with every generator); the closed forms below are for factor matrices on their own.
Unlearned symmetry-breaking biases are not part of the state: with a fixed query bias ``b`` only ``P J P`` with
``P = I - b^T b / |b|^2`` is conserved (the stabiliser of ``b``).
A learned ``b_Q`` next to a fixed shift ``s`` absorbs it: the symmetry survives with the row
``b_Q + s`` in place of ``b_Q``.

**ECD.** Its unit-speed velocity ``v`` drifts as ``theta += dt v`` (adding ``J(v, v) = 0``) and
is kicked as ``v -> normalise(v - k g_perp)`` with ``g_perp = g - (g.v) v``; since ``g`` is
orthogonal to every orbit this multiplies ``J(theta, v)`` by one common scalar
``(1 + k g.v) / |v - k g_perp|`` for all heads, layers and generators (with the global projection
and no chaos term). Ratios of charges are therefore conserved; in the continuum
``J(theta, v) (F - F_0)^{-(eta/2) d/(d-1)}`` is.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from gaugebook.attention import MultiHeadAttention
from gaugebook.gauge import QKTransform, VOTransform, attention_modules, qk_algebra
from gaugebook.lie import float64_parameters, momentum_map, project
from gaugebook.linalg import DTYPE

__all__ = ["antisym", "qk_charge", "vo_charge", "qk_flow_invariant", "vo_flow_invariant",
           "Sectors", "charges", "flow_invariants", "largest_norms"]


def _T(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(-1, -2)


def antisym(X: torch.Tensor) -> torch.Tensor:
    """``X - X^T`` over the last two dimensions."""
    return X - _T(X)


def qk_charge(W_Q, W_K, P_Q, P_K) -> torch.Tensor:
    """``J_QK = antisym(W_Q^T P_Q + W_K^T P_K)`` for ``W_Q, P_Q [..., D, dk]``, ``W_K, P_K
    [..., D, dk]`` (augmented rows for biases allowed): the momentum map of O(dk) acting as
    ``W_Q -> W_Q R``, ``W_K -> W_K R``."""
    return antisym(_T(W_Q) @ P_Q + _T(W_K) @ P_K)


def vo_charge(W_V, W_O, P_V, P_O) -> torch.Tensor:
    """``J_VO = antisym(W_V^T P_V - P_O W_O^T)`` for ``W_V, P_V [..., D, dv]``, ``W_O, P_O
    [..., dv, D]``: the momentum map of O(dv) acting as ``W_V -> W_V R``, ``W_O -> R^T W_O``."""
    return antisym(_T(W_V) @ P_V - P_O @ _T(W_O))


def qk_flow_invariant(W_Q, W_K) -> torch.Tensor:
    """``W_Q^T W_Q - W_K^T W_K``: conserved by gradient flow for the GL(dk) symmetry."""
    return _T(W_Q) @ W_Q - _T(W_K) @ W_K


def vo_flow_invariant(W_V, W_O) -> torch.Tensor:
    """``W_V^T W_V - W_O W_O^T``: conserved by gradient flow for the GL(dv) symmetry."""
    return _T(W_V) @ W_V - W_O @ _T(W_O)


@dataclass(frozen=True)
class Sectors:
    """Per key/value group matrices of one attention layer: ``qk [n_kv, dk, dk]``,
    ``vo [n_kv, dv, dv]`` (float64)."""

    qk: torch.Tensor
    vo: torch.Tensor

    @property
    def qk_norm(self) -> torch.Tensor:
        """Frobenius norm per group ``[n_kv]``."""
        return torch.linalg.matrix_norm(self.qk)

    @property
    def vo_norm(self) -> torch.Tensor:
        """The Frobenius norm of each VO charge matrix."""
        return torch.linalg.matrix_norm(self.vo)


def _as_named(model: nn.Module, tensors) -> dict[str, torch.Tensor]:
    """``tensors`` (a mapping keyed by parameter name, or a sequence aligned with
    ``model.parameters()``) as a dict keyed by parameter name, shapes checked."""
    named = dict(model.named_parameters())
    if isinstance(tensors, Mapping):
        out = {n: t for n, t in tensors.items() if n in named}
    elif isinstance(tensors, Sequence) and not torch.is_tensor(tensors):
        if len(tensors) != len(named):
            raise ValueError(f"got {len(tensors)} tensors for {len(named)} parameters")
        out = dict(zip(named, tensors))
    else:
        raise TypeError("momenta must be a mapping from parameter names to tensors or a "
                        f"sequence aligned with model.parameters(), got {type(tensors).__name__}")
    wrong = [f"{n}: {tuple(t.shape)} vs {tuple(named[n].shape)}" for n, t in out.items()
             if t.shape != named[n].shape]
    if wrong:
        raise ValueError("momentum shapes differ from their parameters: " + "; ".join(wrong))
    return out


def _sector(model: nn.Module, path: str, m: MultiHeadAttention, momenta: dict) -> Sectors:
    """Both momentum maps of layer ``path`` (``momenta`` keyed relative to it), the QK one as
    the dual of the layer's QK algebra (the projection onto the RoPE commutant)."""
    qk = momentum_map(model, QKTransform, momenta, path, (m.n_kv_heads, m.d_head, m.d_head))
    vo = momentum_map(model, VOTransform, momenta, path, (m.n_kv_heads, m.d_value, m.d_value))
    return Sectors(project(qk, qk_algebra(m)) if m.rope else qk, vo)


def charges(model: nn.Module, momenta) -> dict[str, Sectors]:
    """Noether charges ``J_QK``, ``J_VO`` per key/value group of every attention layer.

    ``momenta``: tensors shaped like the parameters (momenta, or an optimizer's velocities),
    as a mapping keyed by ``model.named_parameters()`` names or a sequence aligned with
    ``model.parameters()``. Returns ``{layer path: Sectors}`` (path ``""`` for a bare
    :class:`~gaugebook.attention.MultiHeadAttention`).

    Computed as the momentum dotted with every generator (:func:`gaugebook.lie.momentum_map`
    of :class:`~gaugebook.gauge.QKTransform` and :class:`~gaugebook.gauge.VOTransform`), of
    which the charge of the orthogonal subgroup is the antisymmetric part: ``J = mu - mu^T``,
    the closed forms :func:`qk_charge` and :func:`vo_charge` on the augmented weights.
    """
    p = _as_named(model, momenta)
    result = {}
    for path, m in attention_modules(model):
        prefix = f"{path}." if path else ""
        names = ["W_Q", "W_K", "W_V", "W_O"] + (["b_Q", "b_K", "b_V"] if m.has_bias else [])
        absent = [prefix + n for n in names if prefix + n not in p]
        if absent:
            raise ValueError(f"no momentum given for {absent}")
        local = {n: p[prefix + n].detach().to(DTYPE) for n in names}
        mu = _sector(model, path, m, local)
        result[path] = Sectors(antisym(mu.qk), antisym(mu.vo))
    return result


def largest_norms(by_layer: Mapping[str, Sectors]) -> tuple[float, float]:
    """The largest Frobenius norms ``(max |QK|, max |VO|)`` over every layer and key/value group
    of what :func:`charges` or :func:`flow_invariants` returns: how far from zero a charge is,
    or how unbalanced the worst head is, in one pair of numbers."""
    if not by_layer:
        raise ValueError("no attention layers: by_layer is empty")
    return (max(s.qk_norm.max().item() for s in by_layer.values()),
            max(s.vo_norm.max().item() for s in by_layer.values()))


def flow_invariants(model: nn.Module) -> dict[str, Sectors]:
    """Gradient-flow invariants ``C_QK = sum_h W~_Q[h]^T W~_Q[h] - W~_K^T W~_K`` and
    ``C_VO = W~_V^T W~_V - sum_h W_O[h] W_O[h]^T`` per key/value group of every attention layer
    (sums over the query heads of the group): the momentum maps at ``p = theta``."""
    return {path: _sector(model, path, m, float64_parameters(m))
            for path, m in attention_modules(model)}
