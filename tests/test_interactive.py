"""gaugebook.interactive: the static explorer holds every frame of its grid, shows exactly the
current one, and the explorers' static twins agree with their live readouts."""
import base64
import io
import re

import pytest
import torch
from matplotlib.figure import Figure
from PIL import Image

from gaugebook.interactive import Control, StaticExplorer, figure_html
from gaugebook.noether_widgets import ChargeDriftExplorer, ChargeDriftGrid
from gaugebook.widgets import ConditionExplorer, OrbitExplorer

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def frames(markup: str) -> dict[str, tuple[bool, str]]:
    """data-gb-frame key -> (hidden, content)."""
    return {key: (bool(hidden), body) for key, hidden, body in re.findall(
        r'<div data-gb-frame="([^"]*)"( hidden)?>(.*?)</div>(?=<div data-gb-frame|</div>)',
        markup)}


def test_grid_is_the_product_of_the_controls():
    calls = []

    def frame(a, b):
        calls.append((a, b))
        return f"<p>{a}-{b}</p>"

    ex = StaticExplorer([Control("a", [1, 2, 3], value=2), Control("b", ["x", "y"],
                                                                   kind="dropdown")],
                        frame, alt="test")
    assert sorted(calls) == sorted((a, b) for a in (1, 2, 3) for b in "xy")
    found = frames(ex._repr_html_())
    assert len(found) == 6
    visible = [k for k, (hidden, _) in found.items() if not hidden]
    assert visible == ["1,0"] and found["1,0"][1] == "<p>2-x</p>"
    assert found["2,1"][1] == "<p>3-y</p>"


def test_markup_has_controls_script_and_a_stable_id():
    make = lambda: StaticExplorer([Control("c", [0.5, 1.5])], lambda c: f"{c}", alt="a & b")
    markup = make()._repr_html_()
    assert markup == make()._repr_html_()  # deterministic: the same page in every build
    assert '<input type="range" min="0" max="1"' in markup and 'aria-label="a &amp; b"' in markup
    uid = re.search(r'id="(gb-ix-[0-9a-f]+)"', markup).group(1)
    assert f'document.getElementById("{uid}")' in markup
    assert "let " not in markup and "const " not in markup  # nothing declared at page scope


def test_sliders_announce_their_labels_and_frames_sit_in_a_live_region():
    """A screen reader hears a slider's label (aria-valuetext), not its index; each <output>
    names its control (for = the control's id, unique to the explorer); the frames are in an
    aria-live region, so that the frame a move brings up is read out."""
    ex = StaticExplorer([Control("s", [1.0, 2.0, 3.0], value=2.0,
                                 labels=["+1.00", "+2.00", "+3.00"]),
                         Control("dtype", ["a", "b"], kind="dropdown")],
                        lambda s, d: f"<p>{s}{d}</p>", alt="test")
    markup = ex._repr_html_()
    uid = re.search(r'id="(gb-ix-[0-9a-f]+)"', markup).group(1)
    slider = re.search(r"<input [^>]*>", markup).group(0)
    assert f'id="{uid}-0"' in slider and 'aria-valuetext="+2.00"' in slider
    assert f'<output for="{uid}-0">+2.00</output>' in markup
    assert f'<select id="{uid}-1"' in markup and markup.count("<output") == 1
    # each control, with its value, in one span that the style sheet keeps on one line
    assert markup.count('<span class="gb-control">') == 2
    assert re.search(r'<span class="gb-control"><label>s <input [^>]*></label> <output '
                     r'[^>]*>\+2\.00</output></span>', markup)
    live = re.search(r'<div class="gb-frames" aria-live="polite">(.*)</div></div><script>',
                     markup).group(1)
    assert len(frames(live + "</div>")) == 6  # every frame inside the live region
    assert 'setAttribute("aria-valuetext", label)' in markup
    assert "output[for=\"' + c.id + '\"]" in markup


def test_control_validation():
    with pytest.raises(ValueError, match="at least two"):
        Control("c", [1])
    with pytest.raises(ValueError, match="not among"):
        Control("c", [1, 2], value=3)
    with pytest.raises(ValueError, match="labels"):
        Control("c", [1, 2], labels=["one"])
    with pytest.raises(ValueError, match="kind"):
        Control("c", [1, 2], kind="knob")
    with pytest.raises(ValueError, match="at least one control"):
        StaticExplorer([], lambda: "", alt="")


def test_figure_html_is_an_inline_png_with_alt_text():
    fig = Figure()
    fig.subplots().plot([0, 1], [1, 0])
    fig.set_size_inches(4, 3)
    markup = figure_html(fig, alt='a "line"', dpi=80)
    assert markup.startswith('<img src="data:image/png;base64,iVBOR')
    assert 'alt="a &quot;line&quot;"' in markup
    assert 'width="320" height="240"' in markup  # CSS pixels: 80 per inch
    data = re.search(r'base64,([^"]+)"', markup).group(1)
    image = Image.open(io.BytesIO(base64.b64decode(data)))
    assert image.size == (640, 480) and image.mode == "P"  # drawn at twice that, 256 colours


@pytest.mark.parametrize("make", [
    lambda: OrbitExplorer(s=1.0, s_max=1.0),
    lambda: ConditionExplorer(seeds=1, cond=10.0, log10_max=1.0),
])
def test_explorer_twin_matches_the_live_readout(make):
    explorer = make()
    bundle = explorer._repr_mimebundle_()
    assert WIDGET_VIEW in bundle  # Jupyter and Colab still get the live widget
    found = frames(bundle["text/html"])
    (key,) = [k for k, (hidden, _) in found.items() if not hidden]
    assert found[key][1] == explorer.readout.value  # the page starts where the widget does
    assert len(set(body for _, body in found.values())) == len(found)  # every frame differs


def test_charge_drift_twin_covers_the_grid():
    grid = ChargeDriftGrid(scales=(0.0, 1.0), spreads=(0.0, 1.0), time=1.0,
                           J=torch.tensor([[0.0, 0.5], [0.3, 0.4]]),
                           PJP=torch.tensor([[0.0, 0.2], [1e-14, 0.1]]),
                           weights=torch.tensor([[0.1, 0.2], [0.3, 0.4]]))
    explorer = ChargeDriftExplorer(grid, scale=1.0, spread=0.0)
    found = frames(explorer._repr_mimebundle_()["text/html"])
    assert len(found) == 4 and found["1,0"] == (False, explorer.readout.value)
