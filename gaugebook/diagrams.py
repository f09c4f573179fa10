"""Schematic diagrams of the book, drawn by code so that they regenerate with the book.

Each public function draws one diagram and returns a :class:`matplotlib.figure.Figure` (not
registered with pyplot, so nothing stays open). The symbols are those of the chapter that shows
the diagram: rows are vectors, queries are :math:`xW_Q`, the QK gauge acts as
:math:`W_Q \\to W_QM`, :math:`W_K \\to W_KM^{-\\top}` and the VO gauge as
:math:`W_V \\to W_VN`, :math:`W_O \\to N^{-1}W_O`.
"""
from __future__ import annotations

import math

import numpy as np
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Circle, Ellipse, FancyArrowPatch, FancyBboxPatch

from gaugebook.plots import PALETTE, text_colour

BLUE, ORANGE, GREEN, RED, PINK, SKY = PALETTE[:6]
GREY = "0.35"


# --------------------------------------------------------------------------- drawing helpers
def _canvas(width: float = 6.4, height: float = 4.0, xlim=(0, 10), ylim=(0, 6.25)):
    """A figure with one frameless axes in data units (10 wide by default, aspect kept)."""
    fig = Figure(figsize=(width, height))
    ax = fig.add_axes((0.01, 0.01, 0.98, 0.98))
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.set_aspect("equal")
    ax.axis("off")
    return fig, ax


def _box(ax, x, y, text, color=BLUE, w=1.7, h=0.7, size=10, fill=0.15):
    """A rounded box centred at ``(x, y)`` with ``text`` inside."""
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.05",
                                fc=_tint(color, fill), ec=color, lw=1.3))
    ax.text(x, y, text, ha="center", va="center", fontsize=size)


def _arrow(ax, start, end, color=GREY, rad=0.0, lw=1.3, style="-|>", ls="-"):
    """An arrow from ``start`` to ``end`` (bent by ``rad``)."""
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=12, color=color,
                                 lw=lw, ls=ls, connectionstyle=f"arc3,rad={rad}",
                                 shrinkA=2, shrinkB=2))


def _label(ax, x, y, text, color="black", size=9, **kw):
    """A text label (centred unless told otherwise) in ``color`` darkened to text contrast,
    4.5:1 on white (:func:`~gaugebook.plots.text_colour`; boxes and lines keep the colour)."""
    kw = {"ha": "center", "va": "center", **kw}
    ax.text(x, y, text, color=text_colour(color), fontsize=size, **kw)


def _tint(color, amount):
    """``color`` mixed with white: ``amount`` = 1 is the colour, 0 is white."""
    return tuple(1 - amount * (1 - c) for c in to_rgb(color))


def _chain(ax, items, y, xs, color=BLUE, w=1.7, h=0.7, size=10):
    """Boxes ``items`` at heights ``y`` and abscissae ``xs``, joined left to right by arrows."""
    for x, text in zip(xs, items):
        _box(ax, x, y, text, color, w=w, h=h, size=size)
    for a, b in zip(xs[:-1], xs[1:]):
        _arrow(ax, (a + w / 2, y), (b - w / 2, y))


def _curve(ax, xs, ys, color=BLUE, lw=2.0, **kw):
    """A polyline (an orbit, a fibre, a path)."""
    ax.plot(xs, ys, color=color, lw=lw, solid_capstyle="round", **kw)


# ------------------------------------------------------------------------------- Part I
def orbit_diagram() -> Figure:
    """An orbit :math:`G\\cdot\\theta` in parameter space :math:`\\Theta`, mapped to one function.

    Every point of the orbit computes the same :math:`f(X;\\theta)`; a step of the same length off
    the orbit computes a different function (chapter 1)."""
    fig, ax = _canvas()
    ax.add_patch(Ellipse((3.0, 3.1), 5.6, 5.0, fc=_tint(BLUE, 0.06), ec=BLUE, lw=1))
    _label(ax, 0.3, 5.95, r"parameter space $\Theta$", BLUE, 10, ha="left")
    s = np.linspace(-1.05, 1.0, 100)
    _curve(ax, 3.0 + 1.9 * np.sin(s), 3.1 + 1.6 * s - 0.6 * s**2, ORANGE)
    _label(ax, 3.3, 4.7, r"orbit $G\cdot\theta$", ORANGE, 10)
    # theta + delta: a step off the orbit, on the side of the boxes, well clear of the curve
    theta, off = (3.0, 3.1), (3.75, 2.2)
    gtheta = (3.0 + 1.9 * math.sin(0.35), 3.1 + 1.6 * 0.35 - 0.6 * 0.35**2)
    for p, t, dx in ((theta, r"$\theta$", -0.35), (gtheta, r"$g\cdot\theta$", 0.55),
                     (off, r"$\theta+\delta$", -0.1)):
        ax.plot(*p, "o", color="black", ms=5)
        _label(ax, p[0] + dx, p[1] - 0.35, t, size=10)
    _box(ax, 8.3, 4.2, r"$f(X;\theta) = f(X;g\cdot\theta)$", GREEN, w=2.8, size=9)
    _box(ax, 8.3, 1.8, r"$f(X;\theta+\delta)$: another function", RED, w=2.8, size=9)
    _arrow(ax, theta, (6.85, 4.1), GREEN, rad=-0.15)
    _arrow(ax, gtheta, (6.85, 4.3), GREEN, rad=-0.1)
    _arrow(ax, off, (6.85, 1.8), RED, rad=0.1)
    _label(ax, 8.3, 5.1, r"functions $X \mapsto f(X;\cdot)$", GREEN, 10)
    return fig


