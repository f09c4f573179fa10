r"""A top-k mixture-of-experts MLP layer and its parameter symmetries (chapter 8).

For a token ``x [D]`` the router scores the ``E`` experts and keeps the ``k`` most probable::

    l = x W_r + b_r                      # [E] router logits (b_r optional)
    p = softmax(l)                       # [E] router probabilities
    S = top-k(p)                         # the k chosen experts, most probable first
    w_j = p_j / sum_{i in S} p_i         # j in S: gate weights, renormalised over the k chosen
    y = sum_{j in S} w_j E_j(x),   E_j(x) = act(x W_in[j] + b_in[j]) W_out[j] + b_out[j]

Renormalising makes :math:`w` the softmax of the chosen logits alone (as in Mixtral). With
``renormalize=False`` the gates are the raw probabilities :math:`w_j = p_j`, the Switch
Transformer's convention (Fedus et al. 2022); with :math:`k = 1` it is the only one under which
the router gets a gradient from the output, because renormalised top-1 weights are always 1.

The load-balancing loss of Fedus et al. (2022), for :math:`N` tokens, extended to :math:`k`
choices::

    f_e = (number of tokens whose k choices include e) / (N k)      # fraction of assignments
    P_e = (1/N) sum_x p_e(x)                                         # mean router probability
    L_aux = E sum_e f_e P_e                                          # 1 when perfectly balanced

Symmetries (factors of :mod:`gaugebook.lie`: :class:`ExpertPermutation`, :class:`RouterShift`,
:class:`ExpertRescaling`, :class:`ExpertHiddenPermutation`; each function below returns a
transformed copy and leaves its input alone):

* :func:`permute_experts`: relabel experts, moving the router's columns with them (:math:`E!`).
* :func:`shift_router`: :math:`W_r \to W_r + c \mathbf{1}^\top`, :math:`b_r \to b_r + s \mathbf{1}`;
  every logit of a token moves by the same :math:`x \cdot c + s`, which the softmax, the top-k
  choice and the gates ignore.
* :func:`rescale_hidden` (ReLU experts): column :math:`j` of :math:`W_\text{in}^{(e)}` and entry
  :math:`j` of :math:`b_\text{in}^{(e)}` times :math:`a > 0`, row :math:`j` of
  :math:`W_\text{out}^{(e)}` over :math:`a`, because
  :math:`\operatorname{relu}(az) = a \operatorname{relu}(z)`.
* :func:`permute_hidden`: relabel the hidden units inside each expert.

Experts are evaluated densely (every expert on every token, then the chosen ones gathered): exact,
simple, differentiable by ``torch.func``, and fast enough at the book's sizes; it is not a
production dispatch kernel. Ties between the k-th and (k+1)-th probability, which happen with
probability zero for generic inputs, are broken by ``torch.topk``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from gaugebook.checks import (check_bool, check_float_dtype, check_integer_dtype,
                              check_positive_ints)
from gaugebook.lie import GaugeElement, PermutationFactor, ScalingFactor, TranslationFactor
from gaugebook.linalg import check_permutation

__all__ = ["MoE", "MoEOutput", "EXPERT_ACTIVATIONS", "load_balancing_loss", "permute_experts",
           "shift_router", "rescale_hidden", "permute_hidden", "redundancy_count",
           "ExpertPermutation", "RouterShift", "ExpertRescaling", "ExpertHiddenPermutation"]

# The experts' activations (GELU in its exact erf form; the GPT's MLP uses GPT-2's tanh form,
# gaugebook.gpt.ACTIVATIONS): ReLU's positive homogeneity is a symmetry, GELU has none.
EXPERT_ACTIVATIONS = {"gelu": F.gelu, "relu": F.relu}


class MoEOutput(NamedTuple):
    """What :meth:`MoE.forward` returns; ``output`` comes first, so that tools which take the first
    element of a tuple (``invariance_error``, ``redundancy``) see the layer's output."""

    output: torch.Tensor  #: [..., D]
    indices: torch.Tensor  #: [..., k] chosen experts, most probable first
    weights: torch.Tensor  #: [..., k] their gates
    probs: torch.Tensor  #: [..., E] router probabilities
    aux_loss: torch.Tensor  #: [] load-balancing loss over all tokens of the call


