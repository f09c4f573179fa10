"""The Colab edition (``book/colab/``, written by ``make colab`` from the executed book).

In step with ``book/`` (no kernel needed): each chapter of ``_toc.yml`` has its Colab notebook,
built from the same cells (SHA-256 recorded by ``.ci/colab_edition.py``), by the same builder,
for the release of ``gaugebook/__init__.py``, which its first cell installs. When one of these
fails, rebuild the book and regenerate: ``make book colab``.

Read like the page: no MyST syntax left in any Markdown cell (Colab would show it raw), and each
chapter shows as many images as its page. The page's count is taken from the built HTML
(``<img>`` in the page's ``<article>``) when the edition is written and recorded in the edition;
when a build of the same sources is present in ``_build/html`` it is counted again here.

The converter itself is tested on small inputs against a hand-made build.
"""
from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import nbformat
import pytest
from test_notebook_hygiene import MACHINE_PATH  # (one pattern for the page and the edition)

ROOT = Path(__file__).resolve().parent.parent
COLAB = ROOT / "book" / "colab"
BUILD = ROOT / "_build"
_spec = importlib.util.spec_from_file_location("colab_edition", ROOT / ".ci" / "colab_edition.py")
edition = sys.modules["colab_edition"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(edition)

CHAPTERS = edition.chapters()
REGENERATE = "rebuild the book and regenerate the edition: make book colab"


def colab_notebook(docname: str):
    path = COLAB / f"{Path(docname).name}.ipynb"
    assert path.is_file(), f"{path.relative_to(ROOT)} is missing: {REGENERATE}"
    return nbformat.read(path, as_version=4)


def without_code(markdown: str) -> str:
    """Markdown with fenced code blocks and inline code spans removed (MyST may appear there)."""
    kept, fence = [], None
    for line in markdown.split("\n"):
        m = re.match(r"^ {0,3}(`{3,}|~{3,})", line)
        if fence is None and m:
            fence = m[1]
        elif fence is not None and re.match(rf"^ {{0,3}}{fence[0]}{{{len(fence)},}}\s*$", line):
            fence = None
        elif fence is None:
            kept.append(line)
    return re.sub(r"(`+).+?\1", "", "\n".join(kept))


# --- the committed edition -----------------------------------------------------------------------

def test_one_notebook_per_chapter():
    assert len(CHAPTERS) == 20
    expected = {f"{Path(d).name}.ipynb" for d in CHAPTERS}
    present = {p.name for p in COLAB.glob("*.ipynb")}
    assert present == expected, f"missing {expected - present}, extra {present - expected}"


@pytest.mark.parametrize("docname", CHAPTERS)
def test_in_step_with_the_book(docname):
    nb = colab_notebook(docname)
    meta = nb.metadata[edition.METADATA_KEY]
    source = json.loads((ROOT / f"{docname}.ipynb").read_text())
    assert meta["source_sha256"] == edition.source_hash(source), \
        f"{docname}.ipynb changed after its Colab edition was written: {REGENERATE}"
    assert meta["builder_sha256"] == edition.builder_hash(), \
        f".ci/colab_edition.py changed after the edition was written: {REGENERATE}"
    assert meta["release"] == edition.release(), f"the release changed: {REGENERATE}"
    assert nb.cells[0].cell_type == "code"
    assert nb.cells[0].source == edition.install_cell_source(edition.release())
    assert f"@v{edition.release()}\"" in nb.cells[0].source


@pytest.mark.parametrize("docname", CHAPTERS)
def test_no_myst_left(docname):
    left = []
    for i, cell in enumerate(colab_notebook(docname).cells):
        if cell.cell_type != "markdown":
            continue
        text = without_code(cell.source)
        left += [f"cell {i}: {kind}: {m.group(0)!r}" for kind, pattern in edition.MYST_LEFT
                 for m in pattern.finditer(text)]
    assert not left, left[:5]


@pytest.mark.parametrize("docname", CHAPTERS)
def test_figures_as_on_the_page(docname):
    nb = colab_notebook(docname)
    recorded = nb.metadata[edition.METADATA_KEY]["page_images"]
    assert edition.notebook_images(nb) == recorded
    html = BUILD / "html" / f"{docname}.html"
    executed = BUILD / "jupyter_execute" / f"{docname}.ipynb"
    if html.is_file() and executed.is_file() and edition.source_hash(
            json.loads(executed.read_text())) == edition.source_hash(
            json.loads((ROOT / f"{docname}.ipynb").read_text())):
        assert edition.page_images(html) == recorded


@pytest.mark.parametrize("docname", CHAPTERS)
def test_no_machine_paths(docname):
    colab_notebook(docname)
    text = (COLAB / f"{Path(docname).name}.ipynb").read_text()
    text = re.sub(r"data:image/[\w+.-]+;base64,[A-Za-z0-9+/=\\n]+", "", text)
    assert not MACHINE_PATH.findall(text)


def test_edition_not_built_as_pages():
    import yaml

    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert "book/colab" in config["exclude_patterns"]


# --- the converter on small inputs ---------------------------------------------------------------

@pytest.fixture
def page():
    build = edition.Build(
        labels={"ch01-redundant": ("book/01_introduction", "ch01-redundant",
                                   "What “redundant” means"),
                "ch01-fig-path": ("book/01_introduction", "ch01-fig-path", "caption")},
        anonlabels={"ch01-redundant": ("book/01_introduction", "ch01-redundant"),
                    "ch01-fig-path": ("book/01_introduction", "ch01-fig-path"),
                    "ch01-ex1": ("book/01_introduction", "ch01-ex1")},
        terms={"jacobian rank": ("book/glossary", "term-Jacobian-rank")},
        titles={"book/01_introduction": "Introduction", "book/02_definition": "Definition"},
        fignumbers={"book/01_introduction": {"figure": {"ch01-fig-path": (1, 1)},
                                             "exercise": {"ch01-ex1": (1, 1)},
                                             "theorem": {"ch01-thm-gauge": (1, 2)}}},
        secnumbers={"book/01_introduction": {"": (1,), "#ch01-redundant": (1, 2)}},
        numfig_format={"figure": "Fig. %s", "section": "Section %s", "exercise": "Exercise %s"},
        citations={"deluca2022born": ("book/bibliography", "id7")},
        bib={"deluca2022born": ("De Luca and Silverstein", "2022")},
        macros={"GL": "\\mathrm{GL}", "R": "\\mathbb{R}"},
        exercises={"ch01-ex1": ("book/01_introduction", "Predict, then measure")},
        proofs={"ch01-thm-gauge": ("book/01_introduction", "lemma", "theorem", True)})
    glue = {"ch01-rank": {"data": {"text/plain": "156"}},
            "ch01-gap": {"data": {"text/plain": "0.031948482464750294"}},
            "ch01-name": {"data": {"text/plain": "'a_b*c'"}},
            "ch01-fig-path": {"data": {"text/plain": "<Figure>", "image/png": "iVBORw0KGgo="}}}
    return edition.Page("book/01_introduction", glue, build)


def test_glue_text_as_myst_nb_formats_it(page):
    md = edition.convert_markdown("rank {glue:text}`ch01-rank`, gap {glue:text}`ch01-gap:.1e`, "
                                  "name {glue:text}`ch01-name`", page)
    assert md == r"rank 156, gap 3.2e-02, name a\_b\*c"


def test_references_link_to_the_page(page):
    url = edition.PAGES + "book/01_introduction.html"
    assert edition.convert_markdown("{ref}`ch01-redundant`", page) == \
        f"[What “redundant” means]({url}#ch01-redundant)"
    assert edition.convert_markdown("{ref}`the count <ch01-redundant>`", page) == \
        f"[the count]({url}#ch01-redundant)"
    assert edition.convert_markdown("{numref}`ch01-fig-path`", page) == \
        f"[Fig. 1.1]({url}#ch01-fig-path)"
    assert edition.convert_markdown("{numref}`ch01-redundant`", page) == \
        f"[Section 1.2]({url}#ch01-redundant)"
    assert edition.convert_markdown("{numref}`ch01-ex1`", page) == f"[Exercise 1.1]({url}#ch01-ex1)"
    assert edition.convert_markdown("{ref}`ch01-ex1`", page) == f"[Exercise 1.1]({url}#ch01-ex1)"
    assert edition.convert_markdown("{doc}`02_definition`", page) == \
        f"[Definition]({edition.PAGES}book/02_definition.html)"
    assert edition.convert_markdown("{term}`rank <Jacobian rank>`", page) == \
        f"[rank]({edition.PAGES}book/glossary.html#term-Jacobian-rank)"
    cite = f"({edition.PAGES}book/bibliography.html#id7)"
    assert edition.convert_markdown("{cite:t}`deluca2022born`", page) == \
        f"De Luca and Silverstein [[2022]{cite}]"
    assert edition.convert_markdown("{cite:p}`deluca2022born`", page) == \
        f"[[De Luca and Silverstein, 2022]{cite}]"


def test_boxes_exercises_and_solutions(page):
    md = edition.convert_markdown(
        "```{admonition} Correction: $\\GL$\n:class: warning\n\n"
        "The source says {glue:text}`ch01-rank`.\n```\n"
        "\n```{exercise} Predict, then measure\n:label: ch01-ex1\n\nPredict $\\R^n$.\n```\n\n"
        "````{solution} ch01-ex1\n:class: dropdown\n\n"
        "It is so.\n\n```python\nx = {'a': 1}\n```\n````",
        page)
    assert "<div style=\"border-left: 4px solid #e8a317" in md
    assert "**Correction: $\\mathrm{GL}$**" in md and "The source says 156." in md
    assert "**Exercise 1.1 (Predict, then measure)**" in md and "Predict $\\mathbb{R}^n$." in md
    assert ("<details>\n<summary><b>Solution to Exercise 1.1 (Predict, then measure)</b>"
            "</summary>") in md
    assert "```python\nx = {'a': 1}\n```" in md and md.endswith("</details>")
    assert not any(p.search(without_code(md)) for _, p in edition.MYST_LEFT)


def test_theorems_and_proofs(page):
    url = edition.PAGES + "book/01_introduction.html"
    md = edition.convert_markdown(
        "```{prf:lemma} Value space, $\\GL$\n:label: ch01-thm-gauge\n\nAny $N$.\n```\n\n"
        "```{prf:proof}\nMultiply.\n```\n\nBy {prf:ref}`ch01-thm-gauge`.", page)
    assert "**Lemma 1.2 (Value space, $\\mathrm{GL}$)**" in md and "Any $N$." in md
    assert "**Proof**" in md and "Multiply." in md
    assert md.endswith(f"By [Lemma 1.2]({url}#ch01-thm-gauge).")
    assert not any(p.search(without_code(md)) for _, p in edition.MYST_LEFT)
    with pytest.raises(ValueError, match="no :label:"):
        edition.convert_markdown("```{prf:theorem} Untold\nx\n```", page)
    with pytest.raises(ValueError, match="unknown theorem label"):
        edition.convert_markdown("{prf:ref}`nowhere`", page)


def test_glued_figure_is_the_image_with_its_numbered_caption(page):
    md = edition.convert_markdown(
        "```{glue:figure} ch01-fig-path\n:alt: A [log] plot\n:name: ch01-fig-path\n\n"
        "Notice rank {glue:text}`ch01-rank`.\n```", page)
    assert md == ("![A (log) plot](data:image/png;base64,iVBORw0KGgo=)\n\n"
                  "**Fig. 1.1** Notice rank 156.")


def test_code_stays_code_and_targets_go(page):
    md = edition.convert_markdown("(ch01-x)=\n## Title\n\nUse `{glue}` roles.\n\n```python\n"
                                  "{ref}`x`\n```", page)
    assert md == "## Title\n\nUse `{glue}` roles.\n\n```python\n{ref}`x`\n```"


def test_unknown_syntax_is_an_error(page):
    with pytest.raises(ValueError, match="directive"):
        edition.convert_markdown("```{margin}\nx\n```", page)
    with pytest.raises(ValueError, match="role"):
        edition.convert_markdown("{eq}`x`", page)
    with pytest.raises(ValueError, match="no glued text"):
        edition.convert_markdown("{glue:text}`missing`", page)


def test_cells_as_on_the_page(page):
    source = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell('# Colab\nif "google.colab" in sys.modules: pass',
                                  metadata={"tags": ["remove-cell"]}),
        nbformat.v4.new_markdown_cell("# Introduction"),
        nbformat.v4.new_markdown_cell("hidden", metadata={"tags": ["remove-cell"]}),
        nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["remove-input"]}),
        nbformat.v4.new_code_cell("y = 2", metadata={"tags": ["remove-output"]}),
        nbformat.v4.new_code_cell("z = 3", metadata={"tags": ["remove-cell"]}),
        nbformat.v4.new_code_cell("w = 4"),
        nbformat.v4.new_code_cell("v = 5", metadata={"tags": ["hide-input"]}),
        nbformat.v4.new_code_cell("u = 6", metadata={
            "tags": ["hide-input"], "mystnb": {"code_prompt_show": "Show code: the claims"}}),
    ])
    executed = nbformat.from_dict(json.loads(json.dumps(source)))
    shown = nbformat.v4.new_output("display_data", {"text/plain": "1"})
    widget = nbformat.v4.new_output("display_data", {"text/plain": "Explorer(...)",
                                                     edition.WIDGET_VIEW: {"model_id": "x"}})
    for cell in executed.cells[3:]:
        cell.outputs = [shown, widget]
    nb = edition.convert_notebook(source, executed, page, "9.9.9")
    assert [c.cell_type for c in nb.cells] == ["code", "markdown", "markdown", "code", "code",
                                               "code", "code", "code", "code"]
    install, note, _, folded, no_output, removed, plain, collapsed, titled = nb.cells
    assert edition.PAGES + "book/01_introduction.html" in note.source
    assert install.source == edition.install_cell_source("9.9.9") and "@v9.9.9" in install.source
    assert folded.metadata["cellView"] == "form" and folded.source.endswith("x = 1")
    assert folded.outputs == [shown]
    assert no_output.outputs == [] and "cellView" not in no_output.metadata
    assert removed.metadata["cellView"] == "form" and removed.outputs == []
    assert plain.source == "w = 4" and plain.outputs == [shown] and "cellView" not in plain.metadata
    assert collapsed.metadata["cellView"] == "form" and collapsed.source.endswith("\nv = 5")
    assert collapsed.source.startswith("# @title ") and collapsed.outputs == [shown]
    assert titled.source == "# @title The claims (collapsed on the page)\nu = 6"
    twin = nbformat.v4.new_output("display_data", {"text/plain": "Explorer(...)",
                                                   edition.WIDGET_VIEW: {"model_id": "x"},
                                                   "text/html": "<div>static twin</div>"})
    assert [o["data"] for o in edition.page_outputs([twin, widget])] == [
        {"text/plain": "Explorer(...)", "text/html": "<div>static twin</div>"}]
    table = nbformat.v4.new_output("display_data", {"text/plain": "<results.Table at 0x7fe4>",
                                                    "text/html": "<table></table>"})
    bare = nbformat.v4.new_output("display_data", {"text/plain": "<object object at 0x7fe4>"})
    assert [o["data"] for o in edition.page_outputs([table, bare])] == [
        {"text/html": "<table></table>"}, {"text/plain": "<object object at 0x7fe4>"}]
    executed.cells[6].outputs = [nbformat.v4.new_output("error", ename="E", evalue="",
                                                         traceback=[])]
    with pytest.raises(ValueError, match="cell 6 raised"):
        edition.convert_notebook(source, executed, page, "9.9.9")
    executed.cells[6].source = "w = 5"
    with pytest.raises(ValueError, match="older than book"):
        edition.convert_notebook(source, executed, page, "9.9.9")


