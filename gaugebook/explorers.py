r"""Interactive figures of chapters 5, 15 and 16, precomputed over their controls' grids
(:class:`~gaugebook.interactive.StaticExplorer`: they respond in the rendered book, in Jupyter
and in Colab alike, with no kernel behind the controls).

* :func:`rope_commutant_explorer` (chapter 5): the QK gauge algebra that survives RoPE with two
  rotation planes of frequencies ``theta_1, theta_2`` (radians per position), the commutant of
  the rotations ``R_t``: for frequencies on the explorer's grid (non-negative, below pi),
  ``gl(4)`` (16) when neither plane turns, ``gl(2) + C`` (6) when one does, ``gl(2, C)`` (8)
  when both turn at the same frequency, ``C + C`` (4) otherwise. (Frequencies equal up to sign
  or modulo 2 pi also give 8, and a multiple of pi a real ``GL`` block: chapter 5.)
* :func:`ecd_explorer` (chapter 15): the path of the q = 1 ECD map
  (:func:`~gaugebook.landscapes.ecd_path`) on the tilted four-well landscape for a choice of
  ``eta`` and ``F0``.
* :func:`bias_attention_explorer` (chapter 16): the attention pattern of one head under a query
  shift ``b`` of a chosen direction and length: the query ``q_t = x_t W_Q + b`` scores key
  ``k_j`` higher by ``(b . k_j)/sqrt(d_k)``, the same for every ``t``, so every query favours
  the keys that point along ``b``.
"""
from __future__ import annotations

import math

import torch
from matplotlib.figure import Figure

from gaugebook.attention import MultiHeadAttention
from gaugebook.commutant import commutant
from gaugebook.interactive import Control, StaticExplorer, figure_html
from gaugebook.landscapes import ecd_path, multiwell
from gaugebook.plots import PALETTE
from gaugebook.rope import rotation_matrix

__all__ = ["ECD_EXPLORER_PATH", "BIAS_EXPLORER_LAYER", "rope_commutant",
           "rope_commutant_explorer", "ecd_explorer", "bias_attention_explorer"]


def rope_commutant(frequencies, *, positions=(1.0, 2.0, 3.0)):
    """The commutant of the RoPE rotations ``R_t`` (``t`` in ``positions``) of a head of width
    ``2 * len(frequencies)``: :class:`~gaugebook.commutant.Commutant`."""
    freqs = torch.as_tensor(frequencies, dtype=torch.float64)
    d = 2 * freqs.numel()
    return commutant(torch.stack([rotation_matrix(t, freqs, d) for t in positions]))