def head_wiring_diagram() -> Figure:
    """One attention head and where the gauge acts: :math:`M` on :math:`W_Q`,
    :math:`M^{-\\top}` on :math:`W_K` (the scores :math:`XW_QM\\,M^{-1}W_K^\\top X^\\top` keep),
    :math:`N` on :math:`W_V`, :math:`N^{-1}` on :math:`W_O` (the OV circuit keeps)."""
    fig, ax = _canvas()
    _box(ax, 0.9, 3.1, r"$X$", GREY, w=1.0)
    rows = ((5.2, r"$W_Q$", r"$\cdot M$", BLUE), (3.1, r"$W_K$", r"$\cdot M^{-\top}$", BLUE),
            (1.0, r"$W_V$", r"$\cdot N$", ORANGE))
    for y, name, act, color in rows:
        _box(ax, 3.0, y, name, color, w=1.1)
        _arrow(ax, (1.4, 3.1), (2.45, y))
        _label(ax, 3.0, y + 0.62, act, color, 10)
    _box(ax, 5.4, 4.15, r"softmax$(QK^\top/\sqrt{d_k})$", BLUE, w=2.6, size=9)
    _arrow(ax, (3.55, 5.2), (4.3, 4.5))
    _arrow(ax, (3.55, 3.1), (4.3, 3.8))
    _box(ax, 7.2, 2.3, r"$A\,XW_V$", GREY, w=1.2)
    _arrow(ax, (5.4, 3.75), (6.9, 2.65))
    _arrow(ax, (3.55, 1.0), (6.6, 2.15))
    _box(ax, 7.2, 0.75, r"$W_O$", ORANGE, w=1.1)
    _label(ax, 6.1, 0.75, r"$N^{-1}\cdot$", ORANGE, 10)
    _arrow(ax, (7.2, 1.95), (7.2, 1.1))
    _box(ax, 9.2, 2.3, "output", GREY, w=1.2, size=9)
    _arrow(ax, (7.75, 0.95), (9.0, 1.95), rad=0.3)
    _label(ax, 6.6, 5.6, r"QK circuit $W_Q M\,(W_K M^{-\top})^\top = W_Q W_K^\top$", BLUE)
    _label(ax, 5.2, 0.15, r"OV circuit $(W_V N)(N^{-1} W_O) = W_V W_O$", ORANGE)
    return fig


def semidirect_product_diagram(n_heads: int = 3) -> Figure:
    """:math:`(\\GL(d_k)^H \\times \\GL(d_v)^H) \\rtimes S_H`: one :math:`M_i` and one :math:`N_i`
    per head slot, and a permutation :math:`\\pi` that moves whole heads between slots,
    carrying their factors with them (chapter 3)."""
    fig, ax = _canvas()
    xs = np.linspace(2.0, 8.0, n_heads)
    for i, x in enumerate(xs):  # heads numbered from 0, as in the code and chapter 3
        ax.add_patch(FancyBboxPatch((x - 1.0, 1.5), 2.0, 2.6, boxstyle="round,pad=0.05",
                                    fc="none", ec=GREY, lw=1, ls="--"))
        _label(ax, x, 3.85, f"head {i}", GREY, 10)
        _box(ax, x, 3.2, rf"$M_{i} \in \mathrm{{GL}}(d_k)$", BLUE, w=1.8, size=9)
        _box(ax, x, 2.2, rf"$N_{i} \in \mathrm{{GL}}(d_v)$", ORANGE, w=1.8, size=9)
    for a, b, rad, y in ((0, 1, 0.3, 1.4), (1, 2, 0.3, 1.4), (2, 0, 0.1, 4.25)):
        _arrow(ax, (xs[a] + 0.2, y), (xs[b] - 0.2, y), GREEN, rad=rad)
    _label(ax, 5.0, 0.6, r"$\pi \in S_H$ moves all four blocks of a head, and its $M$, $N$",
           GREEN, 9)
    _label(ax, 5.0, 5.7, r"$\mathcal{G}_{\max} = (\mathrm{GL}(d_k)^H \times \mathrm{GL}(d_v)^H)"
           r" \rtimes S_H$", size=12)
    _label(ax, 5.0, 0.15, r"conjugating by $\pi$ relabels the factors: slot $i$ gets"
           r" $M_{\pi(i)}$, $N_{\pi(i)}$", size=9)
    return fig


