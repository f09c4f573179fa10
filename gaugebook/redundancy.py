r"""Redundant parameter directions: measured by Jacobian rank, predicted by the gauge group.

At parameters :math:`\theta` a direction :math:`\delta` is *redundant* (to first order) when it
does not change the function :math:`f(x; \theta)` on the probe inputs: :math:`J \delta = 0` with
:math:`J = \partial f(x; \theta) / \partial \theta`. The number of such directions is
:math:`n_\text{params} - \rank J`. At generic weights and with enough generic inputs it equals
the dimension of the gauge orbit through :math:`\theta` (chapter 6).

Tolerance: a singular value counts as zero when it is at most ``rtol`` times the largest,
:math:`s_{\max}`, with ``rtol`` :math:`= \max(m, n)\, \epsilon` for :math:`J` of shape
:math:`m \times n` and :math:`\epsilon` the float64 machine epsilon (the convention of
``numpy.linalg.matrix_rank``). The ratio ``gap`` :math:`= s_r / s_{r+1}` of the last kept to
the first dropped singular value (:math:`r` the rank) is reported: where the dropped values are
round-off it is large (:math:`10^{12}` to :math:`10^{13}` for one attention layer,
:math:`10^{8}` or more for a small GPT in this book); a gap near 1 means the count is not
trustworthy.
"""
from __future__ import annotations

import copy
import functools
import warnings
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, jacfwd, jacrev

from gaugebook import gpt_redundancy
from gaugebook.attention import MultiHeadAttention, math_attention
from gaugebook.checks import check_finite_tensors
from gaugebook.breaking import ShiftedAttention
from gaugebook.breaking import redundancy_count as shifted_redundancy_count
from gaugebook.lie import attention_terms, factor_redundancy
from gaugebook.linalg import numerical_rank
from gaugebook.moe import MoE
from gaugebook.moe import redundancy_count as moe_redundancy_count

__all__ = ["Redundancy", "redundancy", "predicted_redundancy", "jacobian", "FlatModel",
           "parameter_function",
           "factor_redundancy"]


@dataclass(frozen=True)
class Redundancy:
    """Result of :func:`redundancy`.

    Attributes:
        n_params: the number of trainable parameters, the columns of the Jacobian ``J``.
        rank: the numerical rank of ``J`` (:func:`gaugebook.linalg.numerical_rank`).
        dimension: ``n_params - rank``, the number of redundant directions.
        singular_values: those of ``J``, descending, float64.
        tolerance: the largest singular value counted as zero.
        gap: ``s_rank / s_{rank+1}``, the last kept over the first dropped singular value
            (infinite when none is dropped); near 1, the count is not trustworthy.
    """

    n_params: int
    rank: int
    dimension: int
    singular_values: torch.Tensor  # descending, float64
    tolerance: float
    gap: float

    def __str__(self) -> str:
        return (f"{self.n_params} parameters, Jacobian rank {self.rank}, redundant dimension "
                f"{self.dimension} (spectral gap {self.gap:.2g})")


class FlatModel:
    """A float64 copy of ``model`` called as a function of the flat vector ``theta`` of all its
    trainable parameters (``named_parameters()`` order): ``flat(theta) = model(*inputs)``.

    The model is deep-copied (the original stays untouched) and put in eval mode: the function is
    the model in eval mode, deterministic (no dropout, symmetry-breaking biases at their means).
    Floating-point inputs are cast to float64. ``theta`` holds the current parameters.
    ValueError for a non-finite parameter, buffer or input.
    """

    def __init__(self, model: nn.Module, *inputs):
        check_finite_tensors(model, *inputs)  # a NaN weight can hide behind finite outputs
        self.model = copy.deepcopy(model).double().eval()
        self.inputs = tuple(x.double() if torch.is_tensor(x) and x.is_floating_point() else x
                            for x in inputs)
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError(f"{type(model).__name__} has no trainable parameters")
        self.names = [n for n, _ in named]
        self.shapes = [p.shape for _, p in named]
        self.sizes = [p.numel() for _, p in named]
        self.theta = torch.cat([p.detach().reshape(-1) for _, p in named])

    def unflatten(self, theta: torch.Tensor) -> dict[str, torch.Tensor]:
        """Split ``theta [..., n_params]`` into named tensors ``[..., *shape]`` (leading
        dimensions batch several vectors)."""
        if theta.shape[-1:] != self.theta.shape:
            raise ValueError(f"expected vectors of length {self.theta.numel()}, "
                             f"got shape {tuple(theta.shape)}")
        batch = theta.shape[:-1]
        return {n: c.reshape(*batch, *s)
                for n, c, s in zip(self.names, theta.split(self.sizes, dim=-1), self.shapes)}

    def flatten(self, params: dict[str, torch.Tensor]) -> torch.Tensor:
        """Inverse of :meth:`unflatten`."""
        batch = params[self.names[0]].shape[:params[self.names[0]].ndim - len(self.shapes[0])]
        return torch.cat([params[n].reshape(*batch, -1) for n in self.names], dim=-1)

    def __call__(self, theta: torch.Tensor):
        return functional_call(self.model, self.unflatten(theta), self.inputs)


