r"""Interactive figures without a kernel: a grid of precomputed frames switched in the browser.

An ipywidget reacts only while a kernel runs (Jupyter, Colab); the rendered HTML book has none.
:class:`StaticExplorer` holds the explorer's whole grid instead: one frame (an HTML fragment,
e.g. a readout, or a figure from :func:`figure_html`) for every combination of the controls'
values, each control an ``<input type="range">`` or a ``<select>``, and a few lines of inline
JavaScript (no library, nothing loaded from a network) that show the frame of the current
combination. For ``k`` controls with ``n_1, ..., n_k`` values the grid has ``n_1 ... n_k`` frames,
all computed at build time.

:class:`StaticTwin` gives a live widget explorer its static twin in one display bundle: Jupyter
and Colab render the widget view, the book (whose ``nb_mime_priority_overrides`` in
``_config.yml`` prefers ``text/html`` in HTML builds) renders the static explorer.

The markup is what ``.ci/check_rendered.py`` drives in headless Chromium: a
``<div class="gb-interactive">`` with controls ``[data-gb-control]`` and frames ``[data-gb-frame]``
of which exactly one is visible.
"""
from __future__ import annotations

import base64
import hashlib
import html
import io
import itertools
import json
from typing import Callable, Sequence

from matplotlib.figure import Figure
from PIL import Image

__all__ = ["Control", "StaticExplorer", "StaticTwin", "figure_html"]

# The switcher: written once per explorer inside a function scope (no global names, so that two
# explorers on a page, or a page that loads twice, declare nothing twice). A slider announces the
# label of its value (aria-valuetext), not its index, and its <output> shows the same label.
_SCRIPT = """<script>(function () {
  var root = document.getElementById("%s");
  var controls = root.querySelectorAll("[data-gb-control]");
  var frames = root.querySelectorAll("[data-gb-frame]");
  function show() {
    var key = [];
    for (var i = 0; i < controls.length; i++) {
      var c = controls[i];
      key.push(c.value);
      var label = JSON.parse(c.getAttribute("data-gb-labels"))[c.value];
      if (c.type === "range") { c.setAttribute("aria-valuetext", label); }
      var out = root.querySelector('output[for="' + c.id + '"]');
      if (out) { out.textContent = label; }
    }
    key = key.join(",");
    for (var j = 0; j < frames.length; j++) {
      frames[j].hidden = frames[j].getAttribute("data-gb-frame") !== key;
    }
  }
  for (var i = 0; i < controls.length; i++) {
    controls[i].addEventListener("input", show);
    controls[i].addEventListener("change", show);
  }
  show();
})();</script>"""


class Control:
    """One control of a :class:`StaticExplorer`: a ``description``, its ``values`` (passed to the
    frame function), their ``labels`` (shown; default ``str(value)``), the starting ``value``
    and ``kind`` ``"slider"`` (a range input over the values' indices) or ``"dropdown"``."""

    def __init__(self, description: str, values: Sequence, *, value=None,
                 labels: Sequence[str] | None = None, kind: str = "slider"):
        self.description, self.values = description, list(values)
        if len(self.values) < 2:
            raise ValueError(f"control {description!r} needs at least two values")
        self.labels = [str(v) for v in self.values] if labels is None else list(labels)
        if len(self.labels) != len(self.values):
            raise ValueError(f"control {description!r}: {len(self.labels)} labels for "
                             f"{len(self.values)} values")
        if kind not in ("slider", "dropdown"):
            raise ValueError(f"kind must be 'slider' or 'dropdown', got {kind!r}")
        self.kind = kind
        self.index = 0 if value is None else self._index(value)

    def _index(self, value) -> int:
        for i, v in enumerate(self.values):
            if v == value:
                return i
        raise ValueError(f"control {self.description!r}: {value!r} is not among its values")

    def html(self, position: int, uid: str) -> str:
        """The control's HTML (a slider or a dropdown) for the static page, as control
        ``position`` of the explorer whose ``<div>`` has the id ``uid``: the control's id is
        ``uid-position``, which a slider's ``<output>`` names (``for``), and a slider's
        ``aria-valuetext`` is the label of its value."""
        labels = html.escape(json.dumps(self.labels))
        ident = f"{uid}-{position}"
        common = f'id="{ident}" data-gb-control="{position}" data-gb-labels="{labels}"'
        name = html.escape(self.description)
        shown = html.escape(self.labels[self.index])
        if self.kind == "dropdown":
            options = "".join(f'<option value="{i}"{" selected" if i == self.index else ""}>'
                              f"{html.escape(label)}</option>"
                              for i, label in enumerate(self.labels))
            return (f'<span class="gb-control"><label>{name} <select {common}>{options}'
                    '</select></label></span>')
        # one span per control: the style sheet keeps a slider and its value on one line
        return (f'<span class="gb-control"><label>{name} <input type="range" min="0" '
                f'max="{len(self.values) - 1}" step="1" value="{self.index}" '
                f'aria-valuetext="{shown}" {common}></label> '
                f'<output for="{ident}">{shown}</output></span>')


