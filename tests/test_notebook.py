"""The notebook helpers: one table renderer, no machine paths on the page, and the small
helpers that the chapters' checks share."""
from pathlib import Path

import pytest
import torch

from gaugebook.attention import MultiHeadAttention
from gaugebook.notebook import (FIGURES_ENV, flat, glue, html_table, recorded_command,
                                relative_change, repo_relative, with_weights)
from gaugebook.results import Table

ROOT = Path(__file__).resolve().parent.parent


def test_with_weights_refuses_a_value_that_would_broadcast():
    layer = MultiHeadAttention(8, 2, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"W_Q has shape \(2, 8, 4\)"):
        with_weights(layer, W_Q=torch.ones(8, 4))  # one head's matrix into both heads
    assert torch.equal(with_weights(layer, W_Q=torch.ones(2, 8, 4)).W_Q, torch.ones(2, 8, 4))


def test_html_table_keeps_cells_as_html():
    table = html_table(["d<sub>k</sub>", "count"],
                       [["GL(d<sub>k</sub>)", 12], ["S<sub>h</sub>", 1.5]])
    html = table._repr_html_()
    assert isinstance(table, Table)
    assert "<th" in html and "d<sub>k</sub></th>" in html and "GL(d<sub>k</sub>)</td>" in html
    assert ">12</td>" in html and ">1.5</td>" in html  # str(cell): no float format imposed
    assert html.count("<tr>") == 3


def test_html_table_caption():
    assert "<caption>Groups</caption>" in html_table(["a"], [[1]], caption="Groups").to_html()


def test_repo_relative_inside_the_repository():
    assert repo_relative(ROOT / "results" / "gpu" / "seed0", root=ROOT) == "results/gpu/seed0"
    assert repo_relative("results/gpu/seed0", root=ROOT) == "results/gpu/seed0"


def test_repo_relative_of_another_machine():
    colab = "/content/gaugebook/results/gpu/seed0"
    assert repo_relative(colab, root=ROOT) == "results/gpu/seed0"
    assert repo_relative("/somewhere/else.txt", root=ROOT) == "/somewhere/else.txt"


def test_recorded_command_shows_the_file_in_the_repository():
    command = "python benchmarks/bench_training.py --device cuda --out /root/out/bench_h200.json"
    assert recorded_command(command, "benchmarks/results/h200.json") == (
        "python benchmarks/bench_training.py --device cuda --out benchmarks/results/h200.json")
    relative = "python b.py --out benchmarks/results/cpu.json --steps 60"
    assert recorded_command(relative, "benchmarks/results/cpu.json") == relative


def test_relative_change_is_relative_to_the_old_tensor():
    old = torch.tensor([[1.0, -4.0], [2.0, 0.5]], dtype=torch.float64)
    new = old.clone()
    new[1, 0] += 0.5
    assert relative_change(new, old) == pytest.approx(0.5 / 4.0)
    assert relative_change(old, old) == 0.0
    assert relative_change(3.0 * old, old) == pytest.approx(2.0 * 4.0 / 4.0)


def test_relative_change_refuses_an_all_zero_reference():
    with pytest.raises(ValueError, match="reference tensor is all zero"):
        relative_change(torch.ones(3), torch.zeros(3))


def test_relative_change_of_module_outputs(generator):
    m = MultiHeadAttention(4, 2, 2, dtype=torch.float64, generator=generator)
    x = torch.randn(2, 3, 4, generator=generator, dtype=torch.float64)
    scaled = with_weights(m, W_O=2.0 * m.W_O)  # the output doubles exactly
    assert isinstance(relative_change(scaled(x), m(x)), float)  # outputs that need grad
    assert relative_change(scaled(x), m(x)) == pytest.approx(1.0)


def test_flat_and_with_weights(generator):
    m = MultiHeadAttention(4, 2, 2, bias=True, dtype=torch.float64, generator=generator)
    theta = flat(m)
    assert theta.shape == (sum(p.numel() for p in m.parameters()),) and not theta.requires_grad
    assert torch.equal(theta[: m.W_Q.numel()], m.W_Q.detach().reshape(-1))
    new_q = torch.zeros_like(m.W_Q)
    moved = with_weights(m, W_Q=new_q, b_O=m.b_O + 1.0)
    assert torch.equal(moved.W_Q, new_q) and torch.equal(moved.b_O, m.b_O + 1.0)
    assert torch.equal(moved.W_K, m.W_K) and moved.W_Q.requires_grad
    assert torch.equal(flat(m), theta)  # the module passed in is unchanged
    assert flat(moved).shape == theta.shape


def test_a_glued_figure_is_saved_for_slides_only_when_the_build_asks(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt
    from PIL import Image

    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0, 1], [0, 1])
    monkeypatch.delenv(FIGURES_ENV, raising=False)
    glue("ch00-fig-line", fig, display_value=False)
    assert not any(tmp_path.iterdir())  # no folder named: nothing written
    monkeypatch.setenv(FIGURES_ENV, str(tmp_path / "figures"))
    glue("ch00-fig-line", fig, display_value=False)
    glue("ch00-number", 3.5, display_value=False)  # not a figure: not saved
    plt.close(fig)
    files = sorted(p.name for p in (tmp_path / "figures").iterdir())
    assert files == ["ch00-fig-line.png", "ch00-fig-line.svg"]
    assert (tmp_path / "figures" / "ch00-fig-line.svg").read_text().lstrip().startswith("<?xml")
    width, _ = Image.open(tmp_path / "figures" / "ch00-fig-line.png").size
    assert width > 3.5 * 300  # 300 dpi: a 4-inch figure (less the trimmed margin)
