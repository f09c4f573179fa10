r"""Noether charges of the attention gauge and the invariants of gradient flow.

**Hamiltonian dynamics** :math:`H(\theta, p) = \|p\|^2 / 2 + \mathcal L(\theta)`. The loss
:math:`\mathcal L` is invariant under all of :math:`\GL(d_\text{head}) \times \GL(d_\text{value})`
per head, but the kinetic energy only under the orthogonal subgroup (:math:`p` transforms like
:math:`\theta`). For an antisymmetric generator :math:`A` the infinitesimal action
:math:`\delta W_Q = W_Q A`, :math:`\delta W_K = W_K A` (:math:`= -W_K A^\top`) has the conserved
momentum map :math:`\langle p, \delta\theta \rangle = \langle J, A \rangle / 2` with the *charge*

.. math::

    J_{QK} = W_Q^\top P_Q - P_Q^\top W_Q + W_K^\top P_K - P_K^\top W_K \quad (d_k \times d_k),

and for :math:`\delta W_V = W_V B`, :math:`\delta W_O = -B W_O`

.. math::

    J_{VO} = W_V^\top P_V - P_V^\top W_V - (P_O W_O^\top - W_O P_O^\top)
    \quad (d_v \times d_v).

Both are conserved exactly by leapfrog and by symplectic Euler (each kick moves :math:`p` along
:math:`\nabla \mathcal L`, orthogonal to the orbit; each drift adds :math:`J(p, p) = 0`); explicit
Euler changes them by :math:`-h^2 J(p, \nabla \mathcal L)` per step.

**Gradient flow** :math:`d\theta/dt = -\nabla \mathcal L` conserves, for the whole :math:`\GL`
group,

.. math::  C_{QK} = W_Q^\top W_Q - W_K^\top W_K, \qquad C_{VO} = W_V^\top W_V - W_O W_O^\top,

because invariance gives :math:`W_Q^\top G_Q = G_K^\top W_K` and
:math:`W_V^\top G_V = G_O W_O^\top` at every point; a gradient-descent step of size ``lr``
changes them by :math:`O(\mathrm{lr}^2)`.

Conventions: learned biases that transform with the weights enter in augmented form,
:math:`\tilde W_Q = [W_Q; b_Q]` (``[D + 1, d_k]``), likewise :math:`b_K` and :math:`b_V`. Under
GQA the query heads of a key/value group share one group element, so their terms add up into one
charge per group. With RoPE only the commutant of the rotations survives (per plane
:math:`a I + b J`); the model-level
functions then return the orthogonal projection onto that subalgebra. The model-level functions
derive both from the gauge action itself (:func:`gaugebook.lie.momentum_map`: the momentum
dotted with every generator); the closed forms below are for factor matrices on their own.
Unlearned symmetry-breaking biases are not part of the state: with a fixed query bias :math:`b`
only :math:`P J P` with :math:`P = I - b^\top b / \|b\|^2` is conserved (the stabiliser of
:math:`b`). A learned :math:`b_Q` next to a fixed shift :math:`s` absorbs it: the symmetry
survives with the row :math:`b_Q + s` in place of :math:`b_Q`.

**ECD.** Its unit-speed velocity :math:`v` drifts as :math:`\theta \mathrel{+}= dt\, v` (adding
:math:`J(v, v) = 0`) and is kicked as :math:`v \to \operatorname{normalise}(v - k g_\perp)` with
:math:`g_\perp = g - (g \cdot v) v`; since :math:`g` is orthogonal to every orbit this multiplies
:math:`J(\theta, v)` by one common scalar :math:`(1 + k\, g \cdot v) / \|v - k g_\perp\|` for all
heads, layers and generators (with the global projection and no chaos term). Ratios of charges
are therefore conserved; in the continuum :math:`J(\theta, v) (F - F_0)^{-(\eta/2) d/(d-1)}` is.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from gaugebook.attention import MultiHeadAttention
from gaugebook.gauge import QKTransform, VOTransform, attention_modules, qk_algebra
from gaugebook.lie import ContinuousFactor, float64_parameters, momentum_map, project
from gaugebook.linalg import DTYPE

__all__ = ["antisym", "qk_charge", "vo_charge", "qk_flow_invariant", "vo_flow_invariant",
           "Sectors", "charges", "flow_invariants", "flow_invariant", "largest_norms"]


def _T(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(-1, -2)


def antisym(X: torch.Tensor) -> torch.Tensor:
    r""":math:`X - X^\top` over the last two dimensions."""
    return X - _T(X)


def qk_charge(W_Q, W_K, P_Q, P_K) -> torch.Tensor:
    r""":math:`J_{QK} = \operatorname{antisym}(W_Q^\top P_Q + W_K^\top P_K)` for
    ``W_Q, P_Q [..., D, dk]``, ``W_K, P_K [..., D, dk]`` (augmented rows for biases allowed): the
    momentum map of :math:`\O(d_k)` acting as :math:`W_Q \to W_Q R`, :math:`W_K \to W_K R`."""
    _check_momenta(W_Q=(W_Q, P_Q), W_K=(W_K, P_K))
    _check_factors("W_Q [..., D, dk]", W_Q, "W_K [..., D', dk]", W_K, -1)
    return antisym(_T(W_Q) @ P_Q + _T(W_K) @ P_K)


def vo_charge(W_V, W_O, P_V, P_O) -> torch.Tensor:
    r""":math:`J_{VO} = \operatorname{antisym}(W_V^\top P_V - P_O W_O^\top)` for
    ``W_V, P_V [..., D, dv]``, ``W_O, P_O [..., dv, D]``: the momentum map of :math:`\O(d_v)`
    acting as :math:`W_V \to W_V R`, :math:`W_O \to R^\top W_O`."""
    _check_momenta(W_V=(W_V, P_V), W_O=(W_O, P_O))
    _check_factors("W_V [..., D, dv]", W_V, "W_O [..., dv, D']", W_O, -2)
    return antisym(_T(W_V) @ P_V - P_O @ _T(W_O))


def _check_momenta(**pairs: tuple[torch.Tensor, torch.Tensor]) -> None:
    """ValueError unless each weight's momentum (name=(weight, momentum)) has its shape."""
    for name, (W, P) in pairs.items():
        if W.shape != P.shape:
            raise ValueError(f"the momentum of {name} must have its shape {tuple(W.shape)}, "
                             f"got {tuple(P.shape)}")


