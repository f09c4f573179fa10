r"""The one form of every symmetry the book counts: a group element that acts on a module's
parameters, and its Lie algebra.

A :class:`Factor` is one primitive symmetry acting on the submodule at ``target`` (a path inside
the module it is applied to, ``""`` for the module itself). It knows

* its **action** ``transform(params, module) -> params``: a pure function of the float64
  parameters of the target (named as in ``module.named_parameters()``), differentiable in the
  parameters and in the factor's own tensors, with optional leading batch dimensions on the
  parameters. :meth:`GaugeElement.act` applies it to a deep copy; the input is never touched;
* its **inverse** ``inverse()``; composition is :class:`GaugeElement`'s ``@``, which follows
  functions: ``(a @ b).act(m) == a.act(b.act(m))``.

A :class:`ContinuousFactor` (a Lie group) also knows

* its **Lie algebra** at a module, ``lie_basis(module) -> [k, *shape]``: ``k`` algebra elements
  in the shape of the factor's parameter (``k`` is the family's dimension at that module);
* its **exponential** ``exp(X)``: the one-parameter subgroup :math:`t \mapsto \exp(tX)`.

From these two everything else is derived once, here:

* :func:`tangent_map`: the generators as tangent vectors of the orbit through the module's
  parameters, :math:`\frac{d}{dt} \exp(tX) \cdot \theta` at :math:`t = 0` (forward-mode
  differentiation of the action along :meth:`ContinuousFactor.near_identity`);
* :func:`momentum_map`: :math:`\mu(p)[X] = \langle p, \frac{d}{dt} \exp(tX) \cdot \theta \rangle`,
  the momentum :math:`p` dotted with every generator at once (one reverse-mode pass), returned in
  the shape of the algebra element.
  Noether charges and gradient-flow invariants are its values (:mod:`gaugebook.mechanics`);
* :meth:`ContinuousFactor.random`: a random element, the exponential of a Gaussian combination
  of the basis;
* :func:`project`: the orthogonal projection onto a subalgebra given by an orthogonal basis.

Four kinds of factor share validation and inverse: :class:`MatrixFactor` (one invertible matrix
per key/value group), :class:`TranslationFactor` (parameters add), :class:`ScalingFactor`
(parameters multiply), which also share the exponential, and :class:`PermutationFactor`
(discrete: no Lie algebra); each family declares
its parameter's shape at a module (:meth:`Factor.shape`). Where each symmetry's formula is:

=========================================================  ====================================
symmetry                                                   factor
=========================================================  ====================================
attention QK (RoPE commutant, GQA tying, partial, gated)   :class:`gaugebook.gauge.QKTransform`
attention VO                                               :class:`gaugebook.gauge.VOTransform`
key / value bias shifts                                    ``gauge.KeyBiasShift``,
                                                           ``gauge.ValueBiasShift``
head permutations (whole key/value groups)                 ``gauge.HeadPermutation``
LayerNorm gain, bias, reader centring                      ``gpt_gauge.LayerNormScale``,
                                                           ``LayerNormShift``, ``ReaderCentring``
residual centring, residual feature permutation            ``gpt_gauge.ResidualCentring``,
                                                           ``ResidualPermutation``
MLP rescaling (PReLU), hidden-unit permutation             ``gpt_gauge.HiddenRescaling``,
                                                           ``HiddenPermutation``
embedding shift, position centring                         ``gpt_gauge.EmbeddingShift``,
                                                           ``PositionCentring``
residual-stream scaling (exact only at LayerNorm eps = 0)  ``gpt_gauge.StreamScaling``
MoE router shift, expert permutation, ReLU rescaling,      ``moe.RouterShift``,
hidden-unit permutation                                    ``ExpertPermutation``,
                                                           ``ExpertRescaling``,
                                                           ``ExpertHiddenPermutation``
=========================================================  ====================================

The dimension formulas of the attention sectors (:func:`attention_terms`, and
:func:`drawn_gauge` for fixed symmetry-breaking draws) and of the product map
(:func:`factor_redundancy`) live here too, so that the counts of
:mod:`gaugebook.redundancy` and :mod:`gaugebook.gpt_redundancy` come from one place.
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import nn
from torch.func import jvp, vmap

from gaugebook.attention import check_rope_mode
from gaugebook.checks import check_number, check_positive_ints
from gaugebook.linalg import DTYPE, check_invertible, check_permutation
from gaugebook.rope import check_rotary_dim

__all__ = ["Factor", "ContinuousFactor", "MatrixFactor", "TranslationFactor", "ScalingFactor",
           "PermutationFactor", "GaugeElement", "identity", "tangent_map",
           "momentum_map", "project", "gl_basis", "rope_commutant_basis",
           "rope_plane_breaking_basis", "unit_basis",
           "factor_redundancy", "drawn_gauge", "attention_terms", "float64_parameters"]


# ----------------------------------------------------------------------------- group elements

def float64_parameters(module: nn.Module, *, trainable_only: bool = False) -> dict:
    """``{name: parameter}`` of ``module`` as detached float64 tensors (``named_parameters()``
    order; tied parameters once)."""
    return {n: p.detach().to(DTYPE) for n, p in module.named_parameters()
            if p.requires_grad or not trainable_only}


@dataclass(frozen=True, eq=False)  # equality by identity: the fields are tensors
class Factor:
    """A primitive symmetry of the module at ``target``; subclasses set ``acts_on`` (the class
    of module it acts on) and implement :meth:`transform` and :meth:`inverse`."""

    target: str = field(default="", kw_only=True)
    acts_on: ClassVar[type | tuple[type, ...]] = nn.Module

    @classmethod
    def unchecked(cls, *args, **kwargs) -> "Factor":
        """A factor from tensors as they are (no validation, no cast): the differentiable path
        that :func:`tangent_map`, :func:`momentum_map` and the orbit search use."""
        self = object.__new__(cls)
        names = [f.name for f in dataclasses.fields(cls) if f.name != "target"]
        for name, value in zip(names, args):
            object.__setattr__(self, name, value)
        for name, value in {"target": "", **kwargs}.items():
            object.__setattr__(self, name, value)
        return self

    @classmethod
    def shape(cls, module: nn.Module, **options) -> tuple | None:
        """The shape the factor's parameter must have at ``module`` (``None``: not checked
        here). ``options`` are the factor's other fields (e.g. which LayerNorm). Where the
        symmetry is absent at ``module``, its Lie algebra is empty, so that every count and
        tangent map built from it reads 0 without a special case: by default
        (:meth:`ContinuousFactor.lie_basis`) because the shape has a zero dimension (a GELU MLP
        has no rescaling), or because the family's own ``lie_basis`` has no element (the bias
        shifts of a layer without biases)."""
        return None

    @property
    def parameter(self) -> torch.Tensor:
        """The factor's group parameter (its first field after ``target``)."""
        return getattr(self, _parameter(self))

    def options(self) -> dict:
        """The factor's fields other than its parameter and ``target``."""
        skip = (_parameter(self), "target")
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in skip}

    def check(self, module: nn.Module) -> None:
        """Raise ``ValueError`` when the factor does not fit ``module`` (a :attr:`acts_on`): by
        default, when its parameter's shape is not :meth:`Factor.shape`. It checks the fit, not
        the symmetry: a factor built from values outside its group (a QK matrix that does not
        commute with RoPE's rotations, a key-bias shift on rotated coordinates) passes, and
        changes the output, which is how the book shows counterexamples."""
        expected = self.shape(module, **self.options())
        name = _parameter(self)
        actual = tuple(getattr(self, name).shape)
        if expected is not None and actual != tuple(expected):
            raise ValueError(f"{type(self).__name__}.{name} has shape {actual}, but "
                             f"{self.target or 'the module'} needs {tuple(expected)}")

    def transform(self, params: dict, module: nn.Module) -> dict:  # pragma: no cover - abstract
        """The action on ``params`` (float64, named relative to ``module``): a new dict with the
        transformed entries replaced."""
        raise NotImplementedError

    def inverse(self) -> "Factor":  # pragma: no cover - abstract
        """The inverse factor: ``f.inverse()`` undoes ``f``'s action."""
        raise NotImplementedError

    def resolve(self, model: nn.Module) -> nn.Module:
        """The submodule of ``model`` at :attr:`target`, checked to be one this factor fits."""
        try:
            module = model.get_submodule(self.target)
        except AttributeError:
            raise ValueError(f"{type(self).__name__} targets {self.target!r}, which "
                             f"{type(model).__name__} does not have: apply the element to the "
                             "model it was built for") from None
        if not isinstance(module, self.acts_on):
            kinds = self.acts_on if isinstance(self.acts_on, tuple) else (self.acts_on,)
            names = " or ".join(k.__name__ for k in kinds)
            raise TypeError(f"{type(self).__name__} acts on {names}, but "
                            f"{self.target or 'the module'} is a {type(module).__name__}")
        self.check(module)
        return module

    def act(self, module: nn.Module) -> nn.Module:
        """A transformed deep copy of ``module``: the element of this one factor acting."""
        return GaugeElement(self).act(module)

    def __matmul__(self, other: "Factor | GaugeElement") -> "GaugeElement":
        """``(f @ g).act(m) == f.act(g.act(m))`` for a factor or element ``g``, as for
        :class:`GaugeElement`."""
        if not isinstance(other, (Factor, GaugeElement)):
            return NotImplemented
        return GaugeElement(self) @ other

    def apply_(self, module: nn.Module) -> None:
        """Overwrite the parameters of ``module`` (the target itself, as :meth:`resolve` returns
        it) with the action's result, in place: computed in float64, cast back to each
        parameter's dtype."""
        named = dict(module.named_parameters())
        new = self.transform(float64_parameters(module), module)
        with torch.no_grad():
            for name, value in new.items():
                named[name].copy_(value.to(named[name].dtype))


