r"""The Noether charge of one attention head under a query bias (chapter 14): a precomputed grid
of Hamiltonian trajectories, an ipywidgets explorer that looks results up in it, and its static
fallback figure.

The system is a single head ``f_theta(x; b)`` (:class:`~gaugebook.attention.MultiHeadAttention`,
float64, no learned biases) fitted to random targets, ``L(theta) = mean |f_theta(x; b) - y|^2 / 2``,
moved by leapfrog on ``H = |p|^2/2 + L``. Without a query shift ``b``, the charge
``J = antisym(W_Q^T P_Q + W_K^T P_K)`` of the rotations ``W_Q -> W_Q R``, ``W_K -> W_K R`` is
conserved. A fixed shift leaves only the rotations with ``b R = b``, whose charge is ``P J P``,
``P = I - b^T b / |b|^2``. A shift redrawn every step, as in the symmetry-breaking protocol
(:mod:`gaugebook.breaking`), leaves none.

Shifts follow the protocol scaled by two factors: ``b_k = scale * mu + spread * sigma * z_k`` with
``mu = 0.5`` in every coordinate, ``sigma = linspace(0.05, 0.15, d_head)`` and ``z_k ~ N(0, I)``
(one draw per step, the same draws for every grid point). ``scale = spread = 1`` is the protocol.

A widget reacts only while a kernel runs; the explorer's ``static()`` (it is a
:class:`~gaugebook.interactive.StaticTwin`) switches the precomputed readouts in the rendered book,
and :func:`charge_drift_figure` draws the whole grid as one static figure.
"""
from __future__ import annotations

from dataclasses import dataclass

import ipywidgets as widgets
import torch
from matplotlib.figure import Figure
from torch.func import functional_call, grad, vmap

from gaugebook.attention import MultiHeadAttention, math_attention
from gaugebook.breaking import query_distribution
from gaugebook.interactive import Control, StaticExplorer, StaticTwin
from gaugebook.landscapes import leapfrog
from gaugebook.linalg import DTYPE
from gaugebook.mechanics import qk_charge
from gaugebook.plots import PALETTE

__all__ = ["HeadProblem", "probe_head", "protocol_shifts", "stabiliser_projection",
           "ChargeDriftGrid", "charge_drift_grid", "charge_drift_figure", "ChargeDriftExplorer"]

CONSERVED = 1e-10  # relative changes below this are round-off


@dataclass
class HeadProblem:
    """Regression with one attention head: ``L(theta) = mean |f_theta(x; b) - y|^2 / 2``.

    ``theta`` is a list of tensors aligned with ``names`` (``W_Q, W_K, W_V, W_O``); ``x``, ``y``
    are ``[B, T, d_model]``; ``p0`` are initial momenta shaped like ``theta``.
    """

    model: MultiHeadAttention
    x: torch.Tensor
    y: torch.Tensor
    p0: list[torch.Tensor]

    def __post_init__(self):
        m = self.model
        if not isinstance(m, MultiHeadAttention) or m.n_heads != 1 or m.has_bias or m.rope:
            raise ValueError("HeadProblem needs a MultiHeadAttention with one head, no learned "
                             "biases and no RoPE")
        self.names = [n for n, _ in m.named_parameters()]

    def parameters(self) -> list[torch.Tensor]:
        """The head's current weights (float64 copies)."""
        return [p.detach().to(DTYPE).clone() for p in self.model.parameters()]

    def loss(self, theta, query_shift=None) -> torch.Tensor:
        """Half the mean squared error of the layer at parameters ``theta`` (a tuple in ``names``
        order), with an optional fixed ``query_shift``."""
        out = functional_call(self.model, dict(zip(self.names, theta)), (self.x,),
                              {"query_shift": query_shift})  # (B, T, D)
        return 0.5 * ((out - self.y) ** 2).mean()

    def grad(self, theta, query_shift=None) -> list[torch.Tensor]:
        """``grad L`` at ``theta`` (list of tensors), with query shift ``[d_head]`` or ``None``."""
        leaves = [t.detach().requires_grad_(True) for t in theta]
        return list(torch.autograd.grad(self.loss(leaves, query_shift), leaves))

    def batched_grad(self, theta, query_shifts: torch.Tensor) -> list[torch.Tensor]:
        """``grad L`` for a batch of ``n`` parameter sets (each tensor ``[n, ...]``), the ``i``-th
        with ``query_shifts[i]`` (``[n, d_head]``), by ``torch.func.vmap``."""
        g = vmap(grad(lambda th, b: self.loss(th, b)))
        with math_attention():
            return list(g(list(theta), query_shifts))

    def charge(self, theta, p) -> torch.Tensor:
        """``J_QK [..., d_head, d_head]`` of parameters and momenta (lists aligned with
        ``names``; leading batch dimensions allowed)."""
        i, j = self.names.index("W_Q"), self.names.index("W_K")
        return qk_charge(theta[i][..., 0, :, :], theta[j][..., 0, :, :],
                         p[i][..., 0, :, :], p[j][..., 0, :, :])