def load_balancing_loss(probs: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    r""":math:`E \sum_e f_e P_e` from router probabilities ``[..., E]`` and choices ``[..., k]``.

    :math:`f_e` (fraction of the :math:`N k` assignments that go to expert :math:`e`) is piecewise
    constant in the parameters and carries no gradient; :math:`P_e` (mean probability) does. The
    value is 1 when both are uniform and at most :math:`E / k`: since :math:`f_e \le 1/k` (a token
    picks an expert at most once), :math:`\sum_e f_e P_e \le 1/k`, reached when every token picks
    the same :math:`k` experts and they take all the probability. :math:`N = 0` tokens raise
    ``ValueError``.
    """
    E, k = probs.shape[-1], indices.shape[-1]
    if indices.shape[:-1] != probs.shape[:-1]:
        raise ValueError(f"indices {tuple(indices.shape)} do not match probs {tuple(probs.shape)}")
    if k > E:
        raise ValueError(f"{k} choices per token, but only {E} experts")
    check_integer_dtype("indices", indices, "expert ids")
    p = probs.reshape(-1, E)  # (N, E)
    if p.shape[0] == 0:
        raise ValueError(f"the load-balancing loss needs at least one token, got probs of shape "
                         f"{tuple(probs.shape)}")
    counts = F.one_hot(indices.reshape(-1, k), E).sum(dim=(0, 1)).to(p.dtype)  # (E,)
    f = counts / counts.sum()
    return E * (f * p.mean(dim=0)).sum()


class MoE(nn.Module):
    r"""Top-k mixture of ``n_experts`` two-layer MLP experts :math:`D \to d_\text{hidden} \to D`.

    Args:
        d_model: token width :math:`D`.
        n_experts: number of experts :math:`E`.
        d_hidden: hidden width of each expert.
        k: experts per token, :math:`1 \le k \le E`.
        activation: ``"gelu"`` (exact, erf form) or ``"relu"``.
        router_bias: add a learned router bias ``b_r [E]``.
        renormalize: gates renormalised over the k chosen experts (default) or the raw
            probabilities (Switch Transformer).
        dtype, device: of the parameters, as for ``torch.nn`` layers.
        generator: draws the initial parameters (on the CPU, then copied to ``device``).

    Parameters: ``W_r [D, E]`` (``b_r [E]``), ``W_in [E, D, d_hidden]``, ``b_in [E, d_hidden]``,
    ``W_out [E, d_hidden, D]``, ``b_out [E, D]``.
    """

    def __init__(self, d_model: int, n_experts: int, d_hidden: int, k: int, *,
                 activation: str = "gelu", router_bias: bool = False, renormalize: bool = True,
                 dtype: torch.dtype | None = None, device: torch.device | str | None = None,
                 generator: torch.Generator | None = None):
        super().__init__()
        check_positive_ints(d_model=d_model, n_experts=n_experts, d_hidden=d_hidden, k=k)
        if k > n_experts:
            raise ValueError(f"k={k} experts per token, but there are only n_experts={n_experts}")
        if activation not in EXPERT_ACTIVATIONS:
            raise ValueError(f"activation must be one of {list(EXPERT_ACTIVATIONS)}, "
                             f"got {activation!r}")
        check_bool("router_bias", router_bias)
        check_bool("renormalize", renormalize)
        check_float_dtype(dtype)
        self.d_model, self.n_experts, self.d_hidden, self.k = d_model, n_experts, d_hidden, k
        self.activation, self.renormalize = activation, renormalize

        def weight(*shape):
            return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device))

        self.W_r = weight(d_model, n_experts)
        self.b_r = weight(n_experts) if router_bias else None
        self.W_in = weight(n_experts, d_model, d_hidden)
        self.b_in = weight(n_experts, d_hidden)
        self.W_out = weight(n_experts, d_hidden, d_model)
        self.b_out = weight(n_experts, d_model)
        self.reset_parameters(generator)

    @property
    def has_router_bias(self) -> bool:
        """Whether the router has a bias ``b_r``."""
        return self.b_r is not None

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        r"""Gaussian weights with variance :math:`1/\mathrm{fan}_\text{in}`, biases uniform in
        :math:`\pm 1/\sqrt{\mathrm{fan}_\text{in}}`, as in
        :class:`~gaugebook.attention.MultiHeadAttention`: generic, with no accidental zeros."""
        fan_in = {"W_r": self.d_model, "b_r": self.d_model, "W_in": self.d_model,
                  "b_in": self.d_model, "W_out": self.d_hidden, "b_out": self.d_hidden}
        for name, param in self.named_parameters():
            scale = 1 / math.sqrt(fan_in[name])
            if name.startswith("W_"):
                value = torch.randn(param.shape, generator=generator, dtype=torch.float64) * scale
            else:
                u = torch.rand(param.shape, generator=generator, dtype=torch.float64)
                value = (2 * u - 1) * scale
            param.copy_(value)

    def extra_repr(self) -> str:
        """The sizes and options, for ``repr``."""
        return (f"d_model={self.d_model}, n_experts={self.n_experts}, d_hidden={self.d_hidden}, "
                f"k={self.k}, activation={self.activation!r}, "
                f"router_bias={self.has_router_bias}, renormalize={self.renormalize}")

    def router_logits(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., D] -> l [..., E]``."""
        if x.ndim < 1 or x.shape[-1] != self.d_model:
            raise ValueError(f"expected input of shape [..., d_model={self.d_model}], "
                             f"got {tuple(x.shape)}")
        if x.dtype != self.W_r.dtype:
            raise ValueError(f"input dtype {x.dtype} differs from the weights' {self.W_r.dtype}: "
                             f"pass x.to({self.W_r.dtype})")
        logits = x @ self.W_r  # (..., E)
        return logits + self.b_r if self.has_router_bias else logits

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Chosen experts ``[..., k]``, their gates ``[..., k]``, probabilities ``[..., E]``."""
        probs = self.router_logits(x).softmax(dim=-1)  # (..., E)
        top, indices = probs.topk(self.k, dim=-1)  # (..., k), most probable first
        weights = top / top.sum(dim=-1, keepdim=True) if self.renormalize else top
        return indices, weights, probs

    def experts(self, x: torch.Tensor) -> torch.Tensor:
        """Every expert on every token: ``x [N, D] -> [N, E, D]``."""
        hidden = torch.einsum("nd,edh->neh", x, self.W_in) + self.b_in  # (N, E, Dh)
        hidden = EXPERT_ACTIVATIONS[self.activation](hidden)
        return torch.einsum("neh,ehd->ned", hidden, self.W_out) + self.b_out  # (N, E, D)

    def forward(self, x: torch.Tensor) -> MoEOutput:
        """``x [..., D]`` -> :class:`MoEOutput` (output ``[..., D]``)."""
        indices, weights, probs = self.route(x)
        flat = x.reshape(-1, self.d_model)  # (N, D)
        chosen = self.experts(flat).gather(  # (N, k, D)
            1, indices.reshape(-1, self.k, 1).expand(-1, -1, self.d_model))
        out = (weights.reshape(-1, self.k, 1) * chosen).sum(dim=1)  # (N, D)
        return MoEOutput(out.view(x.shape), indices, weights, probs,
                         load_balancing_loss(probs, indices))


