r"""Breaking the attention gauge with unlearned, resampled biases (Silverstein, Kunin, Shyam 2026).

The protocol adds fixed-distribution biases to the queries and values of every attention layer:

.. math::

    q &= x W_Q + b_Q, \quad b_Q \sim \mathcal{N}(0.5, \operatorname{diag}(\sigma^2)), \quad
    \sigma = \operatorname{linspace}(0.05, 0.15, d_\text{head}), \\
    v &= x W_V + b_V, \quad b_V \sim \mathcal{N}(\mu_V, 0.05^2 I), \quad \mu_V \in \{0, 0.5\}.

The biases are buffers, not parameters: nothing learns them. In training mode each layer draws
one :math:`b_Q` ``[d_head]`` (and :math:`b_V` ``[d_value]``) per forward pass, shared by all
heads of the layer; in eval mode the means are used.

Why unlearned and resampled? With :math:`W_Q \to W_Q M`, :math:`W_K \to W_K M^{-\top}` the
scores change by :math:`b_Q (M^{-1} - I) W_K^\top x^\top` unless :math:`b_Q M = b_Q`:

* a fixed :math:`b_Q` leaves only its stabiliser :math:`\{M : b_Q M = b_Q\}` (dimension
  :math:`d_\text{head}^2 - d_\text{head}`);
* draws :math:`b_Q^{(1)}, \dots, b_Q^{(n)}` that span :math:`\R^{d_\text{head}}` leave nothing of
  :math:`\GL(d_\text{head})`;
* a *learned* bias :math:`c_Q` next to the fixed one absorbs a single draw
  (:math:`c_Q \to (c_Q + b_Q) M - b_Q`), so only differences between draws break the symmetry.

:class:`ShiftedAttention` evaluates one attention layer under a fixed list of draws, so that
:func:`gaugebook.redundancy.redundancy` can measure these counts and :func:`redundancy_count`
(which :func:`gaugebook.redundancy.predicted_redundancy` calls) can predict them.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from gaugebook.attention import MultiHeadAttention
from gaugebook.checks import check_positive_ints
from gaugebook.lie import attention_terms
from gaugebook.linalg import numerical_rank

__all__ = ["BREAKING_MODES", "QUERY_MEAN", "QUERY_STD", "VALUE_STD", "query_distribution",
           "SymmetryBreakingBias", "ShiftedAttention", "check_breaking",
           "redundancy_count"]

BREAKING_MODES = (None, "bq", "bqv")
QUERY_MEAN = 0.5
QUERY_STD = (0.05, 0.15)  # linear from the first to the last coordinate of a head
VALUE_STD = 0.05


def check_breaking(mode, mu_v, *, name: str = "mode") -> None:
    """ValueError unless ``mode`` is one of ``BREAKING_MODES`` and ``mu_v`` a finite number,
    nonzero only with ``"bqv"`` (the mean of the value bias); ``name``: what the caller calls
    ``mode``."""
    if mode not in BREAKING_MODES:
        raise ValueError(f"{name} must be one of {BREAKING_MODES}, got {mode!r}")
    if not isinstance(mu_v, (int, float)) or isinstance(mu_v, bool) or not math.isfinite(mu_v):
        raise ValueError(f"mu_v must be a finite number, got {mu_v!r}")
    if mu_v != 0.0 and mode != "bqv":
        raise ValueError(f"mu_v={mu_v} has no effect: it is the mean of the value bias, which "
                         f"only {name}='bqv' adds (got {mode!r})")


def query_distribution(d_head: int, dtype: torch.dtype | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The protocol's query bias :math:`b_Q \sim \mathcal N(\mu_Q, \operatorname{diag}
    (\sigma_Q^2))` as ``(mean, std)``, each ``[d_head]`` (``dtype``: torch's default): the mean
    ``QUERY_MEAN`` in every coordinate, the standard deviation linear from the first to the last
    of ``QUERY_STD``."""
    return (torch.full((d_head,), QUERY_MEAN, dtype=dtype),
            torch.linspace(*QUERY_STD, d_head, dtype=dtype))


