r"""Interactive explorers for the book (ipywidgets), each with a static matplotlib fallback.

A widget reacts only while a kernel runs (Jupyter, Colab). Every explorer is therefore also a
:class:`~gaugebook.interactive.StaticTwin`: its ``static()`` precomputes the readout over the
controls' whole grid, and the rendered book shows that (switched in the browser, no kernel).
Each explorer also has a companion function that draws the same information as a static figure.

* :class:`ConditionExplorer` (chapter 4): the relative invariance error
  ``max |f(g.theta, x) - f(theta, x)| / max |f(theta, x)|`` of random gauge elements ``g`` whose
  matrices have 2-norm condition number ``kappa``, in float32 or float64.
  Fallback: :func:`condition_figure` of the sweep :func:`invariance_errors`.
* :class:`OrbitExplorer` (chapter 3): a walk ``s -> (exp(sA), exp(sB))`` along a one-parameter
  subgroup of the QK and VO sectors. The weights move far; the function does not.
  Fallback: :func:`orbit_figure` of :func:`orbit_path`.

Constructing an explorer computes what it first shows; importing this module has no side effects.
"""
from __future__ import annotations

import copy
import math

import ipywidgets as widgets
import torch
from matplotlib.figure import Figure

from gaugebook.attention import MultiHeadAttention
from gaugebook.checks import check_number, check_positive_ints
from gaugebook.interactive import Control, StaticExplorer, StaticTwin
from gaugebook.notebook import flat
from gaugebook.gauge import GaugeElement, QKTransform, VOTransform, invariance_error, random_element
from gaugebook.plots import PALETTE, range_band

__all__ = ["probe_layer", "invariance_errors", "condition_figure", "ConditionExplorer",
           "orbit_path", "orbit_figure", "OrbitExplorer"]

DTYPES = {"float32": torch.float32, "float64": torch.float64}
SOURCE_BOUND = 24  # the source's Theorem 5 claims |error| <= 24 eps_mach (stated for float64)


def probe_layer(*, seed: int = 0) -> tuple[MultiHeadAttention, torch.Tensor]:
    """A small GPT-2-style layer (``d_model=16``, 4 heads of width 4, biases) in float64 and a
    probe input ``x [2, 12, 16]``, both drawn from ``seed``: the explorers' default subject."""
    generator = torch.Generator().manual_seed(seed)
    layer = MultiHeadAttention(16, 4, 4, bias=True, dtype=torch.float64, generator=generator)
    x = torch.randn(2, 12, 16, generator=generator, dtype=torch.float64)  # (B, T, D)
    return layer, x


def _dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {name!r}")
    return DTYPES[name]


def _eps(name: str) -> float:
    return torch.finfo(_dtype(name)).eps


def invariance_errors(module: torch.nn.Module, inputs: torch.Tensor, conds, *,
                      dtype: str = "float64", seeds=range(3)) -> torch.Tensor:
    """Relative invariance errors ``[len(seeds), len(conds)]`` (float64).

    Entry ``[i, j]`` is :func:`~gaugebook.gauge.invariance_error` of
    ``random_element(module, cond=conds[j])``, drawn from
    ``torch.Generator().manual_seed(seeds[i])``, with a copy of the module and the input cast to
    ``dtype`` (``"float32"`` or ``"float64"``).
    """
    conds, seeds = [float(c) for c in conds], list(seeds)
    if not conds or not seeds:
        raise ValueError("need at least one condition number and one seed")
    cast = copy.deepcopy(module).to(_dtype(dtype))
    x = inputs.to(_dtype(dtype))
    errors = torch.empty(len(seeds), len(conds), dtype=torch.float64)
    for i, seed in enumerate(seeds):
        for j, cond in enumerate(conds):
            element = random_element(cast, cond=cond, generator=torch.Generator().manual_seed(seed))
            errors[i, j] = invariance_error(element, cast, x)
    return errors


