r"""Shared figure style for the book: readable on screen and in print, colour-blind safe.

Contrast follows WCAG 2: the ratio of two colours is :math:`(L_1 + 0.05) / (L_2 + 0.05)`, with
:math:`L_1 \ge L_2` their relative luminances :math:`L = 0.2126\,R + 0.7152\,G + 0.0722\,B` of the
linear channels (:math:`c / 12.92` for an sRGB channel :math:`c \le 0.04045`, else
:math:`((c + 0.055) / 1.055)^{2.4}`). On white a data line needs 3:1, text 4.5:1.
"""
from __future__ import annotations

import matplotlib as mpl
from matplotlib.colors import to_rgb, to_rgba

# Okabe-Ito palette, distinguishable under the common colour-vision deficiencies, except that its
# orange #E69F00 (2.25:1 on white) is darkened to #C88600 (3.06:1; a data line needs 3:1). No
# orange at 3:1 stays apart from the vermilion under deuteranopia (CIEDE2000 4.7, was 12.5):
# where both carry data, a marker or line style tells them apart as well.
PALETTE = ["#0072B2", "#C88600", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]


def _luminance(colour) -> float:
    """Relative luminance of a matplotlib colour (WCAG 2; the module docstring)."""
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in to_rgb(colour)]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast_ratio(colour, background="white") -> float:
    """WCAG 2 contrast ratio of two matplotlib colours, from 1 (equal luminance) to 21 (black
    on white); see the module docstring."""
    high, low = sorted((_luminance(colour), _luminance(background)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def text_colour(colour, ratio: float = 4.5) -> tuple[float, float, float]:
    r"""``colour`` for text on white: the colour itself if its :func:`contrast_ratio` with white
    is at least ``ratio``, else the colour mixed with black, :math:`(1 - t)\,(R, G, B)`, with
    the least :math:`t` that reaches ``ratio`` (found by bisection): the hue stays, the colour
    darkens only as far as it must."""
    rgb = to_rgb(colour)
    if contrast_ratio(rgb) >= ratio:
        return rgb
    low, high = 0.0, 1.0  # contrast below ratio at t = low, at least ratio at t = high
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (low, mid) if contrast_ratio([(1 - mid) * c for c in rgb]) >= ratio \
            else (mid, high)
    return tuple((1 - high) * c for c in rgb)


def range_band(ax, x, low, high, colour, **kwargs):
    """The range of several seeds, ``low`` to ``high`` over ``x``, as a band of ``colour``:
    filled at alpha 0.25, with an edge in the full colour, which keeps the band's extent visible
    where the faint fill is hard to tell from the background. Returns matplotlib's collection."""
    return ax.fill_between(x, low, high, facecolor=to_rgba(colour, 0.25), edgecolor=colour,
                           linewidth=0.6, **kwargs)


def use_book_style() -> None:
    """Set matplotlib defaults used by every chapter."""
    mpl.rcParams.update({
        "figure.figsize": (6.4, 4.0),
        "figure.dpi": 100,
        "savefig.dpi": 150,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.prop_cycle": mpl.cycler(color=PALETTE),
        "font.size": 11,
        # a borderless, nearly opaque box: lines and markers that pass behind a legend do not
        # run through its text
        "legend.frameon": True,
        "legend.framealpha": 0.9,
        "legend.edgecolor": "none",
    })