class SymmetryBreakingBias(nn.Module):
    """The unlearned query (and value) bias of one attention layer.

    ``forward()`` returns ``(query_shift [d_head], value_shift [d_value] or None)``, to be passed
    to :meth:`~gaugebook.attention.MultiHeadAttention.forward`; the shapes broadcast over heads,
    so all heads of the layer share the draw. Sampling uses ``torch.randn`` on the buffers'
    device and dtype (no Python randomness), which ``torch.compile`` traces without a graph
    break; :meth:`sample` draws from an explicit generator (the trainer's, outside the compiled
    model).

    Args:
        d_head: query/key head width, a positive integer.
        d_value: value head width, a positive integer.
        mode: ``"bq"`` (query bias only) or ``"bqv"`` (query and value biases).
        mu_v: mean of the value bias (the paper uses 0 or 0.5), finite; 0 with ``"bq"``.
    """

    def __init__(self, d_head: int, d_value: int, mode: str, *, mu_v: float = 0.0):
        super().__init__()
        if mode not in BREAKING_MODES[1:]:
            raise ValueError(f"mode must be one of {BREAKING_MODES[1:]}, got {mode!r}")
        check_breaking(mode, mu_v)
        check_positive_ints(d_head=d_head, d_value=d_value)
        self.mode, self.mu_v = mode, mu_v
        q_mean, q_std = query_distribution(d_head)
        self.register_buffer("q_mean", q_mean)
        self.register_buffer("q_std", q_std)
        if mode == "bqv":
            self.register_buffer("v_mean", torch.full((d_value,), float(mu_v)))
            self.register_buffer("v_std", torch.full((d_value,), VALUE_STD))

    def extra_repr(self) -> str:
        """The mode and sizes, for ``repr``."""
        return f"mode={self.mode!r}, d_head={self.q_mean.numel()}, mu_v={self.mu_v}"

    def sample(self, generator: torch.Generator | None = None):
        """One draw :math:`(b_Q, b_V)`, ``b_Q [d_head]`` and ``b_V [d_value]`` or ``None``, from
        ``generator`` (default: torch's global generator on the buffers' device)."""
        def normal(mean, std):
            z = torch.randn(mean.shape, generator=generator, dtype=mean.dtype, device=mean.device)
            return mean + std * z

        query = normal(self.q_mean, self.q_std)  # (dk,)
        return query, (normal(self.v_mean, self.v_std) if self.mode == "bqv" else None)  # (dv,)

    def forward(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:math:`(b_Q, b_V)`, ``b_V`` ``None`` in ``"bq"`` mode: a fresh draw in training
        mode, the means in eval mode."""
        if not self.training:  # inference uses the means
            return self.q_mean, (self.v_mean if self.mode == "bqv" else None)
        return self.sample()


class ShiftedAttention(nn.Module):
    """One attention layer evaluated under ``n`` fixed bias draws, outputs stacked.

    ``forward(x [B, T, D]) -> [n, B, T, D]`` with row ``i`` equal to
    ``attn(x, query_shift=query_shifts[i], value_shift=value_shifts[i])``: the function that ``n``
    training batches with their own draws see. Its parameters are those of ``attn``; the draws are
    buffers.

    Args:
        attn: the attention layer (its learned biases, if any, stay learned).
        query_shifts: ``[n, d_head]`` or ``None``.
        value_shifts: ``[n, d_value]`` or ``None``.
    """

    def __init__(self, attn: MultiHeadAttention, query_shifts: torch.Tensor | None = None,
                 value_shifts: torch.Tensor | None = None):
        super().__init__()
        if not isinstance(attn, MultiHeadAttention):
            raise TypeError(f"ShiftedAttention wraps a MultiHeadAttention, got "
                            f"{type(attn).__name__}")
        counts = set()
        for name, shifts, width in (("query_shifts", query_shifts, attn.d_head),
                                    ("value_shifts", value_shifts, attn.d_value)):
            if shifts is None:
                continue
            if not isinstance(shifts, torch.Tensor):
                raise TypeError(f"{name} must be a tensor [n_draws, {width}], got "
                                f"{type(shifts).__name__}")
            if shifts.ndim != 2 or shifts.shape[1] != width or shifts.shape[0] == 0:
                raise ValueError(f"{name} must have shape [n_draws, {width}] with n_draws >= 1, "
                                 f"got {tuple(shifts.shape)}")
            counts.add(shifts.shape[0])
        if not counts:
            raise ValueError("give query_shifts, value_shifts or both")
        if len(counts) > 1:
            raise ValueError(f"query_shifts and value_shifts have different numbers of draws: "
                             f"{query_shifts.shape[0]} and {value_shifts.shape[0]}")
        self.attn, self.n_draws = attn, counts.pop()
        self.register_buffer("query_shifts", query_shifts)
        self.register_buffer("value_shifts", value_shifts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, T, d_model]`` -> ``[n_draws, B, T, d_model]``: the layer under each fixed
        draw."""
        def shift(shifts, i):
            return None if shifts is None else shifts[i]

        return torch.stack([self.attn(x, query_shift=shift(self.query_shifts, i),
                                      value_shift=shift(self.value_shifts, i))
                            for i in range(self.n_draws)])  # (n, B, T, D)


def _draw_rank(shifts: torch.Tensor | None, absorbed: bool) -> int:
    """Rank of the draws, or of their differences when a learned bias absorbs a common shift."""
    if shifts is None:
        return 0
    shifts = shifts.detach().double()
    if absorbed:
        shifts = shifts[1:] - shifts[:1]
    return numerical_rank(torch.linalg.svdvals(shifts), shifts.shape)[0]


def redundancy_count(m: ShiftedAttention) -> int:
    r"""Redundancy of attention under fixed draws (no RoPE,
    :math:`d_\text{head}, d_\text{value} \le d_\text{model}`).

    :func:`~gaugebook.lie.attention_terms` with ``d_in = d_out = d_model`` and the draws' ranks:
    ``r_q`` of the query draws (of their differences when the layer has learned biases), ``r_v``
    likewise for the value draws (:func:`~gaugebook.lie.drawn_gauge`), plus per key/value group
    :math:`d_\text{head}` from a learned :math:`b_K` (it still cancels) and
    :math:`d_\text{value}` from a learned :math:`b_V` (absorbed by :math:`b_O`).
    """
    a = m.attn
    if a.rope:
        raise ValueError("the prediction for ShiftedAttention covers attention without RoPE")
    if max(a.d_head, a.d_value) > a.d_model:
        raise ValueError(f"the prediction assumes d_head, d_value <= d_model, got d_head="
                         f"{a.d_head}, d_value={a.d_value}, d_model={a.d_model}")
    draws = (_draw_rank(m.query_shifts, a.has_bias), _draw_rank(m.value_shifts, a.has_bias))
    return sum(attention_terms(d_in=a.d_model, d_out=a.d_model, n_kv_heads=a.n_kv_heads,
                               group_size=a.group_size, d_head=a.d_head, d_value=a.d_value,
                               bias=a.has_bias, draws=draws).values())