def condition_figure(conds, errors: dict[str, torch.Tensor], *,
                     constants: dict[str, float] | None = None,
                     output_scale: float = 1.0) -> Figure:
    """Log-log plot of relative invariance error against condition number (static fallback of
    :class:`ConditionExplorer`).

    ``errors`` maps a dtype name to a ``[n_seeds, len(conds)]`` array from
    :func:`invariance_errors`: the median is drawn as markers, the spread over seeds as a band.
    For each dtype a dashed line ``C kappa eps`` is drawn (``C`` from ``constants``, default 1). The
    source's bound ``24 eps`` (float64) is absolute; ``output_scale = max|f(theta, x)|`` turns
    it into the relative error ``24 eps / output_scale``, drawn dotted: a point lies above the
    line exactly when its absolute error exceeds ``24 eps``.
    """
    output_scale = check_number("output_scale", output_scale, low=0.0, strict=True)
    conds = torch.as_tensor(conds, dtype=torch.float64)
    constants = constants or {}
    fig = Figure(layout="constrained")  # not registered with pyplot: shown only when displayed
    ax = fig.subplots()
    for colour, (name, err) in zip(PALETTE, errors.items()):
        err = torch.as_tensor(err, dtype=torch.float64)
        if err.ndim != 2 or err.shape[1] != len(conds):
            raise ValueError(f"errors[{name!r}] must have shape [n_seeds, {len(conds)}], "
                             f"got {tuple(err.shape)}")
        range_band(ax, conds, err.min(0).values, err.max(0).values, colour)
        ax.plot(conds, err.median(0).values, "o", color=colour, label=f"{name} (median, range)")
        C = constants.get(name, 1.0)
        ax.plot(conds, C * conds * _eps(name), "--", color=colour,
                label=f"{C:.2g} κ eps, eps = {_eps(name):.1e}")
    ax.axhline(SOURCE_BOUND * _eps("float64") / output_scale, color="black", linestyle=":",
               label="source: 24 eps / max|Attn| (float64)")
    ax.set(xscale="log", yscale="log", xlabel="condition number κ of the gauge matrices",
           ylabel="relative invariance error")
    ax.legend(fontsize=9, loc="upper left")
    return fig


class ConditionExplorer(StaticTwin, widgets.VBox):
    """Slider for the condition number ``kappa`` (log scale, ``10^0 .. 10^log10_max``) and a
    dropdown for the floating-point type; the readout shows the relative invariance error of
    random gauge elements (``seeds`` of them) at that ``kappa`` and compares it with
    ``kappa eps``, and the absolute error (relative error times
    ``output_scale = max |f(theta, x)|``) with ``24 eps`` of the selected dtype (the source
    states its ``24 eps`` bound for float64, ``eps = 2^-52``; judged against that, every float32
    run would violate it and the verdict would say nothing).

    Attributes ``cond`` (``FloatLogSlider``), ``dtype`` (``Dropdown``), ``readout`` (``HTML``)
    and ``output_scale``.
    """

    def __init__(self, module: torch.nn.Module | None = None, inputs: torch.Tensor | None = None,
                 *, seeds: int = 3, cond: float = 1e4, dtype: str = "float32",
                 log10_max: float = 8.0):
        if (module is None) != (inputs is None):
            raise ValueError("pass both module and inputs, or neither (for probe_layer())")
        check_positive_ints(seeds=seeds)
        if not 1 <= cond <= 10 ** log10_max:
            raise ValueError(f"cond must be in [1, 1e{log10_max:g}], got {cond}")
        _dtype(dtype)
        self.module, self.inputs = probe_layer() if module is None else (module, inputs)
        with torch.no_grad():
            out = self.module(self.inputs)
        self.output_scale = (out[0] if isinstance(out, tuple) else out).abs().max().item()
        self.seeds = range(seeds)
        self._cache: dict[tuple[float, str], torch.Tensor] = {}
        self.cond = widgets.FloatLogSlider(value=cond, base=10, min=0, max=log10_max, step=0.25,
                                           description="condition κ", readout_format=".1e",
                                           continuous_update=False)
        _slider_grid(self.cond)  # the static twin's grid: checked now, not on display
        self.dtype = widgets.Dropdown(options=list(DTYPES), value=dtype, description="dtype")
        self.readout = widgets.HTML()
        super().__init__([widgets.HBox([self.cond, self.dtype]), self.readout])
        self.cond.observe(self._update, names="value")
        self.dtype.observe(self._update, names="value")
        self._update()

    def errors(self, cond: float, dtype: str) -> torch.Tensor:
        """Relative invariance errors ``[seeds]`` at condition number ``cond`` (cached)."""
        key = (float(cond), dtype)
        if key not in self._cache:
            self._cache[key] = invariance_errors(self.module, self.inputs, [cond], dtype=dtype,
                                                 seeds=self.seeds)[:, 0]
        return self._cache[key]

    def _update(self, change=None) -> None:
        self.readout.value = self.readout_html(self.cond.value, self.dtype.value)

    def static(self) -> StaticExplorer:
        """The readout at every grid point of the slider and every dtype (no kernel needed)."""
        conds = [self.cond.base ** e for e in _slider_grid(self.cond)]
        start = min(conds, key=lambda c: abs(c - self.cond.value))  # the value, to rounding
        return StaticExplorer(
            [Control("condition κ", conds, value=start, labels=[f"{c:.1e}" for c in conds]),
             Control("dtype", list(DTYPES), value=self.dtype.value, kind="dropdown")],
            self.readout_html,
            alt="Relative invariance error of random gauge elements at a chosen condition "
                "number and floating-point type, compared with κ eps and with 24 eps of that "
                "type (the source's bound, stated for float64).")

    def readout_html(self, c: float, name: str) -> str:
        """The readout at condition number ``c`` and dtype ``name``; the absolute error is
        judged against ``24 eps`` of that dtype."""
        err, eps = self.errors(c, name).max().item(), _eps(name)
        bound, absolute = SOURCE_BOUND * eps, err * self.output_scale
        verdict = "holds" if absolute <= bound else "is violated"
        return (
            f"<b>κ = {c:.1e}, {name}</b>: largest relative invariance error over "
            f"{len(self.seeds)} random gauge elements = <b>{err:.2e}</b> "
            f"= {err / (c * eps):.2f} &middot; κ &middot; eps (eps = {eps:.2e}).<br>"
            f"Absolute error {absolute:.1e} (max |output| = {self.output_scale:.2f}): the "
            f"source's bound with this dtype's eps, 24 eps ({name}) = {bound:.1e}, "
            f"{verdict} here (the source states it for float64).")


