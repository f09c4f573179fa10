"""Every diagram of gaugebook.diagrams builds, carries its chapter's labels, and leaves no figure
open in pyplot."""
import inspect

import matplotlib.pyplot as plt
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text

from gaugebook import diagrams
from gaugebook.gpt import GPTConfig
from gaugebook.gpt_redundancy import redundancy_terms
from gaugebook.plots import contrast_ratio

# a few labels each diagram must show (its chapter's notation)
EXPECTED = {
    "orbit_diagram": [r"$g\cdot\theta$", "orbit"],
    "head_wiring_diagram": [r"$\cdot M^{-\top}$", r"$N^{-1}\cdot$", r"$W_O$"],
    "semidirect_product_diagram": [r"\rtimes S_H", r"$M_2 \in \mathrm{GL}(d_k)$"],
    "tangent_space_diagram": [r"\ker J", r"T_\theta"],
    "rope_commutant_diagram": [r"$\rho_2 R(\varphi_2)$", r"\mathrm{GL}(1,\mathbb{C})"],
    "redundancy_terms_diagram": ["qk_gauge", "in all"],
    "gqa_diagram": [r"$W_K^{(1)}, W_V^{(1)}$", "group 1", "$H = 6$"],
    "moe_diagram": [r"expert $E_4$", r"\sigma(j)"],
    "sharpness_orbit_diagram": [r"$\alpha = 2$", r"\mathcal{A}^{-\top}"],
    "quotient_diagram": [r"$\mathcal{F}$", r"\Theta/\mathcal{G}"],
    "connections_diagram": ["NTK", "information bottleneck"],
    "experiment_pipeline_diagram": ["float64 and float32"],
    "group_map_diagram": ["architecture", "verdict",
                          r"not $\mathrm{O}(d_k)$ (ch. 5)",
                          "MLP-unit permutations", "open; checked locally\n(ch. 4, 10)"],
    "noether_charge_diagram": [r"$p$", "rotations only"],
    "ecd_level_set_diagram": [r"$-\nabla F$", r"$v$, $|v| = 1$"],
    "protocol_block_diagram": ["no bias", r"$q^{(i)}$", r"$v^{(i)}$"],
}


def build(name):
    if name == "redundancy_terms_diagram":
        terms = redundancy_terms(GPTConfig(50257, 1024, 12, 12, 768))
        return diagrams.redundancy_terms_diagram(terms, "GPT-2 small")
    return getattr(diagrams, name)()


def texts(fig):
    return [t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text"))]


def test_every_diagram_is_tested():
    public = {n for n, f in inspect.getmembers(diagrams, inspect.isfunction)
              if f.__module__ == diagrams.__name__ and not n.startswith("_")}
    assert public == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_diagram_builds_with_its_labels(name):
    before = plt.get_fignums()
    fig = build(name)
    assert isinstance(fig, Figure)
    fig.canvas.draw()  # renders every label: a mathtext error fails here
    shown = " | ".join(texts(fig))
    for label in EXPECTED[name]:
        assert label in shown, f"{name}: {label!r} missing"
    assert plt.get_fignums() == before  # nothing left open in pyplot


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_diagram_text_is_legible(name):
    """Every text at 4.5:1 on white at least (WCAG, for text: a label in a palette colour is
    darkened) and no smaller than 9 pt."""
    fig = build(name)
    shown = [t for t in fig.findobj(Text) if t.get_text() and t.get_visible()]
    assert shown
    for t in shown:
        assert contrast_ratio(t.get_color()) >= 4.5 and t.get_fontsize() >= 9, t.get_text()


def test_terms_diagram_shows_only_nonzero_terms():
    fig = diagrams.redundancy_terms_diagram({"a": 3, "b": 0, "c": 5}, "toy")
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["a", "c"] and "toy: 8 in all" in texts(fig)


def test_group_map_cells_stay_in_their_columns():
    fig = diagrams.group_map_diagram()
    FigureCanvasAgg(fig).draw()
    texts = fig.axes[0].texts
    starts = sorted({t.get_position()[0] for t in texts})
    assert len(starts) == 4 and len(texts) == 4 * 11  # header and ten rows
    for t in texts:
        box = t.get_window_extent().transformed(fig.transFigure.inverted())
        end = next((x for x in starts if x > t.get_position()[0]), 1.0)
        assert box.x1 < end - 0.005 and 0 < box.y0 < box.y1 < 1, t.get_text()
    verdicts = [t.get_text() for t in texts if t.get_position()[0] == starts[-1]][1:]
    kinds = ("confirmed", "corrected:", "missing in the source", "outside", "open;")
    assert all(v.startswith(kinds) and "(ch. " in v for v in verdicts)  # one form for all