def tangent_space_diagram() -> Figure:
    """The maximality check at one point: the orbit's tangent space :math:`T_\\theta` (spanned
    by the generators' directions) lies in the null space of the Jacobian :math:`J`; equal
    dimensions mean no direction leaves the function unchanged other than the orbit's
    (chapter 4)."""
    fig, ax = _canvas()
    s = np.linspace(-1.3, 1.3, 100)
    _curve(ax, 3.0 + 2.2 * s, 3.0 + 0.9 * s**2 - 0.2 * s, ORANGE)
    _label(ax, 3.6, 5.0, r"orbit $\mathcal{G}\cdot\theta$", ORANGE, 10)
    ax.plot(3.0, 3.0, "o", color="black", ms=5)
    _label(ax, 3.0, 2.55, r"$\theta$", size=11)
    _curve(ax, [0.6, 5.4], [3.22, 2.78], BLUE, lw=1.5, ls="--")
    # below the tangent line: above it, the orbit would run through the label
    _label(ax, 0.5, 2.4,
           r"$T_\theta(\mathcal{G}\cdot\theta)$" "\n" r"= span of $X_k\cdot\theta$",
           BLUE, 9, ha="left")
    _arrow(ax, (3.0, 3.0), (4.4, 2.87), BLUE, lw=2)
    _box(ax, 8.0, 4.4, r"$\ker J(\theta)$: directions with" "\n" r"$J\,\delta\theta = 0$",
         GREEN, w=3.2, h=1.1, size=9)
    _box(ax, 8.0, 2.4, r"always $T_\theta \subseteq \ker J$" "\n"
         r"measured: $\dim \ker J = \dim T_\theta$", GREY, w=3.2, h=1.1, size=9)
    _arrow(ax, (8.0, 3.8), (8.0, 3.0))
    _label(ax, 5.0, 0.6, "equal dimensions: locally, every direction that keeps the function\n"
           "is a gauge direction (evidence for maximality, not a proof)", size=9)
    return fig


def rope_commutant_diagram(n_planes: int = 3) -> Figure:
    """RoPE's planes: plane :math:`i` pairs coordinates :math:`i` and :math:`i + r/2` and turns
    by :math:`t\\theta_i` at position :math:`t`. What commutes with every rotation is a scaling
    and a rotation of each plane, :math:`\\rho_i R(\\varphi_i)`: :math:`\\GL(1,\\mathbb{C})` per
    plane, dimension 2 (for distinct frequencies, none a multiple of :math:`\\pi`; chapter 5)."""
    fig, ax = _canvas()
    xs = np.linspace(1.8, 8.2, n_planes)
    for i, x in enumerate(xs):
        ax.add_patch(Circle((x, 3.7), 1.0, fc=_tint(BLUE, 0.08), ec=BLUE, lw=1))
        angle = 0.5 + 0.9 * (n_planes - 1 - i)  # theta_i falls with i: plane 0 turns most
        ax.plot([x, x + math.cos(0.3)], [3.7, 3.7 + math.sin(0.3)], color=GREY, lw=1)
        _arrow(ax, (x, 3.7), (x + math.cos(0.3 + angle), 3.7 + math.sin(0.3 + angle)), BLUE,
               lw=1.8)
        pair = f"{i}+r/2" if i else "r/2"
        _label(ax, x, 5.05, rf"plane {i}: $(x_{{{i}}}, x_{{{pair}}})$", BLUE, 9)
        _label(ax, x + 0.45, 3.15, rf"$t\theta_{i}$", BLUE, 9)  # inside the circle
        _box(ax, x, 1.65, rf"$\rho_{i} R(\varphi_{i})$", GREEN, w=1.6, size=10)
        _arrow(ax, (x, 2.6), (x, 2.05), GREEN)
    _label(ax, 5.0, 5.75, r"RoPE: $q_t \to q_t R_t$, plane $i$ turns by $t\,\theta_i$,"
           r" $\theta_i = \mathrm{base}^{-2i/r}$", size=10)
    _label(ax, 5.0, 0.55, r"commutant: $M R_\tau = R_\tau M$ for all $\tau$ $\Rightarrow$"
           r" $\mathrm{GL}(1,\mathbb{C})^{d_k/2}$, dimension $d_k$ (not $\mathrm{O}(d_k)$)",
           GREEN, 9)
    return fig