def _check_factors(a_shape: str, A: torch.Tensor, b_shape: str, B: torch.Tensor,
                   b_axis: int) -> None:
    """ValueError unless ``A`` and ``B`` are matrices (``a_shape``, ``b_shape``) with
    broadcastable leading dimensions and the last dimension of ``A`` at ``b_axis`` of ``B``."""
    fits = A.ndim >= 2 and B.ndim >= 2 and A.shape[-1] == B.shape[b_axis]
    try:
        torch.broadcast_shapes(A.shape[:-2], B.shape[:-2])
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(f"expected {a_shape} and {b_shape} (leading dimensions broadcastable), "
                         f"got shapes {tuple(A.shape)} and {tuple(B.shape)}")


def qk_flow_invariant(W_Q, W_K) -> torch.Tensor:
    r""":math:`W_Q^\top W_Q - W_K^\top W_K` ``[..., dk, dk]`` for ``W_Q [..., D, dk]`` and
    ``W_K [..., D', dk]`` (one head each, or a batch of heads; augmented rows for biases
    allowed): conserved by gradient flow for the :math:`\GL(d_k)` symmetry."""
    _check_factors("W_Q [..., D, dk]", W_Q, "W_K [..., D', dk]", W_K, -1)
    return _T(W_Q) @ W_Q - _T(W_K) @ W_K


def vo_flow_invariant(W_V, W_O) -> torch.Tensor:
    r""":math:`W_V^\top W_V - W_O W_O^\top` ``[..., dv, dv]`` for ``W_V [..., D, dv]`` and
    ``W_O [..., dv, D']``: conserved by gradient flow for the :math:`\GL(d_v)` symmetry."""
    _check_factors("W_V [..., D, dv]", W_V, "W_O [..., dv, D']", W_O, -2)
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
        """Frobenius norm per group ``[n_kv]``."""
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
    qk = momentum_map(model, QKTransform, momenta, path)  # (Hkv, dk, dk)
    vo = momentum_map(model, VOTransform, momenta, path)  # (Hkv, dv, dv)
    return Sectors(project(qk, qk_algebra(m)) if m.rope else qk, vo)


def charges(model: nn.Module, momenta) -> dict[str, Sectors]:
    r"""Noether charges :math:`J_{QK}`, :math:`J_{VO}` per key/value group of every attention
    layer.

    ``momenta``: tensors shaped like the parameters (momenta, or an optimizer's velocities),
    as a mapping keyed by ``model.named_parameters()`` names or a sequence aligned with
    ``model.parameters()``. Returns ``{layer path: Sectors}`` (path ``""`` for a bare
    :class:`~gaugebook.attention.MultiHeadAttention`).

    Computed as the momentum dotted with every generator (:func:`gaugebook.lie.momentum_map`
    of :class:`~gaugebook.gauge.QKTransform` and :class:`~gaugebook.gauge.VOTransform`), of
    which the charge of the orthogonal subgroup is the antisymmetric part:
    :math:`J = \mu - \mu^\top`, the closed forms :func:`qk_charge` and :func:`vo_charge` on the
    augmented weights. Shapes: ``qk [n_kv_heads, d_head, d_head]``,
    ``vo [n_kv_heads, d_value, d_value]`` per layer. TypeError for a model without attention.
    """
    layers = attention_modules(model, needed_by="the charges")
    p = _as_named(model, momenta)
    result = {}
    for path, m in layers:
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
    r"""The largest Frobenius norms :math:`(\max \|QK\|, \max \|VO\|)` over every layer and
    key/value group of what :func:`charges` or :func:`flow_invariants` returns: how far from
    zero a charge is, or how unbalanced the worst head is, in one pair of numbers."""
    if not by_layer:
        raise ValueError("no attention layers: by_layer is empty")
    return (max(s.qk_norm.max().item() for s in by_layer.values()),
            max(s.vo_norm.max().item() for s in by_layer.values()))