class ContinuousFactor(Factor):
    """A factor of a Lie group: also :meth:`lie_basis` and :meth:`exp`."""

    @classmethod
    def lie_basis(cls, module: nn.Module, **options) -> torch.Tensor:
        """``[k, *shape]``: a basis of the family's Lie algebra at ``module`` (float64); by
        default every coordinate of the parameter (:func:`unit_basis` of :meth:`Factor.shape`), the
        algebra of translations and scalings. ``options`` as in :meth:`Factor.shape`."""
        return unit_basis(cls.shape(module, **options))

    @classmethod
    def exp(cls, X: torch.Tensor, *, target: str = "", **options) -> "ContinuousFactor":
        r"""The group element :math:`\exp(X)` for an algebra element ``X`` (unchecked,
        differentiable; ``options`` as in :meth:`lie_basis`)."""
        return cls.unchecked(X, target=target, **options)

    @classmethod
    def random(cls, module: nn.Module, *, scale: float = 0.3, target: str = "",
               generator: torch.Generator | None = None, **options) -> "ContinuousFactor":
        r"""A random element :math:`\exp(X)`, :math:`X = \text{scale} \sum_k z_k B_k` with
        :math:`z_k \sim N(0, 1)` over :meth:`lie_basis` at ``module`` (the submodule at
        ``target``), validated; ValueError where the family has no algebra there (a GELU MLP has
        no rescaling). Builds the basis: for layers of a size to check by hand."""
        check_number("scale", scale, low=0.0, strict=True)
        basis = cls.lie_basis(module, **options)  # (k, *shape)
        if len(basis) == 0:
            raise ValueError(f"{cls.__name__} has no Lie algebra at this "
                             f"{type(module).__name__}: nothing to draw")
        z = torch.randn(len(basis), generator=generator, dtype=DTYPE)
        X = torch.einsum("k,k...->...", scale * z.to(basis.device), basis.to(DTYPE))
        return cls(cls.exp(X, **options).parameter, target=target, **options)

    @classmethod
    def near_identity(cls, X: torch.Tensor, *, target: str = "",
                      **options) -> "ContinuousFactor":
        r"""A curve through the identity with velocity ``X`` at :math:`X = 0` (:math:`\exp(X)` up
        to second order): what :func:`tangent_map` and :func:`momentum_map` differentiate. By
        default :meth:`exp`."""
        return cls.exp(X, target=target, **options)