def parameter_function(model: nn.Module, *inputs):
    """``(f, theta)``: the model's output on ``inputs`` as a function ``f(theta) -> [n_outputs]`` of
    the flat vector of all trainable parameters (in ``named_parameters()`` order), and the current
    ``theta`` [n_params]; both in float64 (a float64 copy of the model in eval mode; the model
    itself stays untouched). For a tuple output the first element is used."""
    flat = FlatModel(model, *inputs)

    def output(theta):  # [n_params] -> [n_outputs]
        y = flat(theta)
        return (y[0] if isinstance(y, tuple) else y).reshape(-1)

    return output, flat.theta


def jacobian(model: nn.Module, *inputs) -> torch.Tensor:
    """``J [n_outputs, n_params]`` of ``model(*inputs)`` (first element of a tuple) with respect to
    all trainable parameters, in float64, by ``torch.func`` (forward or reverse mode, whichever
    needs fewer passes)."""
    output, flat = parameter_function(model, *inputs)
    with torch.no_grad():
        n_out = output(flat).numel()
    jac = jacfwd if flat.numel() <= n_out else jacrev
    with math_attention():
        return jac(output)(flat)


def redundancy(model: nn.Module, *inputs, rtol: float | None = None) -> Redundancy:
    """Numerical rank of the Jacobian of ``model(*inputs)`` with respect to its parameters.

    Measures the model in eval mode whatever mode it is in (a float64 copy, as
    :class:`FlatModel`; ``model`` stays untouched): symmetry-breaking biases at their means, the
    function that :func:`predicted_redundancy` counts. Use enough generic inputs that the output
    count exceeds the expected rank: a warning says when the rank is capped by the number of
    outputs, or when there are fewer outputs than the rank that :func:`predicted_redundancy`
    expects (where it has a count for ``model``; a GPT's logits are low-rank, so its rank can
    stay below the output count and still be capped). ``rtol``: see
    :func:`gaugebook.linalg.numerical_rank`. Non-finite weights or inputs are refused.

    The count equals :func:`predicted_redundancy` at generic weights only. A fresh
    :class:`~gaugebook.gpt.GPT` is not generic: GPT-2's initialisation sets every LayerNorm gain
    to 1 and every bias to 0, a point of extra symmetry where more directions are redundant
    (e.g. 250 instead of 218 for ``GPTConfig(11, 8, 1, 2, 8)``). Draw generic weights first with
    :func:`gaugebook.gpt_redundancy.make_generic_` (``make_generic_(GPT(cfg))``).
    """
    J = jacobian(model, *inputs)
    n_out, n_params = J.shape
    s = torch.linalg.svdvals(J)
    rank, tol, gap = numerical_rank(s, J.shape, rtol)
    try:
        expected = n_params - predicted_redundancy(model)
    except (TypeError, ValueError):  # no count for this module, or options the count refuses
        expected = 0
    if rank == n_out < n_params or n_out < expected:
        why = (f"the theory expects rank {expected}" if n_out < expected
               else "the rank cannot exceed the outputs")
        warnings.warn(f"{n_out} outputs for a Jacobian of rank {rank} ({why}): use more or "
                      "longer inputs to probe the function fully", stacklevel=2)
    return Redundancy(n_params, rank, n_params - rank, s, tol, gap)


@functools.singledispatch
def predicted_redundancy(model: nn.Module) -> int:
    r"""The gauge theory's count of redundant directions of ``model`` at generic weights.

    Every model type the library defines: :class:`~gaugebook.attention.MultiHeadAttention`
    (:func:`gaugebook.lie.attention_terms` with ``d_in = d_out = d_model``; assumes
    :math:`d_\text{model} \ge 2` and, with RoPE, inputs longer than :math:`d_\text{head}` tokens),
    :class:`~gaugebook.moe.MoE`, attention under fixed bias draws
    (:class:`~gaugebook.breaking.ShiftedAttention`, :func:`gaugebook.breaking.redundancy_count`)
    and a GPT, one of its blocks or its log-probabilities
    (:func:`gaugebook.gpt_redundancy.redundancy_count`). Nothing needs importing first: the
    library registers nothing. A module of one's own gets a count with
    ``@predicted_redundancy.register`` (a ``functools.singledispatch`` function).

    Generic weights: :func:`redundancy` measures more at special points, such as GPT-2's
    initialisation (LayerNorm gains 1, biases 0); :func:`gaugebook.gpt_redundancy.make_generic_`
    draws weights at which the two agree.
    """
    if isinstance(model, MultiHeadAttention):
        return sum(attention_terms(d_in=model.d_model, d_out=model.d_model,
                                   n_kv_heads=model.n_kv_heads, group_size=model.group_size,
                                   d_head=model.d_head, d_value=model.d_value,
                                   bias=model.has_bias, rope=model.rope,
                                   rotary_dim=model.rotary_dim).values())
    if isinstance(model, MoE):
        return moe_redundancy_count(model)
    if isinstance(model, ShiftedAttention):
        return shifted_redundancy_count(model)
    if isinstance(model, gpt_redundancy.COUNTED):
        return gpt_redundancy.redundancy_count(model)
    raise TypeError(f"no redundancy prediction for {type(model).__name__}")