def redundancy_terms_diagram(terms: dict[str, int], title: str) -> Figure:
    """The redundant dimensions of a model, term by term, as one bar per non-zero term
    (``terms`` from :func:`gaugebook.gpt_redundancy.redundancy_terms`), with its share."""
    fig = Figure(figsize=(6.4, 4.0))
    ax = fig.add_axes((0.28, 0.14, 0.62, 0.76))
    names = sorted((n for n in terms if terms[n] > 0), key=terms.get)
    total = sum(terms.values())
    values = [terms[n] for n in names]
    ax.barh(range(len(names)), values, color=[PALETTE[i % 6] for i in range(len(names))])
    ax.set_yticks(range(len(names)), names, fontsize=9)
    ax.set_xscale("log")
    ax.set_xlim(0.8, max(values) * 30)
    for i, v in enumerate(values):
        ax.text(v * 1.15, i, f"{v:,} ({v / total:.1%})", va="center", fontsize=9)
    ax.set_xlabel("redundant directions (log scale)")
    ax.set_title(f"{title}: {total:,} in all", fontsize=10)
    ax.grid(False)
    return fig


def gqa_diagram(n_heads: int = 6, n_kv_heads: int = 2) -> Figure:
    """Grouped-query attention: query head :math:`i` reads key/value head
    :math:`\\lfloor i/g \\rfloor`; one :math:`M_j` and one :math:`N_j` per group :math:`j`
    act on the group's shared :math:`W_K, W_V` and on all its :math:`W_Q, W_O` (chapter 7)."""
    fig, ax = _canvas()
    g = n_heads // n_kv_heads
    qx = np.linspace(1.0, 9.0, n_heads)
    kx = [qx[j * g:(j + 1) * g].mean() for j in range(n_kv_heads)]
    for j, x in enumerate(kx):
        lo, hi = qx[j * g] - 0.7, qx[(j + 1) * g - 1] + 0.7
        ax.add_patch(FancyBboxPatch((lo, 0.6), hi - lo, 3.75, boxstyle="round,pad=0.05",
                                    fc=_tint(PALETTE[j % 6], 0.06), ec=PALETTE[j % 6], lw=1))
        _box(ax, x, 1.4, rf"$W_K^{{({j})}}, W_V^{{({j})}}$", PALETTE[j % 6], w=1.9, size=9)
        _label(ax, x, 0.25, rf"group {j}: one $M_{j}$, one $N_{j}$", PALETTE[j % 6], 9)
    for i, x in enumerate(qx):
        j = i // g
        _box(ax, x, 3.7, rf"$W_Q^{{({i})}}$" "\n" rf"$W_O^{{({i})}}$", PALETTE[j % 6],
             w=1.0, h=1.0, size=9)
        _arrow(ax, (x, 3.15), (kx[j], 1.8), PALETTE[j % 6], lw=1)
    _label(ax, 5.0, 5.85, rf"$H = {n_heads}$ query heads, $n_{{kv}} = {n_kv_heads}$ groups"
           rf" of $g = {g}$", size=10)
    _label(ax, 5.0, 5.15, r"$W_Q^{(i)} \to W_Q^{(i)} M_j$, $W_K^{(j)} \to W_K^{(j)}M_j^{-\top}$,"
           r" $W_V^{(j)} \to W_V^{(j)} N_j$, $W_O^{(i)} \to N_j^{-1}W_O^{(i)}$", size=9)
    return fig