def _parameter(factor) -> str:
    """The name of a factor's group parameter: its first field after ``target``."""
    return next(f.name for f in dataclasses.fields(factor) if f.name != "target")


def _checked(x, name: str, ndim: int, shape_doc: str) -> torch.Tensor:
    """``x`` as a float64 tensor with ``ndim`` dimensions and finite entries; ValueError
    otherwise."""
    x = torch.as_tensor(x).detach().to(DTYPE)
    if x.ndim != ndim:
        raise ValueError(f"{name} must have shape {shape_doc}, got shape {tuple(x.shape)}")
    if not torch.isfinite(x).all():
        raise ValueError(f"{name} has non-finite entries")
    return x


class MatrixFactor(ContinuousFactor):
    r"""A factor whose parameter is a stack ``[n, d, d]`` of invertible matrices (a product of
    :math:`\GL(d)`'s): validated, inverted and exponentiated as matrices."""

    def __post_init__(self):
        name = _parameter(self)
        value = check_invertible(getattr(self, name), f"{type(self).__name__}.{name}")
        object.__setattr__(self, name, value)

    def inverse(self):
        """The inverse matrices."""
        name = _parameter(self)
        return dataclasses.replace(self, **{name: torch.linalg.inv(getattr(self, name))})

    @classmethod
    def exp(cls, X, *, target="", **options):
        r"""The matrix exponential :math:`\exp(X)` of each ``X [n, d, d]`` (unchecked,
        differentiable)."""
        return cls.unchecked(torch.linalg.matrix_exp(X), target=target, **options)

    @classmethod
    def near_identity(cls, X, *, target="", **options):
        r""":math:`I + X`: the same derivative as :math:`\exp(X)` at :math:`X = 0`, and several
        times cheaper to differentiate backwards than ``matrix_exp``."""
        eye = torch.eye(X.shape[-1], dtype=X.dtype, device=X.device)
        return cls.unchecked(eye + X, target=target, **options)


