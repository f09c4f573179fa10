"""Helpers for the book's notebooks that also work outside Jupyter Book (Colab, plain Jupyter)."""
from __future__ import annotations

from IPython.display import display


def glue(name: str, value, display_value: bool = True) -> None:
    """Store ``value`` under ``name`` for ``{glue}`` roles in the rendered book (``myst_nb.glue``);
    where myst-nb is not installed (Colab), just show it."""
    try:
        from myst_nb import glue as myst_glue
    except ImportError:
        if display_value:
            display(value)
        return
    myst_glue(name, value, display=display_value)


def in_colab() -> bool:
    """True when running inside Google Colab."""
    import sys

    return "google.colab" in sys.modules