def moe_diagram(n_experts: int = 4) -> Figure:
    """A mixture-of-experts layer: the router :math:`W_r` scores the experts, the top
    :math:`k` contribute with gates :math:`w_j`. A relabelling :math:`\\sigma` of the experts
    is a symmetry only together with the same relabelling of the router's columns (chapter 8)."""
    fig, ax = _canvas()
    _box(ax, 0.8, 3.1, r"$x$", GREY, w=0.8)
    _box(ax, 2.7, 5.0, r"router $\ell = xW_r + b_r$", BLUE, w=2.9, size=9)
    _box(ax, 2.7, 3.9, r"$p = \mathrm{softmax}(\ell)$, top $k$", BLUE, w=2.9, size=9)
    _arrow(ax, (1.0, 3.5), (1.6, 4.65))
    _arrow(ax, (2.7, 4.65), (2.7, 4.25))
    ys = np.linspace(0.7, 3.2, n_experts)
    for j, y in enumerate(ys[::-1], start=1):
        _box(ax, 5.6, y, rf"expert $E_{j}$", ORANGE, w=1.6, size=9)
        _arrow(ax, (1.2, 3.0), (4.8, y), GREY, lw=0.8)
        _arrow(ax, (6.4, y), (8.0, 2.0), GREY, lw=0.8)
    _arrow(ax, (4.15, 3.9), (7.9, 2.5), BLUE, rad=-0.2, ls="--")
    _label(ax, 6.8, 4.5, r"gates $w_j$, $j \in S$", BLUE, 9)
    _box(ax, 8.8, 2.0, r"$\sum_{j\in S} w_j E_j(x)$", GREEN, w=2.0, size=9)
    _label(ax, 5.0, 5.95, r"symmetry: $E_j \to E_{\sigma(j)}$ together with column $j$ of"
           r" $W_r$ (and $b_r$) $\to$ column $\sigma(j)$: $E!$ elements", GREEN, 9)
    return fig


def sharpness_orbit_diagram() -> Figure:
    """The loss is constant along the orbit :math:`M = N = \\alpha I`, but its Hessian changes
    by a congruence, :math:`\\nabla^2\\mathcal L(\\mathcal A\\theta) = \\mathcal A^{-\\top}
    \\nabla^2\\mathcal L(\\theta)\\mathcal A^{-1}`: the local curvature (drawn as an ellipse)
    differs from point to point (chapter 9)."""
    fig, ax = _canvas()
    s = np.linspace(0.3, 3.2, 100)
    _curve(ax, 1.0 + 2.6 * s, 1.2 + 3.4 / (1 + s), ORANGE)
    _label(ax, 8.9, 1.65, r"orbit, $\mathcal{L}$ constant", ORANGE, 9)
    shapes = ((0.45, 1.9, -1.25), (0.9, 0.9, -0.8), (1.9, 0.45, 0.8))  # width, height, label
    for a, (w, h, dy) in zip((0.5, 1.0, 2.0), shapes):
        x, y = 1.0 + 2.6 * a * 1.2, 1.2 + 3.4 / (1 + a * 1.2)
        ax.add_patch(Ellipse((x, y), w, h, angle=30, fc=_tint(BLUE, 0.15), ec=BLUE, lw=1))
        ax.plot(x, y, "o", color="black", ms=4)
        _label(ax, x, y + dy, rf"$\alpha = {a:g}$", size=10)
    _label(ax, 5.0, 5.7, r"$M = N = \alpha I$: $W_Q, W_V$ times $\alpha$, $W_K, W_O$ over"
           r" $\alpha$", size=10)
    _label(ax, 5.0, 5.1, r"$\nabla^2\mathcal{L}(\mathcal{A}\theta) = \mathcal{A}^{-\top}\,"
           r"\nabla^2\mathcal{L}(\theta)\,\mathcal{A}^{-1}$: same function, different curvature",
           BLUE, 9)
    return fig


def quotient_diagram() -> Figure:
    """Parameter space :math:`\\Theta` fibred by orbits, the quotient
    :math:`\\Theta/\\mathcal G` (one point per orbit) and the map to functions
    :math:`\\mathcal F`: one-to-one exactly when every fibre is a single orbit (chapter 10)."""
    fig, ax = _canvas()
    ax.add_patch(FancyBboxPatch((0.5, 2.4), 5.5, 3.3, boxstyle="round,pad=0.05",
                                fc=_tint(BLUE, 0.06), ec=BLUE, lw=1))
    _label(ax, 0.7, 5.4, r"$\Theta$", BLUE, 12, ha="left")
    xs = np.linspace(1.3, 5.3, 5)
    t = np.linspace(0, 1, 50)
    for i, x in enumerate(xs):
        _curve(ax, x + 0.3 * np.sin(3 * t + i), 2.7 + 2.6 * t, ORANGE, lw=1.6)
        ax.plot(x + 0.3 * math.sin(i), 2.7, "o", color="black", ms=0)
        _arrow(ax, (x + 0.3 * math.sin(1.5 + i), 2.5), (x, 1.45), GREY, lw=0.8)
        ax.plot(x, 1.2, "o", color=GREEN, ms=6)
    _label(ax, 6.35, 4.4, r"fibres = orbits $\mathcal{G}\cdot\theta$", ORANGE, 9, ha="left")
    _curve(ax, [0.8, 5.8], [1.2, 1.2], GREEN, lw=1.5)
    _label(ax, 3.3, 0.6, r"$\Theta/\mathcal{G}$: one point per orbit", GREEN, 9)
    _box(ax, 8.4, 1.2, r"$\mathcal{F}$", RED, w=1.0)
    _arrow(ax, (5.9, 1.2), (7.85, 1.2), RED)
    _label(ax, 6.9, 1.6, r"$\theta \mapsto f_\theta$", RED, 9)
    _label(ax, 8.0, 2.9, r"$\dim\Theta - \dim(\mathcal{G}\cdot\theta)$" "\n"
           r"$= \operatorname{rank} J$ when the fibre" "\n" r"is the orbit", size=9)
    return fig


