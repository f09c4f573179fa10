"""Helpers for the book's notebooks that also work outside Jupyter Book (Colab, plain Jupyter).

The chapters keep their teaching code visible and short; what only serves the page (gluing
numbers into the prose, assembling tables, showing result files) lives here, and so do the
small helpers that many chapters' checks share (:func:`flat`, :func:`with_weights`, and
:func:`~gaugebook.linalg.relative_change`, importable from here too).
"""
from __future__ import annotations

import copy
import os
from pathlib import Path

import torch
from IPython.display import display

from gaugebook.linalg import relative_change
from gaugebook.results import Table

__all__ = ["glue", "export_figure", "FIGURES_ENV", "relative_change", "flat", "with_weights",
           "html_table", "recorded_command", "repo_relative", "in_colab"]


# The folder, if any, where :func:`glue` also saves every glued figure for slides (the book's
# build sets it; see book/_ext/figure_files.py).
FIGURES_ENV = "GAUGEBOOK_FIGURES"


def glue(name: str, value, display_value: bool = True) -> None:
    """Store ``value`` under ``name`` for ``{glue}`` roles in the rendered book (``myst_nb.glue``);
    where myst-nb is not installed (Colab), just show it. A matplotlib figure is also saved by
    :func:`export_figure` when the environment variable ``GAUGEBOOK_FIGURES`` names a folder."""
    folder = os.environ.get(FIGURES_ENV)
    if folder and _is_figure(value):
        export_figure(name, value, folder)
    try:
        from myst_nb import glue as myst_glue
    except ImportError:
        if display_value:
            display(value)
        return
    myst_glue(name, value, display=display_value)


def export_figure(name: str, fig, folder) -> list[Path]:
    """Save ``fig`` for slides and print: ``folder/name.svg`` (vector) and ``folder/name.png``
    at 300 dpi, both with a white background. Returns the two paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{name}.svg", folder / f"{name}.png"]
    for path, dpi in zip(paths, ("figure", 300)):
        fig.savefig(path, dpi=dpi, facecolor="white", bbox_inches="tight")
    return paths


def _is_figure(value) -> bool:
    from matplotlib.figure import Figure

    return isinstance(value, Figure)


def flat(module: torch.nn.Module) -> torch.Tensor:
    """All parameters of ``module`` as one detached vector ``theta`` (in the order of
    ``module.parameters()``)."""
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def with_weights(module: torch.nn.Module, **weights) -> torch.nn.Module:
    """A deep copy of ``module`` with the named parameters replaced by ``weights`` (for
    transformations that are not library actions, such as the source's wrong ones); the
    module passed in is not changed. Each value must have its parameter's shape (a copy would
    broadcast a single head's matrix into every head)."""
    out = copy.deepcopy(module)
    with torch.no_grad():
        for name, value in weights.items():
            param = getattr(out, name)
            if tuple(torch.as_tensor(value).shape) != tuple(param.shape):
                raise ValueError(f"{name} has shape {tuple(param.shape)}, got a value of shape "
                                 f"{tuple(torch.as_tensor(value).shape)}")
            param.copy_(value)
    return out


def html_table(header, body, caption: str | None = None):
    """A plain HTML table whose cells are HTML already (e.g. ``"<code>W_Q</code>"``) or TeX
    between dollars (``"$d_k$"``, set as MathML): ``header`` is a list of column titles,
    ``body`` a list of rows; each cell is written as ``str(cell)``.
    The one table renderer is :class:`gaugebook.results.Table` (pandas is not a dependency of
    the book); this marks every cell as raw HTML for it."""
    raw = Table.Raw
    return Table([raw(h) for h in header], [[raw(c) for c in row] for row in body],
                 caption=caption)


def recorded_command(command: str, recorded_at: str) -> str:
    """The command that wrote a recorded result, as a reader runs it from the repository root:
    the producing machine's absolute ``--out`` path becomes ``recorded_at`` (the file's path in
    the repository), and any other absolute path is shown by :func:`repo_relative`."""
    words = command.split()
    for i, word in enumerate(words):
        if word.startswith("/"):
            words[i] = recorded_at if i and words[i - 1] == "--out" else repo_relative(word)
    return " ".join(words)


def repo_relative(path, root=None) -> str:
    """``path`` as the reader's checkout would name it: relative to the repository root
    (the folder holding ``pyproject.toml``) when it lies inside one, else only the part from
    the first ``results/``, ``runs/`` or ``benchmarks/`` folder on (a path recorded on another
    machine), else unchanged. The rendered book shows no machine's folders."""
    path = Path(path)
    root = Path(root) if root is not None else _repo_root()
    if root is not None and path.is_absolute():
        try:
            return path.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            pass
    if path.is_absolute():
        for i, part in enumerate(path.parts):
            if part in ("results", "runs", "benchmarks"):
                return Path(*path.parts[i:]).as_posix()
    return path.as_posix()


def _repo_root() -> Path | None:
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / "pyproject.toml").is_file() and (folder / "gaugebook").is_dir():
            return folder
    return None


def in_colab() -> bool:
    """True when running inside Google Colab."""
    import sys

    return "google.colab" in sys.modules
