"""Every figure of the book as files for slides and print, next to the rendered pages.

When an HTML build starts, this sets ``GAUGEBOOK_FIGURES`` to ``<outdir>/figures``, so the
notebooks' kernels (which inherit the environment) save each figure they glue there, as
``<name>.svg`` and a 300-dpi ``<name>.png`` (:func:`gaugebook.notebook.glue`); the name is the
figure's label (a ``{glue:figure}`` is named after its glue key). When the build ends, files of
figures the book no longer has are removed. :func:`links` gives a page the links to a figure's
files; the lists page shows them next to each figure. Each figure's image opens its PNG.
"""
from __future__ import annotations

import os
import posixpath
from pathlib import Path

from docutils import nodes

from gaugebook.notebook import FIGURES_ENV

FOLDER = "figures"  # under the HTML output folder
FORMATS = (("svg", "SVG"), ("png", "PNG, 300 dpi"))


def _folder(app) -> Path:
    return Path(app.outdir) / FOLDER


def set_folder(app) -> None:
    """Point the kernels that execute the notebooks at the output's figure folder."""
    if app.builder.format == "html":
        os.environ[FIGURES_ENV] = str(_folder(app))


def _uri(app, fromdoc: str, name: str, suffix: str) -> str | None:
    """The relative URL from page ``fromdoc`` to figure ``name``'s ``.suffix`` file, or ``None``
    when the build saved none (e.g. a build that did not execute the figure's notebook)."""
    if not (_folder(app) / f"{name}.{suffix}").is_file():
        return None
    here = posixpath.dirname(app.builder.get_target_uri(fromdoc))
    return posixpath.relpath(f"{FOLDER}/{name}.{suffix}", here or ".")


def links(app, fromdoc: str, name: str) -> list[nodes.Node]:
    """``[SVG, PNG]``: links from page ``fromdoc`` to figure ``name``'s files, as inline nodes
    (an empty list when the build saved none)."""
    out = []
    for suffix, text in FORMATS:
        uri = _uri(app, fromdoc, name, suffix)
        if uri is not None:
            out.append(nodes.reference(text, text, refuri=uri, classes=["gb-figure-file"]))
    return out


def link_images(app, doctree, docname: str) -> None:
    """Make each figure's image a link to its 300-dpi PNG: a phone shrinks a wide figure to the
    column, and a tap opens it at a size where its labels can be read. (``gaugebook.js`` links
    the other images, which have no such file, to themselves.)"""
    if app.builder.format != "html":
        return
    for figure in doctree.findall(nodes.figure):
        uri = _uri(app, docname, figure["ids"][0], "png") if figure["ids"] else None
        image = next(iter(figure.findall(nodes.image)), None)
        if uri is None or image is None or isinstance(image.parent, nodes.reference):
            continue
        link = nodes.reference("", "", refuri=uri, classes=["gb-full-size"],
                               reftitle="Open the figure at 300 dpi")
        image.replace_self(link)
        link += image


def remove_stale(app, exception) -> None:
    """Remove the files of figures that no page of the book holds any more."""
    folder = _folder(app)
    if exception is not None or app.builder.format != "html" or not folder.is_dir():
        return
    names = {i for doc in app.env.found_docs
             for figure in app.env.get_doctree(doc).findall(nodes.figure) for i in figure["ids"]}
    for path in folder.iterdir():
        if path.stem not in names:
            path.unlink()


def setup(app):
    app.connect("builder-inited", set_folder)
    app.connect("doctree-resolved", link_images)
    app.connect("build-finished", remove_stale)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