def connections_diagram() -> Figure:
    """The gauge orbit and the three theories of chapter 11 (NTK, spectral norms, information
    bottleneck), each with what is and is not invariant along the orbit."""
    fig, ax = _canvas()
    _box(ax, 5.0, 3.1, "gauge orbit\n" r"$\mathcal{G}\cdot\theta$", ORANGE, w=2.1, h=1.0)
    spokes = ((1.9, 5.3, "NTK\n" r"$K$ changes under $\mathrm{GL}$," "\n"
               "not under orthogonal $g$", BLUE),
              (8.1, 5.3, "spectral norms\n" r"$\|W_Q\|$ changes," "\n"
               r"$\|W_QW_K^\top\|$ does not", GREEN),
              (5.0, 0.75, "information bottleneck\nthe source's formula is not\n"
               "well defined as written", RED))
    for x, y, text, color in spokes:
        _box(ax, x, y, text, color, w=3.3, h=1.2, size=9)
        _arrow(ax, (5.0 + 0.5 * (x - 5.0) / 3.1, 3.1 + 0.5 * (y - 3.1) / 2.3),
               (x - 0.55 * (x - 5.0) / 3.1 * 1.6, y - 0.6 * (y - 3.1) / 2.3), color)
    # a note on the orbit itself: beside its box, joined to it by a dotted line
    _label(ax, 6.6, 3.1, "one gradient step\ndepends on the point\nof the orbit", GREY, 9,
           ha="left")
    ax.plot([6.05, 6.5], [3.1, 3.1], ls=":", lw=1.3, color=GREY)
    return fig


def experiment_pipeline_diagram() -> Figure:
    """Chapter 12's check of the source's 12.1: train a GPT, transform every attention layer by
    a random gauge element of condition number :math:`\\kappa`, and compare the outputs in
    float64 and float32."""
    fig, ax = _canvas()
    xs = [1.3, 3.8, 6.3, 8.8]
    _chain(ax, ["train a GPT\n(AdamW)", "trained\n" r"$\theta$",
                r"$g\cdot\theta$ in every" "\n" "attention layer", "output change\n"
                r"$\max|f'-f|/\max|f|$"], 4.2, xs, BLUE, w=2.1, h=1.1, size=9)
    _box(ax, 3.8, 2.0, "random $g$,\ncondition $\\kappa$", ORANGE, w=2.1, h=1.1, size=9)
    _arrow(ax, (4.85, 2.3), (5.6, 3.65), ORANGE)
    _box(ax, 8.8, 2.0, "float64 and float32,\nagainst $\\kappa$", GREEN, w=2.1, h=1.1, size=9)
    _arrow(ax, (8.8, 3.65), (8.8, 2.55))
    _label(ax, 5.0, 0.6, r"same pipeline for GPT-2 small; the source's $\leq 10^{-12}$ "
           "is measured against $\\kappa$ and the precision", size=9)
    return fig