class StaticExplorer:
    """An interactive figure for a page without a kernel.

    ``frame(*values)`` returns the HTML fragment shown for one combination of the controls'
    values; it is called once for every combination (the grid is precomputed here), so it must
    be cheap or read from a precomputed result. ``alt`` describes the figure for readers who do
    not see it. Displayed in a notebook (``_repr_html_``), the explorer is a ``<div>`` with its
    controls, every frame (all but the current one hidden, inside an ``aria-live`` region, so
    that a screen reader reads the frame a move of a control brings up) and the inline
    switcher script.
    """

    def __init__(self, controls: Sequence[Control], frame: Callable[..., str], *, alt: str):
        self.controls = list(controls)
        if not self.controls:
            raise ValueError("a StaticExplorer needs at least one control")
        self.alt = alt
        self.frames = {
            indices: frame(*(c.values[i] for c, i in zip(self.controls, indices)))
            for indices in itertools.product(*(range(len(c.values)) for c in self.controls))}

    def _repr_html_(self) -> str:
        body = "".join(
            f'<div data-gb-frame="{",".join(map(str, key))}"'
            f'{"" if key == self.current else " hidden"}>{fragment}</div>'
            for key, fragment in self.frames.items())
        # a deterministic id: the same figure gets the same id in every build
        uid = "gb-ix-" + hashlib.sha256(body.encode()).hexdigest()[:12]
        controls = " ".join(c.html(i, uid) for i, c in enumerate(self.controls))
        # the frames in a live region: a screen reader reads the new frame (its text, or its
        # image's alt text) when a control moves
        return (f'<div class="gb-interactive" id="{uid}" role="figure" '
                f'aria-label="{html.escape(self.alt)}">'
                f'<div class="gb-controls">{controls}</div>'
                f'<div class="gb-frames" aria-live="polite">{body}</div></div>' + _SCRIPT % uid)

    @property
    def current(self) -> tuple[int, ...]:
        """The frame shown before any move, as the indices of the controls' starting values."""
        return tuple(c.index for c in self.controls)


def figure_html(fig: Figure, *, alt: str, dpi: int = 80, density: int = 2) -> str:
    """A matplotlib figure as an ``<img>`` with an inline PNG (``data:`` URL) and alt text.

    It is shown at ``dpi`` CSS pixels per inch and drawn with ``density`` device pixels per CSS
    pixel, sharp on a high-density screen. Reduced to 256 colours (no dithering: a line plot
    has far fewer), the PNG weighs little more than a full-colour one at ``dpi`` (a sixth more
    for the ECD explorer's frames).
    """
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi * density)
    image = Image.open(buffer).convert("RGB").quantize(256, dither=Image.Dither.NONE)
    width, height = (n // density for n in image.size)  # CSS pixels
    buffer = io.BytesIO()
    image.save(buffer, format="png", optimize=True)
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return (f'<img src="data:image/png;base64,{data}" alt="{html.escape(alt)}" '
            f'width="{width}" height="{height}" style="max-width:100%;height:auto">')


class StaticTwin:
    """Mixin for an ipywidget explorer that has a static twin, :meth:`static`.

    Its display bundle holds the live widget's view (rendered by Jupyter and Colab, where a
    kernel runs) and, as ``text/html``, the static explorer (rendered by the book, which
    prefers ``text/html`` to the widget view: ``nb_mime_priority_overrides`` in ``_config.yml``).
    Put it before the widget class in the bases: ``class E(StaticTwin, widgets.VBox)``.
    """

    def static(self) -> StaticExplorer:  # pragma: no cover - every explorer defines it
        """The explorer's static twin, shown where no kernel runs."""
        raise NotImplementedError(f"{type(self).__name__} must define static()")

    def _repr_mimebundle_(self, **kwargs):
        bundle = dict(super()._repr_mimebundle_(**kwargs) or {})
        bundle["text/html"] = self.static()._repr_html_()
        return bundle
