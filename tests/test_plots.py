"""gaugebook.plots: the palette's data colours reach 3:1 on white, and text_colour darkens a
colour to text contrast without changing its hue."""
import pytest
from matplotlib.colors import to_rgb

from gaugebook.plots import PALETTE, contrast_ratio, text_colour


def test_contrast_ratio_is_wcags():
    assert contrast_ratio("black") == pytest.approx(21.0)
    assert contrast_ratio("white") == pytest.approx(1.0)
    assert contrast_ratio("#777777") == pytest.approx(4.48, abs=0.01)  # WCAG's classic example
    assert contrast_ratio("white", "#777777") == contrast_ratio("#777777", "white")


def test_data_colours_reach_three_to_one_on_white():
    """The first five colours carry data lines (the cycle's first five): 3:1 at least, WCAG's
    minimum for a graphical object; the orange, PALETTE[1], is darkened from Okabe-Ito's."""
    assert [c for c in PALETTE[:5] if contrast_ratio(c) < 3] == []
    assert contrast_ratio("#E69F00") < 3 <= contrast_ratio(PALETTE[1])


@pytest.mark.parametrize("colour", PALETTE)
def test_text_colour_darkens_only_as_far_as_it_must_and_keeps_the_hue(colour):
    dark = text_colour(colour)
    assert contrast_ratio(dark) >= 4.5
    rgb = to_rgb(colour)
    if contrast_ratio(colour) >= 4.5:
        assert dark == rgb  # dark enough already: unchanged
        return
    t = 1 - max(dark) / max(rgb)  # mixed with black: (1 - t) * rgb, the same hue
    assert dark == pytest.approx([(1 - t) * c for c in rgb])
    assert contrast_ratio(dark) == pytest.approx(4.5, abs=1e-6)  # the least darkening


def test_text_colour_for_another_ratio():
    assert contrast_ratio(text_colour("#E69F00", 3.0)) == pytest.approx(3.0, abs=1e-6)


def test_a_range_band_has_a_faint_fill_and_an_edge_in_the_full_colour():
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgba

    from gaugebook.plots import range_band

    fig, ax = plt.subplots()
    band = range_band(ax, [1, 2, 3], [0, 1, 2], [1, 2, 4], PALETTE[0], label="seeds")
    assert tuple(band.get_facecolor()[0]) == pytest.approx(to_rgba(PALETTE[0], 0.25))
    assert tuple(band.get_edgecolor()[0]) == pytest.approx(to_rgba(PALETTE[0]))
    assert band.get_linewidth()[0] == pytest.approx(0.6) and band.get_label() == "seeds"
    plt.close(fig)