def _random_direction(module: MultiHeadAttention, seed: int):
    """Lie-algebra directions ``A [n_kv, dk, dk]``, ``B [n_kv, dv, dv]`` of unit spectral norm."""
    if not isinstance(module, MultiHeadAttention) or module.rope:
        raise ValueError("the orbit explorer needs a MultiHeadAttention without RoPE (whose QK "
                         "group is all of GL(d_head))")
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(module.n_kv_heads, module.d_head, module.d_head, generator=g,
                    dtype=torch.float64)
    B = torch.randn(module.n_kv_heads, module.d_value, module.d_value, generator=g,
                    dtype=torch.float64)
    return (A / torch.linalg.matrix_norm(A, ord=2)[:, None, None],
            B / torch.linalg.matrix_norm(B, ord=2)[:, None, None])


def _slider_grid(slider) -> list[float]:
    """The positions ``min + k step`` of ``slider`` (exponents for a log slider), which its
    static twin shows: ValueError unless they cover ``[min, max]`` in at least two whole steps
    and hold its value, so that the page shows what the live widget does."""
    n = (slider.max - slider.min) / slider.step
    at = math.log(slider.value, slider.base) if isinstance(slider, widgets.FloatLogSlider) \
        else slider.value
    k = (at - slider.min) / slider.step
    if n < 1 or abs(n - round(n)) > 1e-9 or abs(k - round(k)) > 1e-9:
        raise ValueError(f"{slider.description}: the range [{slider.min:g}, {slider.max:g}] must "
                         f"be a whole number of steps of {slider.step:g} (at least one), and the "
                         f"start {at:g} one of them (of the exponents, for a log slider)")
    return [slider.min + i * slider.step for i in range(round(n) + 1)]