def redundancy_count(m: MoE) -> int:
    r"""Redundant directions of the layer's output at generic weights and inputs (every expert
    chosen by enough tokens, no token at a tie; every ReLU unit active on some of its expert's
    tokens and inactive on others: a unit that never switches adds directions, as in
    :func:`gaugebook.gpt_redundancy.positive_fraction`), the count that
    :func:`gaugebook.redundancy.predicted_redundancy` gives for a :class:`MoE`:

    * router: the shift ``c [D]`` (plus :math:`s` with a router bias). With :math:`k = 1` and
      renormalised gates the router only selects, so all its :math:`D E` (:math:`+ E`) parameters
      are flat.
    * ReLU experts: one positive rescaling per hidden unit, :math:`E\, d_\text{hidden}`; GELU
      experts: none.
    """
    shift = math.prod(RouterShift.shape(m))  # D + b
    router = shift * m.n_experts if m.k == 1 and m.renormalize else shift  # all of W_r, b_r
    experts = math.prod(ExpertRescaling.shape(m))  # E d_hidden with ReLU, 0 with GELU
    return router + experts


# ----------------------------------------------------------------------------- symmetries

def _check_moe(moe) -> None:
    if not isinstance(moe, MoE):
        raise TypeError(f"expected a MoE, got {type(moe).__name__}")


