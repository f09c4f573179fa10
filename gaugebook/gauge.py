r"""The gauge group of multi-head attention, as objects that act on modules.

A :class:`~gaugebook.lie.GaugeElement` is a product of primitive factors;
``element.act(module)`` returns a transformed deep copy and leaves ``module`` untouched. With
:math:`g(h)` the key/value head of query head :math:`h` (:math:`g(h) = h` in MHA) and
:math:`W_Q^{(h)}` the slice ``W_Q[h]``, the primitives are

* :class:`QKTransform` ``M [n_kv, d_head, d_head]``:
  :math:`W_Q^{(h)} \to W_Q^{(h)} M_{g(h)}`, :math:`b_Q^{(h)} \to b_Q^{(h)} M_{g(h)}`,
  :math:`W_K^{(g)} \to W_K^{(g)} M_g^{-\top}`, :math:`b_K^{(g)} \to b_K^{(g)} M_g^{-\top}`, so
  that :math:`q k^\top \to q M M^{-1} k^\top = q k^\top`. (The source's :math:`W_K \to W_K M` is
  *not* a symmetry.)
* :class:`VOTransform` ``N [n_kv, d_value, d_value]``:
  :math:`W_V^{(g)} \to W_V^{(g)} N_g`, :math:`b_V^{(g)} \to b_V^{(g)} N_g`,
  :math:`W_O^{(h)} \to N_{g(h)}^{-1} W_O^{(h)}`.
* :class:`HeadPermutation` ``perm [n_heads]``: head ``i`` of the result is head ``perm[i]`` of the
  input. Under GQA it must carry whole key/value groups to whole groups (the wreath product
  :math:`S_G \wr S_{n_{kv}}`); the key/value heads follow.
* :class:`KeyBiasShift` ``t [n_kv, d_head]``: :math:`b_K \to b_K + t`. Without RoPE,
  :math:`q_t (b_K + t)^\top` is the same for every key position and cancels in the softmax.
* :class:`ValueBiasShift` ``t [n_kv, d_value]``: :math:`b_V \to b_V + t`,
  :math:`b_O \to b_O - \sum_h t_{g(h)} W_O^{(h)}`; attention rows sum to one, so a value bias is
  a constant output shift.

With RoPE the QK matrices must commute with every rotation :math:`R_t`: per rotation plane a
complex scalar :math:`a I + b J` (:math:`a I` alone for gated RoPE), and on the unrotated
coordinates any invertible block (a diagonal one for gated RoPE, whose gates act coordinate by
coordinate).

Composition follows functions: ``(a @ b).act(m) == a.act(b.act(m))``, for elements and single
factors alike. Each primitive is a factor of :mod:`gaugebook.lie` (its action, inverse, and for
the continuous ones its Lie algebra and exponential); the symmetries of the rest of a GPT block
(LayerNorm, residual stream, MLP, embeddings) are defined in :mod:`gaugebook.gpt_gauge`, and its
exact ones are importable from here too (``StreamScaling``, exact only at LayerNorm eps = 0,
from there alone); those of a mixture of experts are in :mod:`gaugebook.moe`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from gaugebook.attention import MultiHeadAttention
from gaugebook.breaking import ShiftedAttention, SymmetryBreakingBias
from gaugebook.checks import check_finite_tensors
# The rest of a GPT's symmetries are defined and documented in gaugebook.gpt_gauge; they are
# importable from here as well, beside the attention factors, but left out of __all__. (The two
# names re-exported from lie, GaugeElement and identity, are in __all__ as the factors' working
# companions; the API page excludes them, so that each name is documented once.)
from gaugebook.gpt_gauge import (EmbeddingShift, HiddenPermutation,  # noqa: F401
                                 HiddenRescaling, LayerNormScale, LayerNormShift,
                                 PositionCentring, ReaderCentring, ResidualCentring,
                                 ResidualPermutation)
from gaugebook.lie import (Factor, GaugeElement, MatrixFactor, PermutationFactor,
                           TranslationFactor, gl_basis, identity, rope_commutant_basis,
                           unit_basis)
from gaugebook.linalg import DTYPE, random_gl, relative_change, spread
from gaugebook.rope import check_rotary_dim

__all__ = ["GaugeElement", "QKTransform", "VOTransform", "HeadPermutation", "KeyBiasShift",
           "ValueBiasShift", "random_element", "random_attention_factors", "identity",
           "invariance_error",
           "rope_commutant_element", "attention_modules", "gauge_layers", "qk_algebra",
           "grouped_weights",
           "ATTENTION_ALGEBRA"]


def _expect(module: MultiHeadAttention, what: str, **sizes) -> None:
    """Raise a ``ValueError`` naming every size of ``what`` that ``module`` does not match."""
    wrong = [f"{k}={v} but the module has {getattr(module, k)}" for k, v in sizes.items()
             if getattr(module, k) != v]
    if wrong:
        raise ValueError(f"{what} does not fit this module: " + "; ".join(wrong))


def _row(x: torch.Tensor, M: torch.Tensor) -> torch.Tensor:
    """Row vectors ``x [..., n, d]`` times per-row matrices ``M [n, d, e]``: ``[..., n, e]``."""
    return (x[..., None, :] @ M)[..., 0, :]


def _per_group(X: torch.Tensor, m: MultiHeadAttention) -> torch.Tensor:
    """``X [n_kv, ...]`` repeated for the query heads of each group: ``[n_heads, ...]``."""
    return X.repeat_interleave(m.group_size, dim=0)


def qk_algebra(m: MultiHeadAttention) -> torch.Tensor:
    r"""A basis ``[k, d_head, d_head]`` of the QK Lie algebra of one key/value group of ``m``:
    the commutant of its rotations (:func:`gaugebook.lie.rope_commutant_basis`).

    Without RoPE all of :math:`\mathfrak{gl}(d_\text{head})`. With RoPE, per rotation plane
    :math:`(i, i + r/2)` (:math:`r` = ``m.rotary_dim``) the scaling :math:`S_i` and the rotation
    generator :math:`J_i` (only :math:`S_i` for gated RoPE, whose coordinate-wise gates forbid
    rotations), and on the :math:`u = d_\text{head} - r` unrotated coordinates all of
    :math:`\mathfrak{gl}(u)` (its diagonal for gated RoPE)."""
    return rope_commutant_basis(m.d_head, m.rotary_dim, m.rope == "gated")


def _grouped_basis(per_group: torch.Tensor, n_groups: int) -> torch.Tensor:
    """``[n_groups k, n_groups, ...]`` from a basis ``[k, ...]`` of one group: group-major, each
    element non-zero in one group."""
    k = per_group.shape[0]
    out = torch.zeros(n_groups, k, n_groups, *per_group.shape[1:], dtype=per_group.dtype)
    for g in range(n_groups):
        out[g, :, g] = per_group
    return out.flatten(0, 1)


class _FactorPair(MatrixFactor):
    r"""The action shared by the QK and VO sectors: one matrix ``M [n_kv, w, w]`` per key/value
    group (``w`` the module's size named ``width``) acting on the sector's factor pair,
    :math:`X \to X M`, :math:`Y \to Y M^{-\top}`, which leaves :math:`X Y^\top` unchanged.
    ``sides`` says which parameters are rows of :math:`X` or :math:`Y` and whether they are
    indexed by query head (then the group's matrix repeats over its :math:`G` heads) or by
    key/value group; ``W_O`` enters as :math:`Y = W_O^\top`. The Lie algebra is :meth:`algebra`
    in every group."""

    acts_on: ClassVar = MultiHeadAttention
    width: ClassVar[str]
    sides: ClassVar[dict[str, tuple[str, bool]]]  # name -> ("X" | "Y" | "Y^T", per query head)

    @classmethod
    def shape(cls, m):
        """``[n_kv_heads, w, w]``: one matrix per key/value group."""
        return (m.n_kv_heads, getattr(m, cls.width), getattr(m, cls.width))

    def check(self, m):
        X = self.parameter
        if X.ndim != 3:  # one shared [w, w] matrix would broadcast over the groups silently
            raise ValueError(f"{type(self).__name__}: one matrix per key/value group, shape "
                             f"[n_kv_heads, {self.width}, {self.width}], got {tuple(X.shape)}")
        _expect(m, type(self).__name__, n_kv_heads=X.shape[0], **{self.width: X.shape[-1]})

    def transform(self, params, m):
        M = self.parameter.to(next(iter(params.values())).device)  # (Hkv, w, w)
        dual = torch.linalg.inv(M).mT  # M^{-T}
        by_side = {"X": M, "Y": dual, "Y^T": dual}
        out = {}
        for name, (side, per_head) in self.sides.items():
            if name not in params:  # a bias of a module without biases
                continue
            A = _per_group(by_side[side], m) if per_head else by_side[side]
            x = params[name]
            if side == "Y^T":  # W_O = Y^T -> (Y M^{-T})^T = M^{-1} W_O
                out[name] = A.mT @ x
            else:  # weights [..., n, D, w] and biases [..., n, w] as rows
                out[name] = _row(x, A) if name.startswith("b_") else x @ A
        return out

    @classmethod
    def algebra(cls, m: MultiHeadAttention) -> torch.Tensor:  # pragma: no cover - abstract
        """A basis ``[k, w, w]`` of the algebra of one group."""
        raise NotImplementedError

    @classmethod
    def lie_basis(cls, m):
        """Per key/value group the basis of :meth:`algebra`, group-major."""
        return _grouped_basis(cls.algebra(m), m.n_kv_heads)


@dataclass(frozen=True, eq=False)
class QKTransform(_FactorPair):
    r""":math:`W_Q \to W_Q M`, :math:`W_K \to W_K M^{-\top}` per key/value group (biases alike):
    the pair :math:`X = [W_Q; b_Q]` (the group's query heads), :math:`Y = [W_K; b_K]`."""

    M: torch.Tensor  #: [n_kv, d_head, d_head]
    width: ClassVar = "d_head"
    sides: ClassVar = {"W_Q": ("X", True), "b_Q": ("X", True), "W_K": ("Y", False),
                       "b_K": ("Y", False)}

    @classmethod
    def algebra(cls, m):
        r"""The commutant of RoPE's rotations in :math:`\mathfrak{gl}(d_\text{head})`
        (:func:`qk_algebra`), ``[k, d_head, d_head]``."""
        return qk_algebra(m)


@dataclass(frozen=True, eq=False)
class VOTransform(_FactorPair):
    r""":math:`W_V \to W_V N`, :math:`b_V \to b_V N`, :math:`W_O \to N^{-1} W_O` per key/value
    group: the pair :math:`X = [W_V; b_V]`, :math:`Y = W_O^\top` (the group's output matrices)."""

    N: torch.Tensor  #: [n_kv, d_value, d_value]
    width: ClassVar = "d_value"
    sides: ClassVar = {"W_V": ("X", False), "b_V": ("X", False), "W_O": ("Y^T", True)}

    @classmethod
    def algebra(cls, m):
        r"""All of :math:`\mathfrak{gl}(d_\text{value})` (:func:`~gaugebook.lie.gl_basis`),
        ``[d_value^2, d_value, d_value]``."""
        return gl_basis(m.d_value)


@dataclass(frozen=True, eq=False)
class HeadPermutation(PermutationFactor):
    """Relabel heads: head ``i`` of the result is head ``perm[i]`` of the input."""

    perm: torch.Tensor  #: [n_heads], a permutation
    acts_on: ClassVar = MultiHeadAttention

    def kv_permutation(self, group_size: int) -> torch.Tensor:
        """The induced permutation of key/value heads; error if groups are split."""
        groups = (self.perm // group_size).view(-1, group_size)  # (Hkv, G)
        if not (groups == groups[:, :1]).all():
            raise ValueError(f"head permutation {self.perm.tolist()} splits a key/value group of "
                             f"size {group_size}: under GQA whole groups must move together")
        return groups[:, 0]

    def check(self, m):
        """ValueError unless ``perm`` is one permutation of the module's ``n_heads`` heads that
        moves whole key/value groups."""
        if self.perm.ndim != 1:
            raise ValueError(f"HeadPermutation.perm must be one permutation [n_heads], got shape "
                             f"{tuple(self.perm.shape)}")
        _expect(m, "HeadPermutation", n_heads=len(self.perm))
        self.kv_permutation(m.group_size)

    def transform(self, params, m):
        """Query head ``i`` of ``W_Q, b_Q, W_O`` (and the gate ``W_GQ``) becomes head ``perm[i]``;
        ``W_K, b_K, W_V, b_V`` (and ``W_GK``) follow the induced permutation of key/value heads."""
        device = params["W_Q"].device
        heads, kv = self.perm.to(device), self.kv_permutation(m.group_size).to(device)
        out = {}
        for names, index in ((("W_Q", "b_Q", "W_O", "W_GQ"), heads),
                             (("W_K", "b_K", "W_V", "b_V", "W_GK"), kv)):
            for name in names:
                if name in params:  # the head axis: first of the parameter's own axes
                    x = params[name]
                    out[name] = x.index_select(x.ndim - getattr(m, name).ndim, index)
        return out


class _GroupShift(TranslationFactor):
    """One bias translation per key/value group, ``t [n_kv, w]`` with ``w`` the module's size
    named ``width``, on the coordinates :meth:`free` (needs learned biases)."""

    acts_on: ClassVar = MultiHeadAttention
    ndim: ClassVar = 2
    shape_doc: ClassVar = "[n_kv_heads, width]"
    width: ClassVar[str]

    @classmethod
    def shape(cls, m):
        """``[n_kv_heads, w]``: one shift per key/value group (the :meth:`free` coordinates
        move; the others are fixed by :meth:`lie_basis`)."""
        return (m.n_kv_heads, getattr(m, cls.width))

    def check(self, m):
        if not m.has_bias:
            raise ValueError(f"{type(self).__name__} needs a module with bias=True")
        if self.t.ndim != 2:  # one shared shift would broadcast over the groups silently
            raise ValueError(f"{type(self).__name__}: one shift per key/value group, shape "
                             f"[n_kv_heads, {self.width}], got {tuple(self.t.shape)}")
        _expect(m, type(self).__name__, n_kv_heads=self.t.shape[0],
                **{self.width: self.t.shape[1]})

    @classmethod
    def free(cls, m: MultiHeadAttention) -> range:  # pragma: no cover - abstract
        """The coordinates along which the translation is a symmetry."""
        raise NotImplementedError

    @classmethod
    def lie_basis(cls, m):
        """Per key/value group the unit shifts of the :meth:`free` coordinates, group-major."""
        units = unit_basis((getattr(m, cls.width),))[list(cls.free(m))]
        return _grouped_basis(units, m.n_kv_heads)


@dataclass(frozen=True, eq=False)
class KeyBiasShift(_GroupShift):
    r""":math:`b_K \to b_K + t`: :math:`q_t \cdot t` is the same for every key position and
    cancels in the softmax, so a symmetry on the coordinates that RoPE does not rotate (all
    without RoPE)."""

    t: torch.Tensor  #: [n_kv, d_head]
    width: ClassVar = "d_head"

    def transform(self, params, m):
        r""":math:`b_K \to b_K + t`, ``t [n_kv, d_head]``."""
        return dict(b_K=params["b_K"] + self.t.to(params["b_K"].device))

    @classmethod
    def free(cls, m):
        """The unrotated coordinates; none with gated RoPE (its gates multiply them by an
        input-dependent factor) and none without biases."""
        if not m.has_bias or m.rope == "gated":
            return range(0)
        return range(m.rotary_dim, m.d_head)


@dataclass(frozen=True, eq=False)
class ValueBiasShift(_GroupShift):
    r""":math:`b_V \to b_V + t`, :math:`b_O \to b_O - \sum_h t_{g(h)} W_O^{(h)}`: attention rows
    sum to one, so a value bias is a constant output shift that :math:`b_O` takes back."""

    t: torch.Tensor  #: [n_kv, d_value]
    width: ClassVar = "d_value"

    def transform(self, params, m):
        r""":math:`b_V \to b_V + t`, :math:`b_O \to b_O - \sum_h t_{g(h)} W_O^{(h)}`,
        ``t [n_kv, d_value]``."""
        t = self.t.to(params["b_V"].device)  # (Hkv, dv)
        shift = torch.einsum("he,...hed->...d", _per_group(t, m), params["W_O"])
        return dict(b_V=params["b_V"] + t, b_O=params["b_O"] - shift)

    @classmethod
    def free(cls, m):
        """Every value coordinate (none without biases)."""
        return range(m.d_value if m.has_bias else 0)


def grouped_weights(m: MultiHeadAttention) -> dict[str, torch.Tensor]:
    r"""The layer's weights as one factor pair per key/value group, float64: ``Q [n_kv, G (D + b),
    d_head]`` (the group's query heads stacked, learned ``b_Q`` as an extra input row),
    ``K [n_kv, D + b, d_head]``, ``V [n_kv, D + b, d_value]`` (biases as a last row) and
    ``O [n_kv, d_value, G D]`` (the group's output matrices side by side). The QK and VO
    transforms act on them as :math:`(Q, K) \to (Q M, K M^{-\top})` and
    :math:`(V, O^\top) \to (V N, O^\top N^{-\top})`."""
    def augmented(s):
        W = getattr(m, f"W_{s}").detach().to(DTYPE)
        return torch.cat([W, getattr(m, f"b_{s}").detach().to(DTYPE)[:, None]], 1) \
            if m.has_bias else W

    n, G, dv, D = m.n_kv_heads, m.group_size, m.d_value, m.d_model
    W_O = m.W_O.detach().to(DTYPE)
    return dict(Q=augmented("Q").reshape(n, -1, m.d_head), K=augmented("K"), V=augmented("V"),
                O=W_O.reshape(n, G, dv, D).transpose(1, 2).reshape(n, dv, G * D))


ATTENTION_ALGEBRA = (QKTransform, VOTransform, KeyBiasShift, ValueBiasShift)
"""The continuous factors of one attention layer, in the column order of orbit tangents
(:class:`QKTransform`, :class:`VOTransform`, :class:`KeyBiasShift`, :class:`ValueBiasShift`).

:meta hide-value:
"""


def attention_modules(module: nn.Module, *,
                      needed_by: str | None = None) -> list[tuple[str, MultiHeadAttention]]:
    """Every :class:`~gaugebook.attention.MultiHeadAttention` inside ``module`` (itself
    included), with its path; TypeError when there is none and ``needed_by`` names what needs
    them (``"the charges"``)."""
    layers = [(name, m) for name, m in module.named_modules()
              if isinstance(m, MultiHeadAttention)]
    if not layers and needed_by:
        fused = any(isinstance(m, nn.MultiheadAttention) for m in module.modules())
        raise TypeError(
            f"{type(module).__name__} contains no MultiHeadAttention (gaugebook.attention) "
            f"for {needed_by}"
            + ("; torch.nn.MultiheadAttention keeps its heads' weights fused: convert it with "
               "gaugebook.attention.MultiHeadAttention.from_torch, which stores them per head"
               if fused else ""))
    return layers


def gauge_layers(model: nn.Module, *,
                 permutations_only: bool = False) -> list[tuple[str, MultiHeadAttention]]:
    r"""The attention layers of ``model`` (:func:`attention_modules`), checked so that the
    attention gauge group (:math:`\GL(d_k) \times \GL(d_v)` per key/value group, head
    permutations) keeps ``model``'s function: TypeError when there is none, ValueError for a
    layer with RoPE (its QK group is only the commutant of the rotations, chapter 5) or a model
    with symmetry-breaking biases (:math:`W_Q \to W_Q M` does not move them, chapter 16). With
    ``permutations_only`` RoPE layers pass: permutations of heads (and of residual features
    and MLP units) commute with the rotations.
    :func:`~gaugebook.alignment.align_gpt`, :func:`~gaugebook.alignment.sample_align` and
    :func:`~gaugebook.sharpness.minimise_over_orbit` refuse models through it."""
    layers = attention_modules(model, needed_by="the attention gauge group")
    for path, m in layers:
        if m.rope and not permutations_only:
            raise ValueError(f"{path or 'the module'} uses RoPE, whose QK group is only the "
                             "commutant of the rotations (chapter 5), but this needs the full "
                             "GL(d_head) QK group: use a model without RoPE (or, for align_gpt, "
                             "frames=False: its permutations alone commute with the rotations)")
    breaking = [path or type(m).__name__ for path, m in model.named_modules()
                if isinstance(m, (SymmetryBreakingBias, ShiftedAttention))]
    if breaking:
        raise ValueError(f"{type(model).__name__} has symmetry-breaking biases ({breaking[0]}): "
                         "W_Q -> W_Q M does not move them, so the gauge orbit is not a set of "
                         "equal-loss points (chapter 16): use a model without them "
                         "(symmetry_breaking=None)")
    return layers


def rope_commutant_element(d_head: int, rotary_dim: int, *, cond: float = 10.0,
                           gated: bool = False,
                           generator: torch.Generator | None = None) -> torch.Tensor:
    r"""A random ``M [d_head, d_head]`` that commutes with every RoPE rotation :math:`R_t`: a
    combination of the basis of :func:`gaugebook.lie.rope_commutant_basis`.

    On plane :math:`(i, i + r/2)` (:math:`r` = ``rotary_dim``) it is
    :math:`\rho\, (\cos\phi\, S_i + \sin\phi\, J_i)` (a complex scalar; :math:`\phi = 0` and
    :math:`\rho` of either sign for gated RoPE, whose coordinate-wise gates forbid the rotation);
    on the :math:`d_\text{head} - r` unrotated coordinates any invertible block (a diagonal one
    for gated RoPE). Condition number ``cond``, except for a single plane and no unrotated
    coordinate (:math:`d_\text{head} = r = 2`), where every element is a scaled rotation
    (condition 1).
    """
    half, rest = check_rotary_dim(d_head, rotary_dim) // 2, d_head - rotary_dim
    scales = spread(half + rest, cond, generator=generator)
    rho, s_rest = scales[:half], scales[half:]

    def signs(n):
        return torch.randint(0, 2, (n,), generator=generator).to(DTYPE) * 2 - 1

    if gated:  # coefficients of S_i, then of the diagonal units E_jj
        planes, block = (signs(half) * rho)[:, None], signs(rest) * s_rest
    else:  # coefficients of (S_i, J_i), then of the units E_jk of the unrotated block
        phi = 2 * torch.pi * torch.rand(half, generator=generator, dtype=DTYPE)
        planes = torch.stack([rho * torch.cos(phi), rho * torch.sin(phi)], dim=1)
        block = torch.zeros(0, dtype=DTYPE)
        if rest:
            G = random_gl(rest, (s_rest.max() / s_rest.min()).item(), generator=generator)
            block = (G / torch.linalg.svdvals(G).max() * s_rest.max()).flatten()
    coefficients = torch.cat([planes.flatten(), block])
    return torch.einsum("k,kij->ij", coefficients, rope_commutant_basis(d_head, rotary_dim, gated))


def _random_head_permutation(m: MultiHeadAttention, generator) -> torch.Tensor:
    """A uniform element of the wreath product: permute groups, then heads within each group."""
    G = m.group_size
    groups = torch.randperm(m.n_kv_heads, generator=generator)
    within = torch.stack([torch.randperm(G, generator=generator) for _ in range(m.n_kv_heads)])
    return (groups[:, None] * G + within).flatten()


def random_attention_factors(m: MultiHeadAttention, *, cond: float,
                             generator: torch.Generator | None = None
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(M [n_kv, d_head, d_head], N [n_kv, d_v, d_v], perm [H])``: the parameters of a random
    :class:`QKTransform`, :class:`VOTransform` and :class:`HeadPermutation` of ``m``, drawn in
    that order from ``generator`` (CPU, float64): each matrix with condition number ``cond``
    (:func:`~gaugebook.linalg.random_gl`; under RoPE in the commutant,
    :func:`rope_commutant_element`), the permutation uniform over the wreath product."""
    if m.rope:
        M = torch.stack([rope_commutant_element(m.d_head, m.rotary_dim, cond=cond,
                                                gated=m.rope == "gated", generator=generator)
                         for _ in range(m.n_kv_heads)])
    else:
        M = torch.stack([random_gl(m.d_head, cond, generator=generator)
                         for _ in range(m.n_kv_heads)])
    N = torch.stack([random_gl(m.d_value, cond, generator=generator)
                     for _ in range(m.n_kv_heads)])
    return M, N, _random_head_permutation(m, generator)


def _random_attention_element(m: MultiHeadAttention, cond: float, generator, target: str):
    M, N, perm = random_attention_factors(m, cond=cond, generator=generator)
    factors = [QKTransform(M, target=target), VOTransform(N, target=target),
               HeadPermutation(perm, target=target)]
    if m.has_bias:
        shape_v = (m.n_kv_heads, m.d_value)
        factors.append(ValueBiasShift(torch.randn(shape_v, generator=generator, dtype=DTYPE),
                                      target=target))
    free = list(KeyBiasShift.free(m))  # the coordinates RoPE does not rotate
    if free:
        t = torch.zeros(m.n_kv_heads, m.d_head, dtype=DTYPE)
        t[:, free] = torch.randn(m.n_kv_heads, len(free), generator=generator, dtype=DTYPE)
        factors.append(KeyBiasShift(t, target=target))
    return factors


def random_element(module: nn.Module, *, cond: float = 10.0,
                   generator: torch.Generator | None = None) -> GaugeElement:
    """A random element of the attention gauge group of every
    :class:`~gaugebook.attention.MultiHeadAttention` inside ``module`` (the continuous group
    times a head permutation).

    Every such layer gets its own QK and VO matrices (each of 2-norm condition number ``cond``;
    RoPE-commuting where RoPE is on, with the exception that :func:`rope_commutant_element`
    states), a head permutation and, with biases, a value-bias shift and a key-bias shift on the
    coordinates that RoPE does not rotate (:meth:`KeyBiasShift.free`). The rest of a GPT's
    symmetries (:mod:`gaugebook.gpt_gauge`) are not drawn. The element keeps ``module``'s
    function unless ``module`` has symmetry-breaking biases, which it does not move (chapter 16;
    :func:`gauge_layers` refuses such models).
    """
    layers = attention_modules(module, needed_by="a random gauge element")
    return GaugeElement(f for name, m in layers
                        for f in _random_attention_element(m, cond, generator, name))


@torch.no_grad()
def invariance_error(element: GaugeElement | Factor | nn.Module,
                     module: nn.Module | GaugeElement | Factor, *inputs) -> float:
    r""":math:`\max |f(g \cdot \theta, x) - f(\theta, x)| / \max |f(\theta, x)|` over all
    outputs, for the module :math:`f` and the element :math:`g`, given in either order
    (``invariance_error(f, g, x)`` works too). A single factor (e.g. ``QKTransform(M)``) is the
    element of that one factor, as in ``factor @ element``.

    Both forward passes start from the same random state (restored afterwards), so a stochastic
    model (dropout, symmetry-breaking biases in training mode) draws the same noise in both.
    Non-finite weights or inputs are refused (ValueError naming the tensor).
    """
    if isinstance(element, nn.Module) and isinstance(module, (GaugeElement, Factor)):
        element, module = module, element
    if isinstance(element, Factor):
        element = GaugeElement(element)
    if not isinstance(element, GaugeElement) or not isinstance(module, nn.Module):
        raise TypeError("invariance_error takes a GaugeElement (or one Factor) and an "
                        f"nn.Module, then the inputs; got {type(element).__name__} and "
                        f"{type(module).__name__}")
    check_finite_tensors(module, *inputs)
    cuda = sorted({p.device.index for p in module.parameters() if p.is_cuda})

    def output(m):
        with torch.random.fork_rng(devices=cuda):
            y = m(*inputs)
        return y[0] if isinstance(y, tuple) else y

    return relative_change(output(element.act(module)), output(module))