# --- what a Colab runtime gets without a checkout ------------------------------------------------

def test_recorded_results_ship_in_the_wheel(tmp_path):
    """The wheel (what the install cell installs) carries results/ (GPU and CPU runs) and
    benchmarks/results/ as gaugebook/_recorded/, byte for byte."""
    import subprocess
    import zipfile

    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path), str(ROOT)], check=True, cwd=tmp_path)
    (wheel,) = tmp_path.glob("gaugebook-*.whl")
    recorded = sorted([*ROOT.glob("results/gpu/*/*.json"), *ROOT.glob("results/cpu/*/*.json"),
                       *ROOT.glob("benchmarks/results/*.json")])
    assert len(recorded) >= 17 + 21
    with zipfile.ZipFile(wheel) as z:
        shipped = {n for n in z.namelist() if n.startswith("gaugebook/_recorded/")}
        inside = {f"gaugebook/_recorded/{p.relative_to(ROOT).as_posix()}": p for p in recorded}
        assert shipped == set(inside)
        for name, path in inside.items():
            assert z.read(name) == path.read_bytes()


def test_citations_take_the_books_labels():
    """The edition cites with the rendered book's labels (book/_ext/author_year.py): the paper
    and the code of Silverstein et al. are told apart by a letter, as on the page."""
    bib = edition.read_bib([ROOT / "book" / "references.bib"])
    assert bib["silverstein2026code"] == ("Silverstein et al.", "2026a")
    assert bib["silverstein2026symmetry"] == ("Silverstein et al.", "2026b")
    assert bib["deluca2022born"] == ("De Luca and Silverstein", "2022")