class TranslationFactor(ContinuousFactor):
    r"""A factor whose parameter :math:`t` adds (an abelian group of translations):
    :math:`\exp(X) = X`, inverse :math:`-t`, composition adds. ``ndim`` is the parameter's
    number of dimensions, ``shape_doc`` its shape in words (for messages)."""

    ndim: ClassVar[int] = 1
    shape_doc: ClassVar[str] = "[n]"

    def __post_init__(self):
        name = _parameter(self)
        value = _checked(getattr(self, name), f"{type(self).__name__}.{name}", self.ndim,
                         self.shape_doc)
        object.__setattr__(self, name, value)

    def inverse(self):
        """The opposite translation."""
        name = _parameter(self)
        return dataclasses.replace(self, **{name: -getattr(self, name)})


class ScalingFactor(ContinuousFactor):
    r"""A factor whose parameter :math:`s` multiplies entry by entry, each entry positive
    (``positive``) or only non-zero: :math:`\exp(X) = e^X` (the identity component), inverse
    :math:`1/s`, composition multiplies."""

    ndim: ClassVar[int] = 1  #: the number of dimensions of the parameter
    shape_doc: ClassVar[str] = "[n]"
    positive: ClassVar[bool] = True

    def __post_init__(self):
        name = _parameter(self)
        full = f"{type(self).__name__}.{name}"
        value = _checked(getattr(self, name), full, self.ndim, self.shape_doc)
        if self.positive and not (value > 0).all():
            raise ValueError(f"{full} must be positive and finite")
        if (value == 0).any():
            raise ValueError(f"{full} must have no zero entry")
        object.__setattr__(self, name, value)

    def inverse(self):
        """The reciprocal scalings."""
        name = _parameter(self)
        return dataclasses.replace(self, **{name: 1 / getattr(self, name)})

    @classmethod
    def exp(cls, X, *, target="", **options):
        r""":math:`e^X`, entry by entry (unchecked, differentiable)."""
        return cls.unchecked(torch.exp(X), target=target, **options)


class PermutationFactor(Factor):
    """A factor whose parameter is a permutation ``perm [n]`` (or one per row, ``[m, n]``):
    unit ``i`` of the result is unit ``perm[i]`` of the input; inverse ``argsort``."""

    def __post_init__(self):
        name = _parameter(self)
        perm = torch.as_tensor(getattr(self, name))
        if perm.ndim == 2:
            perm = torch.stack([check_permutation(row, perm.shape[1], f"{name}[{i}]")
                                for i, row in enumerate(perm)])
        else:
            perm = check_permutation(perm, name=name)
        object.__setattr__(self, name, perm)

    def inverse(self):
        """The inverse permutations."""
        name = _parameter(self)
        return dataclasses.replace(self, **{name: torch.argsort(getattr(self, name), dim=-1)})