def group_map_diagram() -> Figure:
    """One-page map of Part I: each factor of the symmetry group, the architecture that has
    it, its dimension (or order, for a discrete factor) and the book's verdict on the source
    (confirmed, corrected, missing in the source, outside the group, open), with the chapters
    that hold the evidence."""
    rows = [(r"QK: $M_i \in \mathrm{GL}(d_k)$," "\n" r"$W_QM$, $W_KM^{-\top}$", "MHA",
             r"$H\,d_k^2$", r"corrected: $W_KM^{-\top}$," "\n" r"not $W_KM$ (ch. 2-3)"),
            (r"VO: $N_i \in \mathrm{GL}(d_v)$," "\n" r"$W_VN$, $N^{-1}W_O$", "MHA",
             r"$H\,d_v^2$", "confirmed (ch. 3-4)"),
            (r"head permutations $S_H$", "MHA", r"$H!$ elements",
             "confirmed; whole heads move\n(ch. 3, 10)"),
            (r"translations $b_K + t$, $b_V + t$", "biases", r"$H(d_k + d_v)$",
             "missing in the source (ch. 3)"),
            (r"RoPE commutant $\rho_i R(\varphi_i)$", "RoPE", r"$H\,d_k$ (QK)",
             "corrected: commutant,\n" r"not $\mathrm{O}(d_k)$ (ch. 5)"),
            (r"one $M_j$, $N_j$ per KV group", "GQA, MQA", r"$n_{kv}(d_k^2 + d_v^2)$",
             "corrected: one $M_j$ per KV group;\n"
             r"$S_g \wr S_{n_{kv}}$ (ch. 7)"),
            ("experts with\nrouter columns", "MoE", r"$E!$ elements",
             "corrected: router columns\nmove too (ch. 8)"),
            ("LayerNorm gains,\ncentring, ...", "GPT block", "term by term",
             "corrected: with readers, not\n"
             r"$\gamma, \beta$ alone (ch. 6)"),
            ("residual-feature and\nMLP-unit permutations", "GPT",
             "$D!\\,((4D)!)^L$\nelements",
             "outside $\\mathcal{G}_{\\max}$; used to\nalign models (ch. 9)"),
            ("completeness (maximality)", "MHA", "-", "open; checked locally\n(ch. 4, 10)")]
    row_in, width = 0.42, 6.4  # inches per row, figure width
    fig = Figure(figsize=(width, row_in * (len(rows) + 1)))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.axis("off")
    ax.set(xlim=(0, 1), ylim=(len(rows) + 0.5, -0.5))  # one unit per row, the header at 0
    cols = (0.015, 0.31, 0.46, 0.62)
    for x, text in zip(cols, ("factor", "architecture", "dimension", "verdict")):
        ax.text(x, 0, text, fontsize=9, weight="bold", va="center")
    for r, row in enumerate(rows, start=1):
        ax.add_patch(FancyBboxPatch((0.005, r - 0.45), 0.99, 0.9, boxstyle="square,pad=0",
                                    fc=_tint(PALETTE[(r - 1) % 6], 0.12), ec="none"))
        for x, text in zip(cols, row):
            ax.text(x, r, text, fontsize=9, va="center", linespacing=1.1)
    return fig


# ------------------------------------------------------------------------------- Part II
def noether_charge_diagram() -> Figure:
    r"""Two flows, two conserved quantities (chapter 14). Gradient flow conserves
    :math:`W_Q^\top W_Q - W_K^\top W_K` (the scalings' charge: the flow stays on a
    hyperbola); Hamiltonian dynamics conserves only the rotations' charge, the angular
    momentum :math:`J_{QK}` of :math:`(\theta, p)` in the rotation planes."""
    fig, ax = _canvas()
    u = np.linspace(-0.9, 0.9, 100)
    _curve(ax, 0.9 + 1.2 * np.cosh(u), 3.2 + 1.5 * np.sinh(u), BLUE)
    _label(ax, 2.4, 5.7, "gradient flow", BLUE, 10)
    _label(ax, 2.4, 0.7, r"$W_Q^\top W_Q - W_K^\top W_K$ conserved" "\n"
           "(the scalings' charge)", BLUE, 9)
    _arrow(ax, (2.1, 3.2), (2.3, 4.3), BLUE, lw=2)
    _label(ax, 3.3, 4.3, r"$\dot\theta = -\nabla \mathcal{L}$", BLUE, 10)
    c, r, a = (7.2, 3.2), 1.5, 0.6
    ax.add_patch(Circle(c, r, fc="none", ec=ORANGE, lw=2))
    px, py = c[0] + r * math.cos(a), c[1] + r * math.sin(a)
    ax.plot([c[0], px], [c[1], py], color=GREY)
    ax.plot(px, py, "o", color="black", ms=5)
    _label(ax, px + 0.35, py - 0.25, r"$\theta$", size=11)
    _arrow(ax, (px, py), (px - 1.1 * math.sin(a), py + 1.1 * math.cos(a)), RED, lw=2)
    _label(ax, px - 0.55 * math.sin(a) + 0.35, py + 0.9, r"$p$", RED, 11)
    _arrow(ax, (c[0] - r - 0.25, c[1] + 0.6), (c[0] - r - 0.25, c[1] - 0.6), ORANGE, rad=0.4)
    _label(ax, c[0] - r - 1.25, c[1], r"$e^{sX}$" "\n" r"$X^\top = -X$", ORANGE, 9)
    _label(ax, 7.2, 5.7, "Hamiltonian dynamics", ORANGE, 10)
    _label(ax, 7.2, 0.7, r"$J_{QK}$, angular momentum of $(\theta, p)$," "\n"
           "conserved: rotations only", ORANGE, 9)
    return fig


