"""The book's ipywidgets explorers: headless construction, callbacks, static fallbacks."""
import copy
import re

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure

from gaugebook.attention import MultiHeadAttention
from gaugebook.widgets import (ConditionExplorer, OrbitExplorer, condition_figure,
                               invariance_errors, orbit_figure, orbit_path, probe_layer)


def _error_in(readout: str) -> float:
    """The bold error figure that the condition explorer's readout reports."""
    return float(re.search(r"= <b>([0-9.e+-]+)</b>", readout).group(1))


@pytest.fixture(scope="module")
def small():
    g = torch.Generator().manual_seed(3)
    layer = MultiHeadAttention(8, 2, 4, bias=True, dtype=torch.float64, generator=g)
    return layer, torch.randn(1, 6, 8, generator=g, dtype=torch.float64)


def test_invariance_errors_grow_with_condition_and_precision(small):
    conds = [1.0, 1e6]
    e64 = invariance_errors(*small, conds, dtype="float64", seeds=range(2))
    e32 = invariance_errors(*small, conds, dtype="float32", seeds=range(2))
    assert e64.shape == e32.shape == (2, 2)
    assert (e64 < 1e-9).all() and (e64[:, 1] > e64[:, 0]).all()
    assert (e32 > e64).all()
    assert (e32[:, 1] > e32[:, 0]).all()
    # the module passed in is not converted in place
    assert small[0].W_Q.dtype == torch.float64


def test_invariance_errors_validate(small):
    with pytest.raises(ValueError, match="dtype"):
        invariance_errors(*small, [1.0], dtype="float16")
    with pytest.raises(ValueError, match="condition number"):
        invariance_errors(*small, [], dtype="float64")


def test_condition_explorer_callback_updates_readout(small):
    explorer = ConditionExplorer(*small, seeds=2, cond=1.0, dtype="float64")
    before = _error_in(explorer.readout.value)
    assert "κ = 1.0e+00, float64" in explorer.readout.value
    explorer.cond.value = 1e6
    after = _error_in(explorer.readout.value)
    assert "κ = 1.0e+06" in explorer.readout.value
    assert after > 100 * before
    expected = invariance_errors(*small, [1e6], dtype="float64", seeds=range(2)).max().item()
    assert after == pytest.approx(expected, rel=1e-2)  # the readout rounds to 3 digits
    explorer.dtype.value = "float32"
    assert "float32" in explorer.readout.value
    assert _error_in(explorer.readout.value) > 1e3 * after
    # the widget tree contains the controls, so displaying it shows them
    assert explorer.cond in explorer.children[0].children and explorer.readout in explorer.children


def test_condition_explorer_default_and_validation(small):
    explorer = ConditionExplorer(seeds=1)
    layer, x = probe_layer()
    assert explorer.module.d_model == layer.d_model and explorer.inputs.shape == x.shape
    with pytest.raises(ValueError, match="both module and inputs"):
        ConditionExplorer(small[0])
    with pytest.raises(ValueError, match="cond"):
        ConditionExplorer(*small, cond=0.5)
    with pytest.raises(ValueError, match="dtype"):
        ConditionExplorer(*small, dtype="bfloat16")


def test_condition_figure_is_a_figure(small):
    conds = [1.0, 10.0, 100.0]
    errors = {"float64": invariance_errors(*small, conds, seeds=range(2))}
    fig = condition_figure(conds, errors, constants={"float64": 2.0})
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert ax.get_xlabel() and ax.get_ylabel()
    with pytest.raises(ValueError, match="shape"):
        condition_figure(conds, {"float64": errors["float64"][:, :2]})


def _source_line(fig):
    """The dotted line of the source's bound: its height and its legend label."""
    line = next(ln for ln in fig.axes[0].get_lines() if ln.get_linestyle() == ":")
    return line.get_ydata()[0], line.get_label()


def test_condition_figure_draws_the_absolute_bound_on_the_relative_axis(small):
    conds = [1.0, 10.0]
    errors = {"float64": invariance_errors(*small, conds, seeds=range(1))}
    bound = 24 * torch.finfo(torch.float64).eps
    assert _source_line(condition_figure(conds, errors))[0] == pytest.approx(bound)
    height, label = _source_line(condition_figure(conds, errors, output_scale=4.0))
    assert height == pytest.approx(bound / 4.0)  # relative error = absolute / max|Attn|
    assert label == "source: 24 eps / max|Attn| (float64)"
    with pytest.raises(ValueError, match="output_scale"):
        condition_figure(conds, errors, output_scale=0.0)