class GaugeElement:
    """A product of factors, applied first to last: ``GaugeElement([f1, f2])`` acts as ``f2``
    after ``f1``; a single factor may be passed on its own."""

    def __init__(self, factors=()):
        self.factors = (factors,) if isinstance(factors, Factor) else tuple(factors)
        for f in self.factors:
            if not isinstance(f, Factor):
                raise TypeError(f"a gauge factor must be a Factor, got {type(f).__name__}")

    def transform(self, params: dict, model: nn.Module) -> dict:
        """The action on ``params`` (float64, named as in ``model.named_parameters()``): the
        functional form of :meth:`act`, differentiable."""
        for f in self.factors:
            module = f.resolve(model)
            prefix = f"{f.target}." if f.target else ""
            sub = {n[len(prefix):]: t for n, t in params.items() if n.startswith(prefix)}
            new = f.transform(sub, module)
            params = {**params, **{prefix + n: t for n, t in new.items()}}
        return params

    def act(self, module: nn.Module) -> nn.Module:
        """Return a transformed deep copy of ``module``."""
        out = copy.deepcopy(module)
        for f in self.factors:
            f.apply_(f.resolve(out))
        return out

    def inverse(self) -> "GaugeElement":
        """:math:`g^{-1}`: the inverse factors in reverse order, so ``g.inverse().act(g.act(m))``
        has ``m``'s parameters."""
        return GaugeElement(f.inverse() for f in reversed(self.factors))

    def __matmul__(self, other: "GaugeElement | Factor") -> "GaugeElement":
        """``(a @ b).act(m) == a.act(b.act(m))``, as functions compose (``b`` acts first)."""
        if isinstance(other, Factor):
            other = GaugeElement(other)
        if not isinstance(other, GaugeElement):
            return NotImplemented
        return GaugeElement(other.factors + self.factors)

    def __repr__(self) -> str:
        names = ", ".join(f"{type(f).__name__}({f.target!r})" if f.target else type(f).__name__
                          for f in self.factors)
        return f"GaugeElement([{names}])"


def identity() -> GaugeElement:
    """The identity element: no factors, ``identity().act(m)`` a copy of ``m``."""
    return GaugeElement()


# ----------------------------------------------------------------------------- Lie algebras

def _flat(params: dict, names) -> torch.Tensor:
    return torch.cat([params[n].reshape(-1) for n in names])


def _target(model: nn.Module, family: type[ContinuousFactor], target: str) -> nn.Module:
    """``model``'s submodule at ``target``, or a ValueError naming the family and the target;
    TypeError for a family without a Lie algebra (a permutation: discrete)."""
    if not (isinstance(family, type) and issubclass(family, ContinuousFactor)):
        raise TypeError(f"expected a continuous family (a ContinuousFactor subclass, such as "
                        f"QKTransform), got {getattr(family, '__name__', family)!r}: a discrete "
                        "family has no tangent directions")
    try:
        return model.get_submodule(target)
    except AttributeError:
        raise ValueError(f"{family.__name__}: {type(model).__name__} has no submodule "
                         f"{target!r}") from None


def tangent_map(model: nn.Module, family: type[ContinuousFactor], target: str = "",
                basis: torch.Tensor | None = None, *, trainable_only: bool = True,
                **options) -> torch.Tensor:
    r"""``T [n_params, k]``: column :math:`i` is :math:`\frac{d}{dt} \exp(t B_i) \cdot \theta` at
    :math:`t = 0` for the basis ``B [k, *shape]`` (default: ``family.lie_basis`` of the target),
    as a vector over the trainable parameters of ``model`` (``named_parameters()`` order, each
    flattened row-major, the order of :func:`gaugebook.redundancy.jacobian`; all parameters with
    ``trainable_only=False``). ``options``: the factor's other fields. Float64."""
    module = _target(model, family, target)
    basis = family.lie_basis(module, **options) if basis is None else basis
    params = float64_parameters(model, trainable_only=False)  # the action may read frozen ones
    names = list(float64_parameters(model, trainable_only=trainable_only))
    n_params = sum(params[n].numel() for n in names)
    device = next(iter(params.values())).device
    if len(basis) == 0:
        return torch.zeros(n_params, 0, dtype=DTYPE, device=device)
    basis = basis.to(device, DTYPE)

    def orbit(X):  # X [*shape] -> exp(X) . theta [n_params]
        moved = GaugeElement([family.near_identity(X, target=target, **options)]).transform(
            params, model)
        return _flat(moved, names)

    zero = torch.zeros_like(basis[0])
    return vmap(lambda B: jvp(orbit, (zero,), (B,))[1])(basis).T