def _commutant_frame(theta1: float, theta2: float) -> str:
    C = rope_commutant([theta1, theta2])
    order = [0, 2, 1, 3]  # plane by plane: rotate() pairs coordinate i with i + d/2
    freedom = C.freedom[order][:, order]  # (d, d)
    fig = Figure(figsize=(4.0, 3.2), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(freedom.numpy(), cmap="Blues", vmin=0, vmax=1)
    fig.colorbar(image, ax=ax, label="freedom of the entry")
    labels = ["1a", "1b", "2a", "2b"]
    ax.set(xticks=range(4), yticks=range(4), xticklabels=labels, yticklabels=labels,
           title=rf"$\theta = ({theta1:g}, {theta2:g})$: dimension {C.dimension}")
    ax.grid(False)
    ax.set_xlabel("column (plane, coordinate)")
    return figure_html(fig, alt=f"Entries of the commutant for frequencies {theta1:g} and "
                                f"{theta2:g}: dimension {C.dimension} of 16.")


def rope_commutant_explorer() -> StaticExplorer:
    """Two sliders, the frequencies ``theta_1, theta_2`` of the two planes (radians per
    position); the frame marks which entries of a 4 x 4 QK gauge matrix may be non-zero and
    gives the commutant's dimension."""
    freqs = [0.0, 0.5, 1.0]
    return StaticExplorer(
        [Control("theta_1", freqs, value=1.0), Control("theta_2", freqs, value=0.5)],
        _commutant_frame,
        alt="The entries of a 4 by 4 QK gauge matrix that commute with RoPE's rotations, for "
            "chosen frequencies of the two planes, and the dimension of that commutant.")


_LANDSCAPE_GRID = torch.linspace(-2.0, 2.0, 161, dtype=torch.float64)
#: The path that every frame of :func:`ecd_explorer` draws (only eta and F0 vary).
ECD_EXPLORER_PATH = {"start": (1.3, 1.4), "lr": 0.05, "steps": 400}


def _ecd_frame(eta: float, F0: float) -> str:
    path = ecd_path(multiwell, list(ECD_EXPLORER_PATH["start"]), lr=ECD_EXPLORER_PATH["lr"],
                    eta=eta, F0=F0, steps=ECD_EXPLORER_PATH["steps"])
    X, Y = torch.meshgrid(_LANDSCAPE_GRID, _LANDSCAPE_GRID, indexing="xy")
    Z = multiwell(torch.stack([X, Y], dim=-1))
    fig = Figure(figsize=(4.2, 3.8), layout="constrained")
    ax = fig.subplots()
    ax.contour(X.numpy(), Y.numpy(), Z.numpy(), levels=20, colors="0.75", linewidths=0.6)
    x = path.x.numpy()
    final = multiwell(path.x[-1]).item()  # at the square (path.F[k] is F at x[k], k < len(F))
    ax.plot(x[:, 0], x[:, 1], "-", color=PALETTE[0], linewidth=0.8)
    ax.plot(x[0, 0], x[0, 1], "o", color="black")
    ax.plot(x[-1, 0], x[-1, 1], "s", color=PALETTE[3])
    ax.set(xlim=(-2, 2), ylim=(-2, 2), aspect="equal", xlabel="$x_1$", ylabel="$x_2$",
           title=rf"$\eta = {eta:g}$, $F_0 = {F0:g}$: final $F = {final:.2f}$")
    return figure_html(fig, alt=f"ECD path on the four-well landscape, eta {eta:g}, F0 {F0:g}, "
                                f"from ({x[0, 0]:.2f}, {x[0, 1]:.2f}) to ({x[-1, 0]:.2f}, "
                                f"{x[-1, 1]:.2f}): final F = {final:.2f}, "
                                f"{_multiwell_place(path.x[-1], final)}.")


def _multiwell_place(x: torch.Tensor, F: float) -> str:
    r"""Where the point ``x`` (at height ``F``) of :func:`~gaugebook.landscapes.multiwell` lies:
    in the well of its quadrant, near :math:`(\pm 1, \pm 1)`, when ``F`` is below both passes
    to the neighbouring wells (their heights taken at :math:`(0, \pm 1)` and
    :math:`(\pm 1, 0)`, which the tilt shifts only slightly), else above the passes."""
    def height(point) -> float:
        return multiwell(torch.tensor(point, dtype=torch.float64)).item()

    s1, s2 = (1.0 if c >= 0 else -1.0 for c in x.tolist())
    if F >= min(height([0.0, s2]), height([s1, 0.0])):
        return "above the passes between the wells"
    lowest = min(((a, b) for a in (-1.0, 1.0) for b in (-1.0, 1.0)), key=height)
    return f"in the well near ({s1:+.0f}, {s2:+.0f})" + \
        (", the lowest of the four" if (s1, s2) == lowest else "")


def ecd_explorer() -> StaticExplorer:
    """Sliders for ``eta`` and ``F0``; each frame is the ECD path (:data:`ECD_EXPLORER_PATH`:
    400 steps, lr 0.05, from (1.3, 1.4)) over the contours of
    :func:`~gaugebook.landscapes.multiwell`, its alt text the end point, the final ``F`` and
    the well the path ends in."""
    return StaticExplorer(
        [Control("eta", [1.0, 2.0, 5.0, 10.0], value=2.0),
         Control("F0", [-1.0, -0.6, -0.3], value=-0.6)],
        _ecd_frame,
        alt="The path of Energy Conserving Descent on a landscape with four wells, for chosen "
            "eta and F0: circle the start, square the end.")


def _bias_frame(layer: MultiHeadAttention, x: torch.Tensor, angle: float,
                length: float) -> str:
    b = torch.zeros(layer.d_head, dtype=torch.float64)
    b[0], b[1] = length * math.cos(math.radians(angle)), length * math.sin(math.radians(angle))
    A = layer.attention_pattern(x, query_shift=b)[0, 0]  # (T, T): sequence 0, head 0
    fig = Figure(figsize=(4.0, 3.4), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(A.detach().numpy(), cmap="viridis", vmin=0, vmax=1)
    fig.colorbar(image, ax=ax, label="attention weight")
    ax.grid(False)
    ax.set(xlabel="key position $j$", ylabel="query position $t$",
           title=rf"$b$ at {angle:g}°, $|b| = {length:g}$")
    top = A.argmax(-1)  # each query's most-attended key
    key = int(top.mode().values)
    chosen = top == key
    who = "every query puts" if chosen.all() else \
        f"{int(chosen.sum())} of the {len(top)} queries put"
    return figure_html(fig, alt=f"Attention pattern under a query shift at {angle:g} degrees "
                                f"of length {length:g}: {who} the most weight on key {key} "
                                f"({A[chosen, key].mean().item():.2f} on average).")


#: The layer and the sequence of :func:`bias_attention_explorer`.
BIAS_EXPLORER_LAYER = {"d_model": 8, "n_heads": 2, "d_head": 4, "tokens": 10}


def bias_attention_explorer(*, seed: int = 0) -> StaticExplorer:
    """Sliders for the direction (in the plane of the first two query coordinates) and the
    length of a query shift ``b``; the frame is the attention pattern of head 0 of a small
    layer (:data:`BIAS_EXPLORER_LAYER`: ``d_model = 8``, 2 heads of width 4, float64, no
    causal mask) on one sequence of 10 tokens, drawn from ``seed``. Each frame's alt text names
    the key that most queries attend to most and the weight they put on it."""
    g = torch.Generator().manual_seed(seed)
    D, H, dk, T = BIAS_EXPLORER_LAYER.values()
    layer = MultiHeadAttention(D, H, dk, causal=False, dtype=torch.float64, generator=g)
    x = torch.randn(1, T, D, generator=g, dtype=torch.float64)  # (B, T, D)
    return StaticExplorer(
        [Control("direction (deg)", [0, 45, 90, 135, 180, 225, 270, 315], value=0),
         Control("length |b|", [0.0, 2.0, 5.0], value=2.0)],
        lambda angle, length: _bias_frame(layer, x, angle, length),
        alt="The attention pattern of one head under a query shift of chosen direction and "
            "length: the shift makes every query favour the same keys.")