def ecd_level_set_diagram() -> Figure:
    """ECD's particle (chapter 15): it moves at unit speed, :math:`|v| = 1`, and only the part
    of the gradient orthogonal to :math:`v` acts, turning the path toward lower loss across the
    level sets of :math:`F`."""
    fig, ax = _canvas()
    centre, (a, b) = np.array([6.6, 2.0]), (1.25, 0.8)
    for r in (0.6, 1.2, 1.8, 2.4):  # the outermost inside the canvas
        ax.add_patch(Ellipse(centre, 2 * r * a, 2 * r * b, fc="none", ec=SKY, lw=1))
    _label(ax, 9.3, 4.3, r"level sets of $F$", SKY, 9)
    t = np.linspace(0, 1, 80)
    path = np.stack([0.6 + 5.6 * t, 4.4 - 1.6 * t - 0.9 * t**2])
    _curve(ax, *path, GREEN)
    k = 20
    x = path[:, k]
    v = path[:, k + 1] - path[:, k - 1]
    v /= np.linalg.norm(v)
    grad = (x - centre) / np.array([a**2, b**2])
    down = -grad / np.linalg.norm(grad)  # -grad F, unit length
    turn = down - v * (down @ v)  # the part that acts
    ax.plot(*x, "o", color="black", ms=6)
    for vec, color, text, off in ((v, GREEN, r"$v$, $|v| = 1$", (0.2, 0.35)),
                                  (down, BLUE, r"$-\nabla F$", (0.45, 0.0)),
                                  (turn / np.linalg.norm(turn), RED,
                                   r"$-(\nabla F - v\,(v\cdot\nabla F))$", (-0.2, -0.35))):
        tip = x + 1.6 * vec
        _arrow(ax, x, tip, color, lw=1.8)
        _label(ax, tip[0] + off[0], tip[1] + off[1], text, color, 10)
    _label(ax, 5.0, 5.75, r"$\dfrac{dv}{ds} = -\kappa\,\dfrac{\nabla F - v(v\cdot\nabla F)}"
           r"{F - F_0}$: the speed is fixed, the direction bends", size=10)
    _label(ax, 0.3, 0.4, r"$E = |\Pi|\,(F - F_0)^\kappa$ is conserved", size=9, ha="left")
    return fig


def protocol_block_diagram() -> Figure:
    """Where the symmetry-breaking protocol injects its biases in a head (chapter 16):
    :math:`b_Q` on the queries, :math:`b_V` on the values, nothing on the keys; one draw per
    layer and step, shared by the heads, the means at evaluation."""
    fig, ax = _canvas()
    _box(ax, 0.8, 2.9, r"$x$", GREY, w=0.8)
    rows = ((4.2, r"$xW_Q^{(i)}$", r"$q^{(i)}$", BLUE), (2.9, r"$xW_K^{(i)}$", r"$k^{(i)}$", GREY),
            (1.6, r"$xW_V^{(i)}$", r"$v^{(i)}$", ORANGE))
    for y, lin, out, color in rows:
        _arrow(ax, (1.2, 2.9), (2.15, y))
        _box(ax, 2.9, y, lin, color, w=1.4)
        _box(ax, 6.8, y, out, color, w=0.9)
        if color == GREY:
            _arrow(ax, (3.6, y), (6.35, y))
            _label(ax, 5.0, y + 0.25, "no bias", GREY, 9)
            continue
        ax.add_patch(Circle((5.0, y), 0.25, fc="white", ec=color, lw=1.5))
        _label(ax, 5.0, y, "+", color, 12)
        _arrow(ax, (3.6, y), (4.75, y))
        _arrow(ax, (5.25, y), (6.35, y))
    _box(ax, 5.0, 5.55, r"$b_Q \sim \mathcal{N}(\mu_Q, \mathrm{diag}\,\sigma_Q^2)$", RED,
         w=3.4, size=9)
    _arrow(ax, (5.0, 5.2), (5.0, 4.45), RED)
    _box(ax, 5.0, 0.45, r"$b_V \sim \mathcal{N}(\mu_V, 0.05^2 I)$", RED, w=3.4, size=9)
    _arrow(ax, (5.0, 0.8), (5.0, 1.35), RED)
    _label(ax, 8.75, 2.9, "one draw per layer\nand step, shared by\nall heads; buffers,\n"
           "not learned;\n" r"eval: $\mu_Q$, $\mu_V$", size=9)
    return fig