def momentum_map(model: nn.Module, family: type[ContinuousFactor], momenta: dict,
                 target: str = "", shape=None, **options) -> torch.Tensor:
    r"""``mu [*shape]`` with
    :math:`\langle \mu, X \rangle = \langle p, \frac{d}{dt} \exp(tX) \cdot \theta \rangle` for
    every :math:`X` of that shape: the momentum :math:`p` (``momenta``, float64 tensors keyed like
    the target's parameters) dotted with every generator, by one reverse-mode pass through the
    action. ``shape`` is the family's parameter shape (default: :meth:`Factor.shape`, or where
    a family declares none, that of ``lie_basis``, which holds ``k`` elements of that shape: for
    :class:`~gaugebook.gauge.QKTransform` of a GPT-2-small layer, :math:`12 \cdot 64^2` of
    :math:`12 \cdot 64^2` entries); ``options``: the factor's other fields, as in
    :func:`tangent_map`."""
    module = _target(model, family, target)
    if shape is None:
        shape = family.shape(module, **options)
    if shape is None:
        shape = family.lie_basis(module, **options).shape[1:]
    with torch.inference_mode(False), torch.enable_grad():  # callable from no-grad code
        params = float64_parameters(module)
        X = torch.zeros(shape, dtype=DTYPE, device=next(iter(params.values())).device,
                        requires_grad=True)
        factor = family.near_identity(X, **options)
        factor.check(module)  # a shape that would broadcast is an error, not a shared matrix
        moved = factor.transform(params, module)
        if not moved:  # the symmetry is absent here (position centring with RoPE): mu = 0
            return torch.zeros(shape, dtype=DTYPE, device=X.device)
        missing = sorted(set(moved) - set(momenta))
        if missing:
            raise ValueError(f"{family.__name__} moves {missing}, which have no momentum")
        wrong = {n: tuple(momenta[n].shape) for n in moved
                 if momenta[n].shape != params[n].shape}
        if wrong:
            raise ValueError(f"each momentum has its parameter's shape; got {wrong} for "
                             f"{ {n: tuple(params[n].shape) for n in wrong} }")
        p = {n: t.clone() if t.is_inference() else t for n, t in momenta.items()}
        pairing = sum((p[n] * t).sum() for n, t in moved.items())
        return torch.autograd.grad(pairing, X)[0]