@dataclass(frozen=True, eq=False)
class ExpertPermutation(PermutationFactor):
    """Expert ``i`` of the result is expert ``perm[i]``; the router's columns (and bias
    entries) move with their experts."""

    perm: torch.Tensor  #: [E]
    acts_on: ClassVar = MoE

    @classmethod
    def shape(cls, moe):
        """``[n_experts]``."""
        return (moe.n_experts,)

    def transform(self, params, moe):
        """Columns of ``W_r`` and entries of ``b_r`` in the order ``perm``, and each expert's
        ``W_in, b_in, W_out, b_out`` with them."""
        perm = self.perm.to(params["W_r"].device)
        out = {"W_r": params["W_r"].index_select(-1, perm)}
        for name in ("b_r", "W_in", "b_in", "W_out", "b_out"):
            if name in params:
                x = params[name]
                out[name] = x.index_select(x.ndim - getattr(moe, name).ndim, perm)
        return out


@dataclass(frozen=True, eq=False)
class RouterShift(TranslationFactor):
    r""":math:`W_r \to W_r + c \mathbf{1}^\top` and, with a router bias, :math:`b_r \to b_r + s`:
    every logit of a token moves by :math:`x \cdot c + s`, which the softmax, the top-k choice and
    the gates ignore. ``shift = [c, s]`` (``[D + 1]``; ``[D]`` without a router bias)."""

    shift: torch.Tensor  #: [D + b]
    acts_on: ClassVar = MoE
    shape_doc: ClassVar = "[d_model + router_bias]"

    @classmethod
    def shape(cls, moe):
        """``[D + 1]`` with a router bias, ``[D]`` without."""
        return (moe.d_model + int(moe.has_router_bias),)

    def transform(self, params, moe):
        r"""``shift = [c, s]``: :math:`W_r \to W_r + c \mathbf{1}^\top`, every entry of :math:`b_r`
        plus :math:`s`."""
        shift = self.shift.to(params["W_r"].device)
        out = {"W_r": params["W_r"] + shift[:moe.d_model, None]}
        if moe.has_router_bias:
            out["b_r"] = params["b_r"] + shift[moe.d_model]
        return out


@dataclass(frozen=True, eq=False)
class ExpertRescaling(ScalingFactor):
    r"""Hidden unit :math:`j` of expert :math:`e`: in by :math:`a_{ej} > 0`, out by
    :math:`1 / a_{ej}` (:math:`\operatorname{relu}(az) = a \operatorname{relu}(z)`): a symmetry of
    ReLU experts only."""

    a: torch.Tensor  #: [E, d_hidden]
    acts_on: ClassVar = MoE
    ndim: ClassVar = 2
    shape_doc: ClassVar = "[n_experts, d_hidden]"

    @classmethod
    def shape(cls, moe):
        """``[n_experts, d_hidden]`` for ReLU experts, ``[n_experts, 0]`` otherwise."""
        return (moe.n_experts, moe.d_hidden if moe.activation == "relu" else 0)

    def check(self, moe):
        """ValueError unless the experts use ReLU; then the shape check."""
        if moe.activation != "relu":
            raise ValueError(f"rescaling hidden units is a symmetry of ReLU experts only, "
                             f"this MoE uses {moe.activation!r}")
        super().check(moe)

    def transform(self, params, moe):
        r"""Column :math:`j` of expert :math:`e`'s ``W_in`` and ``b_in[e, j]`` times
        :math:`a_{ej}`, row :math:`j` of its ``W_out`` over :math:`a_{ej}`."""
        a = self.a.to(params["W_in"].device)
        return {"W_in": params["W_in"] * a[:, None, :], "b_in": params["b_in"] * a,
                "W_out": params["W_out"] / a[:, :, None]}


