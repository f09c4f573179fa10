"""Shared figure style for the book: readable on screen and in print, colour-blind safe."""
from __future__ import annotations

import matplotlib as mpl

# Okabe-Ito palette: distinguishable under the common colour-vision deficiencies.
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]


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