def project(X: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    r"""Orthogonal projection of ``X [..., *shape]`` onto the span of an orthogonal (not
    necessarily normalised) ``basis [k, *shape]``:
    :math:`\sum_i \langle X, B_i \rangle B_i / \langle B_i, B_i \rangle`; ValueError for a
    zero element, which spans nothing."""
    B = basis.to(X).flatten(1)  # (k, n)
    norms = (B * B).sum(1)  # (k,)
    if not bool((norms > 0).all()):
        zero = torch.nonzero(norms <= 0).flatten().tolist()
        raise ValueError(f"basis elements {zero} are zero; drop them (a basis spans with "
                         "nonzero elements)")
    x = X.reshape(*X.shape[:X.ndim - basis.ndim + 1], -1)  # (..., n)
    coeffs = (x @ B.T) / norms
    return (coeffs @ B).reshape(X.shape)


def unit_basis(shape) -> torch.Tensor:
    """``[prod(shape), *shape]``: every coordinate direction of a tensor of that shape, in
    row-major order (a basis of an abelian algebra of translations or scalings)."""
    shape = torch.Size(shape)
    return torch.eye(shape.numel(), dtype=DTYPE).reshape(shape.numel(), *shape)


def gl_basis(n: int) -> torch.Tensor:
    r"""``[n^2, n, n]``: the units :math:`E_{ij}` of :math:`\mathfrak{gl}(n)` in row-major order."""
    check_positive_ints(n=n)
    return unit_basis((n, n))


def rope_commutant_basis(d_head: int, rotary_dim: int, gated: bool = False) -> torch.Tensor:
    r"""An orthogonal basis ``[k, d_head, d_head]`` of the matrices that commute with every RoPE
    rotation (planes :math:`(i, i + r/2)`, :math:`r` = ``rotary_dim``; :math:`r = 0` is no RoPE).

    Per rotation plane the scaling :math:`S_i` and the rotation generator :math:`J_i` (only
    :math:`S_i` for gated RoPE, whose coordinate-wise gates forbid rotations); on the
    :math:`u = d_\text{head} - r` unrotated coordinates all of :math:`\mathfrak{gl}(u)` (its
    diagonal for gated RoPE). Dimension :math:`r + u^2`, gated :math:`r/2 + u`."""
    if rotary_dim != 0:
        check_rotary_dim(d_head, rotary_dim)
    half, basis = rotary_dim // 2, []
    for i in range(half):
        S = torch.zeros(d_head, d_head, dtype=DTYPE)
        S[i, i] = S[i + half, i + half] = 1.0
        basis.append(S)
        if not gated:
            J = torch.zeros(d_head, d_head, dtype=DTYPE)
            J[i, i + half], J[i + half, i] = 1.0, -1.0
            basis.append(J)
    rest = range(rotary_dim, d_head)
    pairs = [(i, i) for i in rest] if gated else [(i, j) for i in rest for j in rest]
    for i, j in pairs:
        E = torch.zeros(d_head, d_head, dtype=DTYPE)
        E[i, j] = 1.0
        basis.append(E)
    return torch.stack(basis) if basis else torch.zeros(0, d_head, d_head, dtype=DTYPE)


def rope_plane_breaking_basis(d_head: int, rotary_dim: int, plane: int) -> torch.Tensor:
    r"""``[2, d_head, d_head]``: the part of :math:`\mathfrak{gl}(2)` on RoPE plane
    :math:`(i, i + r/2)` (:math:`i` = ``plane``, :math:`r` = ``rotary_dim``) that the commutant
    lacks, the traceless symmetric generators :math:`E_{ii} - E_{jj}` and :math:`E_{ij} + E_{ji}`
    (:math:`j = i + r/2`).

    With the plane's rotation :math:`R(\alpha) = \cos\alpha\, I + \sin\alpha\, J` (:math:`J`
    antisymmetric, :func:`gaugebook.rope.rotation_matrix`) each such :math:`X` anticommutes with
    :math:`J`, so :math:`XR - RX = 2 \sin\alpha\, XJ` and
    :math:`\|XR - RX\|_F = 2\sqrt{2}\, |\sin\alpha|`: a symmetry of a plane that does not turn, a
    near-symmetry of one that turns little over the context (chapter 6). With
    :func:`rope_commutant_basis`'s :math:`S_i` and :math:`J_i` they span all :math:`X` supported
    on the plane."""
    half = check_rotary_dim(d_head, rotary_dim) // 2
    if type(plane) is not int or not 0 <= plane < half:
        raise ValueError(f"plane must be an integer in [0, {half}) for rotary_dim={rotary_dim}, "
                         f"got {plane!r}")
    i, j = plane, plane + half
    X = torch.zeros(2, d_head, d_head, dtype=DTYPE)
    X[0, i, i], X[0, j, j] = 1.0, -1.0
    X[1, i, j] = X[1, j, i] = 1.0
    return X


# ----------------------------------------------------------------------------- dimensions

def factor_redundancy(m: int, n: int, k: int) -> int:
    r"""Redundancy of the product map :math:`(A, B) \mapsto A B^\top`, ``A [m, k]``, ``B [n, k]``.

    Its image is the set of :math:`m \times n` matrices of rank at most :math:`r = \min(k, m, n)`,
    of dimension :math:`r (m + n - r)`; so :math:`(m + n) k - r (m + n - r)` parameter directions
    are lost. For :math:`k \le \min(m, n)` this is :math:`k^2 = \dim \GL(k)`; for :math:`k > n`
    the :math:`\GL(k)` action has a stabiliser.
    """
    if any(type(x) is not int or x < 0 for x in (m, n, k)):
        raise ValueError(f"m, n, k must be non-negative integers, got {m!r}, {n!r}, {k!r}")
    r = min(k, m, n)
    return (m + n) * k - r * (m + n - r)


def drawn_gauge(*, n_kv_heads: int, d_head: int, d_value: int, d_out: int, r_q: int,
                r_v: int) -> tuple[int, int]:
    r"""``(qk, vo)``: what fixed draws leave of the weight gauge
    :math:`\GL(d_\text{head}) \times \GL(d_\text{value})` per key/value group (learned biases not
    counted), with ``r_q``, ``r_v`` the ranks :math:`r_q`, :math:`r_v` of the query and value
    draws (of their differences when learned biases absorb a common shift):

    * QK: :math:`\{X \in \mathfrak{gl}(d_\text{head}) : b X = 0 \text{ for every draw } b\}`,
      :math:`n_{kv} (d_\text{head}^2 - d_\text{head} r_q)`.
    * VO: :math:`n_{kv} d_\text{value}^2` minus the constraints
      :math:`\sum_h u Y_{g(h)} W_O^{(h)} = 0` for each independent draw :math:`u`: the output
      shifts :math:`u W_O` summed over heads span :math:`\min(n_{kv} d_\text{value}, d_\text{out})`
      dimensions per draw, shared by all groups.

    Assumes ``d_head``, ``d_value`` at most the input dimension and no RoPE."""
    check_positive_ints(n_kv_heads=n_kv_heads, d_head=d_head, d_value=d_value, d_out=d_out)
    if not (0 <= r_q <= d_head and 0 <= r_v <= d_value):
        raise ValueError(f"the draws' ranks must lie in [0, d_head] and [0, d_value], got "
                         f"r_q={r_q}, r_v={r_v}")
    qk = n_kv_heads * (d_head * d_head - d_head * r_q)
    vo = n_kv_heads * d_value * d_value - r_v * min(n_kv_heads * d_value, d_out)
    return qk, vo


def attention_terms(*, d_in: int, d_out: int, n_kv_heads: int, group_size: int, d_head: int,
                    d_value: int, bias: bool, rope: bool | str = False,
                    rotary_dim: int | None = None,
                    draws: tuple[int, int] | None = None) -> dict[str, int]:
    r"""Redundant directions of one attention layer at generic weights, by sector:
    ``qk_gauge``, ``key_bias``, ``vo_gauge``, ``value_bias``.

    ``d_in`` is the dimension of the inputs' span (``d_model``, or ``d_model - 1`` behind a
    LayerNorm), ``d_out`` that of the outputs that matter (``d_model - 1`` when a LayerNorm reads
    them). Per key/value group of :math:`G` query heads (:math:`b = 1` with biases):

    * QK without RoPE: queries :math:`[x, 1]\, \tilde W_Q` of all :math:`G` heads against keys
      :math:`x W_K`: ``factor_redundancy(G (d_in + b), d_in, d_head)``
      (:math:`= d_\text{head}^2` when :math:`d_\text{head} \le d_\text{in}`); :math:`b_K` cancels
      in the softmax (:math:`d_\text{head}` more).
    * QK with RoPE: the commutant of the rotations, 2 per plane (1 with gated RoPE), and on the
      :math:`u = d_\text{head} - r` unrotated coordinates (:math:`r` = ``rotary_dim``) the plain
      count, :math:`b_K` cancelling there (per coordinate 1 with gated RoPE, whose gates stop
      :math:`b_K` cancelling).
    * VO: ``factor_redundancy(d_in, G d_out, d_value)`` (:math:`= d_\text{value}^2`), plus
      :math:`d_\text{value}` from :math:`b_V`, whose contribution :math:`b_V W_O` is a constant
      that :math:`b_O` absorbs.

    ``rope`` is ``False``, ``True`` or ``"gated"``; ``rotary_dim`` defaults to ``d_head`` with
    RoPE, as in :class:`~gaugebook.attention.MultiHeadAttention`, and needs RoPE. ``draws``:
    the ranks ``(r_q, r_v)`` of fixed symmetry-breaking draws (:mod:`gaugebook.breaking`), whose
    weight gauge :func:`drawn_gauge` gives in place of the QK and VO terms (no RoPE,
    :math:`d_\text{head}, d_\text{value} \le d_\text{in}` and
    :math:`d_\text{value} \le G\, d_\text{out}`, where the terms without draws are
    :math:`d_\text{head}^2` and :math:`d_\text{value}^2`); the bias terms stay, as learned
    biases still cancel or are absorbed.
    """
    check_positive_ints(d_in=d_in, d_out=d_out, n_kv_heads=n_kv_heads, group_size=group_size,
                        d_head=d_head, d_value=d_value)
    check_rope_mode(rope)
    if rope:
        rotary_dim = check_rotary_dim(d_head, d_head if rotary_dim is None else rotary_dim)
    elif rotary_dim:
        raise ValueError(f"rotary_dim={rotary_dim} needs rope=True or 'gated'")
    D, G, b = d_in, group_size, int(bias)
    u = d_head - rotary_dim if rope else d_head
    if rope == "gated":
        qk, key_bias = rotary_dim // 2 + u, 0
    else:
        qk = (rotary_dim if rope else 0) + factor_redundancy(G * (D + b), D, u)
        key_bias = b * u
    vo = factor_redundancy(D, G * d_out, d_value)
    terms = dict(qk_gauge=n_kv_heads * qk, key_bias=n_kv_heads * key_bias,
                 vo_gauge=n_kv_heads * vo, value_bias=n_kv_heads * b * d_value)
    if draws is not None:
        if rope:
            raise ValueError("the count under fixed draws covers attention without RoPE")
        if max(d_head, d_value) > D or d_value > G * d_out:
            raise ValueError(f"the count under fixed draws assumes d_head, d_value <= d_in and "
                             f"d_value <= group_size * d_out, got d_head={d_head}, "
                             f"d_value={d_value}, d_in={D}, group_size={G}, d_out={d_out}")
        if not (isinstance(draws, tuple) and len(draws) == 2
                and all(type(r) is int and r >= 0 for r in draws)):
            raise ValueError(f"draws must be a pair (r_q, r_v) of integers >= 0, got {draws!r}")
        r_q, r_v = draws
        terms["qk_gauge"], terms["vo_gauge"] = drawn_gauge(
            n_kv_heads=n_kv_heads, d_head=d_head, d_value=d_value, d_out=d_out, r_q=r_q, r_v=r_v)
    return terms