def test_condition_explorer_judges_the_bound_on_the_absolute_error(small):
    layer, x = small
    loud = copy.deepcopy(layer)
    with torch.no_grad():  # a power of two: the relative error stays exactly the same
        loud.W_O.mul_(2.0**20)
        loud.b_O.mul_(2.0**20)
    quiet = ConditionExplorer(layer, x, seeds=1, cond=1.0, dtype="float64")
    scaled = ConditionExplorer(loud, x, seeds=1, cond=1.0, dtype="float64")
    assert scaled.output_scale == 2.0**20 * quiet.output_scale
    with torch.no_grad():
        assert quiet.output_scale == layer(x).abs().max().item()
    assert _error_in(scaled.readout.value) == _error_in(quiet.readout.value)
    assert "holds here" in quiet.readout.value and "is violated here" in scaled.readout.value


def test_condition_explorer_judges_each_dtype_with_its_own_eps(small):
    # the source states 24 eps for float64; a float32 run is judged against 24 eps_float32
    explorer = ConditionExplorer(*small, seeds=2, cond=1.0, dtype="float32")
    readout = explorer.readout.value
    bound = 24 * torch.finfo(torch.float32).eps
    assert f"24 eps (float32) = {bound:.1e}" in readout
    absolute = explorer.errors(1.0, "float32").max().item() * explorer.output_scale
    assert 24 * torch.finfo(torch.float64).eps < absolute <= bound  # float64's would fail it
    assert "holds here" in readout
    explorer.cond.value = 1e6  # c eps_32 times the output scale: far above 24 eps_32
    assert "24 eps (float32)" in explorer.readout.value
    assert "is violated here" in explorer.readout.value
    explorer.dtype.value = "float64"
    bound64 = 24 * torch.finfo(torch.float64).eps
    assert f"24 eps (float64) = {bound64:.1e}" in explorer.readout.value


def test_orbit_path_moves_weights_not_outputs(small):
    path = orbit_path(*small, [0.0, 1.0, 2.0])
    assert path["parameter_change"][0] == 0
    assert path["parameter_change"][2] > path["parameter_change"][1] > 0.05
    assert (path["output_change"] < 1e-12).all()
    fig = orbit_figure(path)
    assert isinstance(fig, Figure)
    drawn = fig.axes[0].lines[0].get_ydata()  # the parameter change: a gap at s = 0
    assert np.isnan(drawn[0]) and drawn[2] > drawn[1] > 0


def test_orbit_explorer_callback_and_validation(small):
    explorer = OrbitExplorer(*small, s=0.0)
    assert "moved by <b>0.0%</b>" in explorer.readout.value
    explorer.s.value = 2.0
    moved = float(re.search(r"moved by <b>([0-9.]+)%", explorer.readout.value).group(1))
    expected = orbit_path(*small, [2.0])["parameter_change"].item()
    assert moved == pytest.approx(100 * expected, abs=0.1)
    g = torch.Generator().manual_seed(0)
    rope = MultiHeadAttention(8, 2, 4, rope=True, dtype=torch.float64, generator=g)
    with pytest.raises(ValueError, match="RoPE"):
        OrbitExplorer(rope, torch.zeros(1, 4, 8, dtype=torch.float64))


@pytest.mark.parametrize("make", [
    lambda small: OrbitExplorer(*small, s=1.0, s_max=1.1),  # range not whole steps: 1.15 shown
    lambda small: OrbitExplorer(*small, s=0.1),  # a start the static page would snap to 0
    lambda small: OrbitExplorer(*small, s=0.0, s_max=0.05),  # no second position
    lambda small: ConditionExplorer(*small, seeds=1, cond=3e4),  # static page: 3.2e4
])
def test_explorers_refuse_a_slider_the_static_page_cannot_show(small, make):
    with pytest.raises(ValueError, match="whole number of steps"):
        make(small)


def test_static_twins_show_the_live_start(small):
    orbit = OrbitExplorer(*small, s=2.0, s_max=3.0).static().controls[0]
    assert orbit.values[orbit.index] == 2.0 and max(orbit.values) == 3.0
    cond = ConditionExplorer(*small, seeds=1, cond=10 ** 0.75, log10_max=1.0).static()
    c = cond.controls[0]
    assert len(c.values) == 5 and c.values[c.index] == pytest.approx(10 ** 0.75)