def orbit_path(module: MultiHeadAttention, inputs: torch.Tensor, s_values, *,
               seed: int = 0) -> dict[str, torch.Tensor]:
    r"""Walk along ``g(s) = QKTransform(exp(sA)) VOTransform(exp(sB))`` for random unit-norm
    ``A, B`` (drawn from ``seed``).

    Returns ``s``, ``parameter_change = |theta(s) - theta| / |theta|`` and ``output_change``
    (the relative invariance error of ``g(s)``), each ``[len(s_values)]``.
    """
    A, B = _random_direction(module, seed)
    s = torch.as_tensor(s_values, dtype=torch.float64).reshape(-1)
    theta = flat(module).double()
    parameter_change, output_change = torch.empty_like(s), torch.empty_like(s)
    for i, si in enumerate(s):
        g = GaugeElement([QKTransform(torch.linalg.matrix_exp(si * A)),
                          VOTransform(torch.linalg.matrix_exp(si * B))])
        parameter_change[i] = (flat(g.act(module)).double() - theta).norm() / theta.norm()
        output_change[i] = invariance_error(g, module, inputs)
    return {"s": s, "parameter_change": parameter_change, "output_change": output_change}


def orbit_figure(path: dict[str, torch.Tensor]) -> Figure:
    """Static fallback of :class:`OrbitExplorer`: parameter change and output change along the
    orbit (from :func:`orbit_path`), on a log scale."""
    fig = Figure(layout="constrained")
    ax = fig.subplots()
    for key, style, colour, label in (
            ("parameter_change", "-", PALETTE[0],
             r"parameters: $|\theta(s) - \theta|\,/\,|\theta|$"),
            ("output_change", "o", PALETTE[3], "outputs: relative invariance error")):
        # an exact zero (at s = 0) has no place on a log scale: NaN breaks the line there
        values = torch.where(path[key] > 0, path[key], torch.nan)
        ax.semilogy(path["s"], values, style, color=colour, label=label)
    ax.set(xlabel="position s along the one-parameter subgroup (dimensionless)",
           ylabel="relative change")
    ax.legend(fontsize=9)
    return fig


class OrbitExplorer(StaticTwin, widgets.VBox):
    """A slider for the position ``s`` on a one-parameter subgroup of the QK and VO sectors; the
    readout shows how far the weights moved and how little the output changed.

    Attributes ``s`` (``FloatSlider``) and ``readout`` (``HTML``).
    """

    def __init__(self, module: MultiHeadAttention | None = None,
                 inputs: torch.Tensor | None = None, *, seed: int = 0, s: float = 1.0,
                 s_max: float = 3.0):
        if (module is None) != (inputs is None):
            raise ValueError("pass both module and inputs, or neither (for probe_layer())")
        if s_max <= 0 or not -s_max <= s <= s_max:
            raise ValueError(f"need s_max > 0 and |s| <= s_max, got s={s}, s_max={s_max}")
        self.module, self.inputs = probe_layer() if module is None else (module, inputs)
        self.seed = seed
        _random_direction(self.module, seed)  # validate the module now, not on the first move
        self.s = widgets.FloatSlider(value=s, min=-s_max, max=s_max, step=0.25,
                                     description="position s", continuous_update=False)
        _slider_grid(self.s)  # the static twin's grid: checked now, not on display
        self.readout = widgets.HTML()
        super().__init__([self.s, self.readout])
        self.s.observe(self._update, names="value")
        self._update()

    def _update(self, change=None) -> None:
        self.readout.value = self.readout_html(self.s.value)

    def static(self) -> StaticExplorer:
        """The readout at every grid point of the slider (no kernel needed)."""
        s_values = _slider_grid(self.s)
        start = min(s_values, key=lambda s: abs(s - self.s.value))  # the value, to rounding
        return StaticExplorer(
            [Control("position s", s_values, value=start,
                     labels=[f"{s:+.2f}" for s in s_values])],
            self.readout_html,
            alt="How far the weights moved and how little the output changed at a chosen "
                "position s along a one-parameter subgroup of the gauge group.")

    def readout_html(self, s: float) -> str:
        """The readout at position ``s``."""
        path = orbit_path(self.module, self.inputs, [s], seed=self.seed)
        moved, changed = path["parameter_change"].item(), path["output_change"].item()
        return (
            f"<b>s = {s:+.2f}</b>: the weights moved by <b>{moved:.1%}</b> of their "
            f"norm; the output changed by <b>{changed:.1e}</b> (relative).")
