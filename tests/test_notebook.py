"""The notebook helpers: one table renderer, and no machine paths on the page."""
from pathlib import Path

from gaugebook.notebook import html_table, recorded_command, repo_relative
from gaugebook.results import Table

ROOT = Path(__file__).resolve().parent.parent


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