def flow_invariants(model: nn.Module) -> dict[str, Sectors]:
    r"""Gradient-flow invariants
    :math:`C_{QK} = \sum_h \tilde W_Q^{(h)\top} \tilde W_Q^{(h)} - \tilde W_K^\top \tilde W_K` and
    :math:`C_{VO} = \tilde W_V^\top \tilde W_V - \sum_h W_O^{(h)} W_O^{(h)\top}` per key/value group
    of every attention layer (sums over the query heads of the group): the momentum maps at
    :math:`p = \theta`. Returns ``{layer path: Sectors}`` with ``qk [n_kv_heads, d_head,
    d_head]`` and ``vo [n_kv_heads, d_value, d_value]`` (float64), as :func:`charges` does.
    TypeError for a model without attention."""
    return {path: _sector(model, path, m, float64_parameters(m))
            for path, m in attention_modules(model, needed_by="the flow invariants")}


def flow_invariant(model: nn.Module, family: type[ContinuousFactor], target: str = "",
                   **options) -> torch.Tensor:
    r"""The gradient-flow invariant of one declared family: the momentum map at
    :math:`p = \theta`, :math:`C[X] = \langle \theta, \xi_X(\theta) \rangle` for every
    generator :math:`X` of the family's Lie algebra (:math:`\xi_X(\theta)` the tangent vector,
    :func:`gaugebook.lie.tangent_map`), returned as the orthogonal projection of
    :func:`gaugebook.lie.momentum_map` onto the span of ``family.lie_basis`` (a proper subspace
    with RoPE), shaped like the family's parameter. ``target``: the submodule it acts on;
    ``options``: the factor's other fields (``which="ln_1"``). It builds the Lie basis, so it is
    for layers of a size to check by hand; :func:`flow_invariants` gives the attention ones of
    a large model.

    Gradient flow conserves it when the family is an exact symmetry, every parameter it moves
    is trained, and its action is linear, :math:`\xi_X(\theta) = A_X \theta`, with generators
    closed under transposition (:math:`A_X^\top = A_Y` for a generator :math:`Y`), or a
    translation by a fixed vector: then :math:`dC[X]/dt = -\langle \nabla\mathcal L,
    A_X \theta + A_X^\top \theta \rangle = 0`, since invariance makes
    :math:`\nabla\mathcal L` orthogonal to every tangent vector. A gradient-descent step then
    changes it by :math:`O(\mathrm{lr}^2)`: the linear families :class:`~gaugebook.gauge.QKTransform`
    (:math:`C_{QK}` of :func:`flow_invariants`), :class:`~gaugebook.gauge.VOTransform`,
    :class:`~gaugebook.gpt_gauge.LayerNormScale`, :class:`~gaugebook.gpt_gauge.HiddenRescaling`
    (unit :math:`j`'s balance :math:`\|w^\text{in}_j\|^2 + b_j^2 - \|w^\text{out}_j\|^2`) and
    :class:`~gaugebook.moe.ExpertRescaling`; not at all: the fixed translations
    :class:`~gaugebook.gauge.KeyBiasShift`, :class:`~gaugebook.gpt_gauge.ResidualCentring`,
    :class:`~gaugebook.gpt_gauge.PositionCentring`, :class:`~gaugebook.gpt_gauge.EmbeddingShift`
    and :class:`~gaugebook.moe.RouterShift`. Translations along a direction that other
    parameters set (:class:`~gaugebook.gauge.ValueBiasShift`, :math:`b_O` along :math:`W_O`;
    :class:`~gaugebook.gpt_gauge.LayerNormShift`; :class:`~gaugebook.gpt_gauge.ReaderCentring`,
    along :math:`1/\gamma`) and :class:`~gaugebook.gpt_gauge.StreamScaling` (exact only at
    LayerNorm ``eps = 0``) change at first order."""
    module = model.get_submodule(target)
    mu = momentum_map(model, family, float64_parameters(module), target, **options)
    basis = family.lie_basis(module, **options).to(mu).flatten(1)  # (k, n)
    if len(basis) == mu.numel():  # the algebra is the whole space of the parameter
        return mu
    if len(basis) == 0:
        return torch.zeros_like(mu)
    coefficients = torch.linalg.lstsq(basis.T, mu.reshape(-1, 1)).solution  # (k, 1)
    return (basis.T @ coefficients).reshape(mu.shape)