def probe_head(*, d_model: int = 6, d_head: int = 4, batch: int = 4, length: int = 8,
               momentum_scale: float = 0.5, seed: int = 0) -> HeadProblem:
    """A :class:`HeadProblem` drawn from ``seed``: weights, inputs, targets and momenta
    ``p0 ~ N(0, momentum_scale^2)``."""
    g = torch.Generator().manual_seed(seed)
    model = MultiHeadAttention(d_model, 1, d_head, dtype=DTYPE, generator=g)
    x = torch.randn(batch, length, d_model, generator=g, dtype=DTYPE)  # (B, T, D)
    y = torch.randn(batch, length, d_model, generator=g, dtype=DTYPE)
    p0 = [momentum_scale * torch.randn(p.shape, generator=g, dtype=DTYPE)
          for p in model.parameters()]
    return HeadProblem(model, x, y, p0)


def protocol_shifts(d_head: int, steps: int, *, scale: float = 1.0, spread: float = 1.0,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """Query shifts ``[steps, d_head]``: ``scale * mu + spread * sigma * z_k`` with the
    protocol's ``(mu, sigma)`` (:func:`~gaugebook.breaking.query_distribution`) and
    ``z_k ~ N(0, I)``."""
    if scale < 0 or spread < 0:
        raise ValueError(f"scale and spread must be non-negative, got {scale}, {spread}")
    mu, sigma = query_distribution(d_head, DTYPE)
    z = torch.randn(steps, d_head, generator=generator, dtype=DTYPE)
    return scale * mu + spread * sigma * z  # (steps, dk)


def stabiliser_projection(b: torch.Tensor) -> torch.Tensor:
    """``P = I - b^T b / |b|^2`` for ``b [..., d]`` (``I`` where ``b = 0``): ``P J P`` is the charge
    of the rotations that fix ``b``."""
    norm2 = (b * b).sum(-1, keepdim=True)[..., None]  # (..., 1, 1)
    outer = b[..., :, None] * b[..., None, :]
    eye = torch.eye(b.shape[-1], dtype=b.dtype, device=b.device)
    return eye - torch.where(norm2 > 0, outer / norm2.clamp_min(1e-300), torch.zeros_like(outer))


@dataclass(frozen=True)
class ChargeDriftGrid:
    r"""Relative changes over one leapfrog trajectory per ``(scale, spread)``: ``J``
    (:math:`\|J_{QK}(T) - J_{QK}(0)\| / \|J_{QK}(0)\|`), ``PJP`` (the same for
    :math:`\Pi_b J_{QK} \Pi_b`, :math:`\Pi_b` the projector away from the mean shift) and
    ``weights`` (``|theta(T) - theta(0)| / |theta(0)|``), each ``[len(scales), len(spreads)]``;
    ``time = h * steps``."""

    scales: tuple[float, ...]
    spreads: tuple[float, ...]
    J: torch.Tensor
    PJP: torch.Tensor
    weights: torch.Tensor
    time: float

    def lookup(self, scale: float, spread: float) -> dict[str, float]:
        """The three relative changes at a grid point."""
        for name, value, axis in (("scale", scale, self.scales), ("spread", spread, self.spreads)):
            if value not in axis:
                raise ValueError(f"{name}={value} is not on the grid {axis}")
        i, j = self.scales.index(scale), self.spreads.index(spread)
        return {"J": self.J[i, j].item(), "PJP": self.PJP[i, j].item(),
                "weights": self.weights[i, j].item()}


def charge_drift_grid(problem: HeadProblem | None = None, scales=(0.0, 0.5, 1.0, 2.0),
                      spreads=(0.0, 0.5, 1.0, 2.0), *, h: float = 0.05, steps: int = 200,
                      seed: int = 0) -> ChargeDriftGrid:
    """Leapfrog every ``(scale, spread)`` of the grid from ``problem``'s weights and momenta
    (:func:`probe_head` by default), all trajectories at once (``vmap``), with the shifts of
    :func:`protocol_shifts` (draws from ``seed``, shared by the grid points)."""
    problem = probe_head() if problem is None else problem
    scales, spreads = tuple(float(s) for s in scales), tuple(float(s) for s in spreads)
    if not scales or not spreads:
        raise ValueError("the grid needs at least one scale and one spread")
    dk, n = problem.model.d_head, len(scales) * len(spreads)
    unit = protocol_shifts(dk, steps, scale=0.0, spread=1.0,
                           generator=torch.Generator().manual_seed(seed))  # sigma * z_k
    mu = protocol_shifts(dk, 1, scale=1.0, spread=0.0,  # the mean (its own generator: the
                         generator=torch.Generator().manual_seed(seed))[0]  # global one untouched)
    S = torch.tensor(scales, dtype=DTYPE).repeat_interleave(len(spreads))  # (n,)
    W = torch.tensor(spreads, dtype=DTYPE).repeat(len(scales))  # (n,)
    shifts = S[None, :, None] * mu + W[None, :, None] * unit[:, None, :]  # (steps, n, dk)
    theta0 = [t.expand(n, *t.shape).clone() for t in problem.parameters()]
    p0 = [p.expand(n, *p.shape).clone() for p in problem.p0]
    theta, p = leapfrog(theta0, p0, lambda th, k: problem.batched_grad(th, shifts[k]), h, steps)
    J0, J1 = problem.charge(theta0, p0), problem.charge(theta, p)  # (n, dk, dk)
    P = stabiliser_projection(S[:, None] * mu)  # (n, dk, dk)
    norm = torch.linalg.matrix_norm
    flat0 = torch.cat([t.reshape(n, -1) for t in theta0], 1)
    flat1 = torch.cat([t.reshape(n, -1) for t in theta], 1)
    shape = (len(scales), len(spreads))
    return ChargeDriftGrid(
        scales, spreads,
        J=(norm(J1 - J0) / norm(J0)).reshape(shape),
        PJP=(norm(P @ (J1 - J0) @ P) / norm(P @ J0 @ P)).reshape(shape),
        weights=((flat1 - flat0).norm(dim=1) / flat0.norm(dim=1)).reshape(shape),
        time=h * steps)


def charge_drift_figure(grid: ChargeDriftGrid) -> Figure:
    """Static fallback of :class:`ChargeDriftExplorer`: relative change of ``J`` and ``P J P``
    against the scale of a fixed shift (``spread = 0``, left) and against the spread of a
    redrawn one (at ``scale = 1`` if on the grid, else the largest scale; right). Log scale,
    values floored at ``1e-17``; the dotted line marks the round-off threshold ``1e-10``."""
    # at most 8 in wide, so that the page does not shrink its text much
    fig = Figure(figsize=(7.8, 4.0), layout="constrained")
    left, right = fig.subplots(1, 2, sharey=True)
    floor = 1e-17
    if 0.0 in grid.spreads:
        j = grid.spreads.index(0.0)
        for key, colour, marker, label in (("J", PALETTE[3], "o", "full charge $J_{QK}$"),
                                           ("PJP", PALETTE[0], "s",
                                            r"$\Pi_b J_{QK} \Pi_b$ (fixes $\bar b$)")):
            left.semilogy(grid.scales, getattr(grid, key)[:, j].clamp_min(floor), marker + "-",
                          color=colour, label=label)
        left.set(xlabel=r"scale of a fixed shift $b = s\,\mu$" "\n"
                        r"($\mu = 0.5$ per coordinate)",
                 ylabel=f"relative change after time {grid.time:g}")
        left.legend(fontsize=9)
    i = grid.scales.index(1.0) if 1.0 in grid.scales else len(grid.scales) - 1
    for key, colour, marker, label in (("J", PALETTE[3], "o", "full charge $J_{QK}$"),
                                       ("PJP", PALETTE[0], "s", r"$\Pi_b J_{QK} \Pi_b$")):
        right.semilogy(grid.spreads, getattr(grid, key)[i, :].clamp_min(floor), marker + "-",
                       color=colour, label=label)
    right.set(xlabel=f"spread of redrawn shifts\n(scale {grid.scales[i]:g}; 1 = protocol)")
    right.axhline(CONSERVED, color="0.4", ls=":", lw=1)
    left.axhline(CONSERVED, color="0.4", ls=":", lw=1)
    right.legend(fontsize=9)
    return fig


def _verdict(x: float) -> str:
    return "conserved (round-off)" if x < CONSERVED else "not conserved"


class ChargeDriftExplorer(StaticTwin, widgets.VBox):
    """Sliders for the scale of the mean query shift and the spread of its per-step redraws; the
    readout shows, from a precomputed :class:`ChargeDriftGrid`, how much the charge ``J`` and
    its stabiliser part ``P J P`` changed along the trajectory, and how far the weights moved.

    Attributes ``scale``, ``spread`` (``SelectionSlider``) and ``readout`` (``HTML``).
    """

    def __init__(self, grid: ChargeDriftGrid | None = None, *, scale: float = 1.0,
                 spread: float = 0.0):
        self.grid = charge_drift_grid() if grid is None else grid
        self.grid.lookup(scale, spread)  # validates the starting point
        self.scale = widgets.SelectionSlider(options=list(self.grid.scales), value=scale,
                                             description="scale of b", continuous_update=False)
        self.spread = widgets.SelectionSlider(options=list(self.grid.spreads), value=spread,
                                              description="spread", continuous_update=False)
        self.readout = widgets.HTML()
        super().__init__([widgets.HBox([self.scale, self.spread]), self.readout])
        self.scale.observe(self._update, names="value")
        self.spread.observe(self._update, names="value")
        self._update()

    def _update(self, change=None) -> None:
        self.readout.value = self.readout_html(self.scale.value, self.spread.value)

    def static(self) -> StaticExplorer:
        """The readout at every (scale, spread) of the grid (no kernel needed)."""
        return StaticExplorer(
            [Control("scale of b", self.grid.scales, value=self.scale.value,
                     labels=[f"{s:g}" for s in self.grid.scales]),
             Control("spread", self.grid.spreads, value=self.spread.value,
                     labels=[f"{w:g}" for w in self.grid.spreads])],
            self.readout_html,
            alt="Relative change of the charge J_QK and of its stabiliser part "
                "Pi_b J_QK Pi_b along a "
                "leapfrog trajectory, for a chosen scale and spread of the query shift.")

    def readout_html(self, s: float, w: float) -> str:
        """The readout at scale ``s`` and spread ``w``, looked up in the grid."""
        r = self.grid.lookup(s, w)
        kind = ("no shift" if s == 0 and w == 0 else "a fixed shift" if w == 0
                else "a shift redrawn every step")
        return (
            f"<b>scale {s:g}, spread {w:g}</b> ({kind}), leapfrog for time {self.grid.time:g}: "
            f"the weights moved by <b>{r['weights']:.0%}</b>.<br>"
            f"Full charge <i>J</i><sub>QK</sub>: relative change <b>{r['J']:.1e}</b>, "
            f"{_verdict(r['J'])}.<br>"
            "Stabiliser part <i>&Pi;<sub>b</sub> J<sub>QK</sub> &Pi;<sub>b</sub></i>: "
            f"relative change <b>{r['PJP']:.1e}</b>, {_verdict(r['PJP'])}.")