@dataclass(frozen=True, eq=False)
class ExpertHiddenPermutation(PermutationFactor):
    """Relabel hidden units inside each expert: unit ``j`` of expert ``e`` in the result is unit
    ``perm[e, j]``."""

    perm: torch.Tensor  #: [E, d_hidden]
    acts_on: ClassVar = MoE

    @classmethod
    def shape(cls, moe):
        """``[n_experts, d_hidden]``: one permutation per expert."""
        return (moe.n_experts, moe.d_hidden)

    def transform(self, params, moe):
        """Per expert ``e``: columns of ``W_in``, entries of ``b_in`` and rows of ``W_out`` in the
        order ``perm[e]``."""
        perm = self.perm.to(params["W_in"].device)  # (E, Dh)
        W_in = params["W_in"]  # (..., E, D, Dh)
        index = perm[:, None, :].expand(W_in.shape[-3:])
        return {"W_in": W_in.gather(-1, index.expand(W_in.shape)),
                "b_in": params["b_in"].gather(-1, perm.expand(params["b_in"].shape)),
                "W_out": params["W_out"].gather(-2, perm[:, :, None].expand(
                    params["W_out"].shape))}


def permute_experts(moe: MoE, perm) -> MoE:
    """Expert ``i`` of the result is expert ``perm[i]`` of ``moe``
    (:class:`ExpertPermutation`); the function is unchanged."""
    _check_moe(moe)
    perm = check_permutation(perm, moe.n_experts, "perm")
    return GaugeElement([ExpertPermutation(perm)]).act(moe)


def shift_router(moe: MoE, c, s: float = 0.0) -> MoE:
    r""":math:`W_r \to W_r + c \mathbf{1}^\top` (``c [D]``) and, with a router bias,
    :math:`b_r \to b_r + s` (:class:`RouterShift`)."""
    _check_moe(moe)
    c = torch.as_tensor(c, dtype=torch.float64)
    if c.shape != (moe.d_model,):
        raise ValueError(f"c must have shape [d_model={moe.d_model}], got {tuple(c.shape)}")
    if s != 0.0 and not moe.has_router_bias:
        raise ValueError("a bias shift s needs a MoE with router_bias=True")
    shift = torch.cat([c, torch.tensor([float(s)], dtype=torch.float64)]) \
        if moe.has_router_bias else c
    return GaugeElement([RouterShift(shift)]).act(moe)


def rescale_hidden(moe: MoE, a) -> MoE:
    """Scale hidden unit :math:`j` of expert :math:`e` by :math:`a_{ej} > 0` (``a[e, j]``) on the
    way in and by :math:`1 / a_{ej}` on the way out (:class:`ExpertRescaling`): a symmetry of ReLU
    experts only."""
    _check_moe(moe)
    return GaugeElement([ExpertRescaling(a)]).act(moe)


def permute_hidden(moe: MoE, perm) -> MoE:
    """Relabel hidden units inside each expert: ``perm [E, d_hidden]``, one permutation per
    expert (unit ``j`` of expert ``e`` in the result is unit ``perm[e, j]`` of ``moe``;
    :class:`ExpertHiddenPermutation`)."""
    _check_moe(moe)
    perm = torch.as_tensor(perm)  # its dtype as given: the factor refuses float indices
    if perm.shape != (moe.n_experts, moe.d_hidden):
        raise ValueError(f"perm must have shape [n_experts, d_hidden] = "
                         f"[{moe.n_experts}, {moe.d_hidden}], got {tuple(perm.shape)}")
    return GaugeElement([ExpertHiddenPermutation(perm)]).act(moe)
