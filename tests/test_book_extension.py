"""The book's Sphinx extensions (``book/_ext/``): launch buttons at the release tag, Colab on the
Colab edition, and each inline script once (the ``THEBE_JS_URL`` error); the lists page; the
figures' files for slides."""
import importlib.util
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import gaugebook
from gaugebook.notebook import FIGURES_ENV

_assets = pytest.importorskip("sphinx.builders.html._assets")

PATH = Path(__file__).resolve().parents[1] / "book" / "_ext" / "gaugebook_book.py"
spec = importlib.util.spec_from_file_location("gaugebook_book", PATH)
ext = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ext)

REPO = "gaugebook/gaugebook"


def test_launch_buttons_open_the_release_tag():
    config = SimpleNamespace(html_theme_options={"repository_branch": "main"})
    ext.launch_release(None, config)
    assert config.html_theme_options["repository_branch"] == f"v{gaugebook.__version__}"


def test_no_header_bar_unless_the_config_asks_for_one():
    config = SimpleNamespace(html_theme_options={})
    ext.no_header_bar(None, config)
    assert config.html_theme_options["navbar_persistent"] == []
    config = SimpleNamespace(html_theme_options={"navbar_persistent": ["search-button-field"]})
    ext.no_header_bar(None, config)
    assert config.html_theme_options["navbar_persistent"] == ["search-button-field"]


def launch_context(pagename, branch="v0.1.0"):
    buttons = [
        {"text": "Binder", "url": f"https://mybinder.org/v2/gh/{REPO}/{branch}"
                                  f"?urlpath=lab/tree/{pagename}.ipynb"},
        {"text": "Colab", "url": f"https://colab.research.google.com/github/{REPO}/blob/{branch}/"
                                 f"{pagename}.ipynb"},
    ]
    return {"header_buttons": [{"label": "download-buttons", "buttons": []},
                               {"label": "launch-buttons", "buttons": buttons}]}


def test_colab_opens_the_colab_edition_and_binder_the_chapter():
    context = launch_context("book/05_rope")
    ext.colab_edition(None, "book/05_rope", "page.html", context, None)
    binder, colab = context["header_buttons"][1]["buttons"]
    assert colab["url"] == (f"https://colab.research.google.com/github/{REPO}/blob/v0.1.0/"
                            "book/colab/05_rope.ipynb")
    assert binder["url"].endswith("?urlpath=lab/tree/book/05_rope.ipynb")


def test_each_inline_script_once():
    js = _assets._JavaScript
    body = 'const THEBE_JS_URL = "x"'
    scripts = [js("_static/doctools.js", priority=200), js(None, body=body), js("", body=body),
               js("", body="var other = 1")]
    context = {"script_files": scripts}
    ext.each_script_once(None, "book/05_rope", "page.html", context, None)
    assert context["script_files"] is scripts  # the same list, edited in place
    assert [s.attributes.get("body") for s in scripts] == [None, body, "var other = 1"]


def test_pages_start_in_a_valid_colour_mode():
    context = {}
    ext.default_mode(None, "book/05_rope", "page.html", context, None)
    assert context["default_mode"] == "auto"  # not "", which the theme's script logs as an error
    context = {"default_mode": "dark"}
    ext.default_mode(None, "book/05_rope", "page.html", context, None)
    assert context["default_mode"] == "dark"


EXT = Path(__file__).resolve().parents[1] / "book" / "_ext"
sys.path.insert(0, str(EXT))  # as Sphinx's local_extensions do: book_lists imports figure_files
import figure_files  # noqa: E402

LISTS = EXT / "book_lists.py"
lists_spec = importlib.util.spec_from_file_location("book_lists", LISTS)
lists = importlib.util.module_from_spec(lists_spec)
lists_spec.loader.exec_module(lists)


def test_a_listed_title_loses_the_parentheses_the_page_puts_around_it():
    from docutils import nodes

    def titled(*children):
        return nodes.section("", nodes.title("", "", *children))

    assert lists._title(titled(nodes.Text(" (Stabiliser of a pair)"))).astext() == \
        "Stabiliser of a pair"
    math = titled(nodes.Text(" (The group "), nodes.math("", "S_H"), nodes.Text(")"))
    inner = lists._title(math)
    assert inner.astext() == "The group S_H" and isinstance(inner.children[1], nodes.math)
    assert lists._title(titled(nodes.Text(" (A (★☆☆, 15 min))"))).astext() == "A (★☆☆, 15 min)"
    assert lists._title(titled()) is None and lists._title(nodes.section()) is None


def test_a_figure_is_listed_with_the_first_sentence_of_its_caption():
    from docutils import nodes

    figure = nodes.figure("", nodes.caption("", "", nodes.Text("An orbit, in "),
                                            nodes.math("", "\\mathbb R^3"),
                                            nodes.Text(". The rest: more.")), ids=["f"])
    name, first = lists._figure(figure, {"figure": {"f": (4, 2)}})
    assert name == "Figure 4.2" and first.astext() == "An orbit, in \\mathbb R^3."
    assert lists._figure(figure, {}) is None  # not numbered: not listed


def test_a_listed_caption_links_into_its_chapter():
    """A caption's link to another figure of its chapter (``#id``) points into the chapter
    once the caption is copied to the page of lists; links to other pages stay as they are."""
    from docutils import nodes

    title = nodes.inline("", "", nodes.reference("", "Fig. 17.1", refid="ch17-fig-curves"),
                         nodes.reference("", "Fig. 17.2", refuri="#ch17-fig-toy"),
                         nodes.reference("", "ch. 16", refuri="16_protocol.html#top"))
    lists._rebase(title, "17_experiment.html")
    refs = list(title.findall(nodes.reference))
    assert [r["refuri"] for r in refs] == ["17_experiment.html#ch17-fig-curves",
                                           "17_experiment.html#ch17-fig-toy",
                                           "16_protocol.html#top"]
    assert not any("refid" in r for r in refs)  # the HTML writer would prefer it


def test_a_figure_links_to_its_slide_files_from_any_page(tmp_path, monkeypatch):
    builder = SimpleNamespace(format="html", get_target_uri=lambda doc: doc + ".html")
    app = SimpleNamespace(outdir=str(tmp_path), builder=builder)
    monkeypatch.delenv(FIGURES_ENV, raising=False)
    figure_files.set_folder(app)
    assert os.environ[FIGURES_ENV] == str(tmp_path / "figures")
    assert figure_files.links(app, "book/lists", "ch05-fig-a") == []  # nothing saved yet
    (tmp_path / "figures").mkdir()
    for suffix in ("svg", "png"):
        (tmp_path / "figures" / f"ch05-fig-a.{suffix}").write_text("")
    found = figure_files.links(app, "book/lists", "ch05-fig-a")
    assert [(n.astext(), n["refuri"]) for n in found] == [
        ("SVG", "../figures/ch05-fig-a.svg"), ("PNG, 300 dpi", "../figures/ch05-fig-a.png")]
    assert figure_files.links(app, "index", "ch05-fig-a")[0]["refuri"] == "figures/ch05-fig-a.svg"


def test_a_figure_image_opens_its_300_dpi_png(tmp_path):
    from docutils import nodes

    builder = SimpleNamespace(format="html", get_target_uri=lambda doc: doc + ".html")
    app = SimpleNamespace(outdir=str(tmp_path), builder=builder)
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "ch05-fig-a.png").write_text("")

    def page():
        saved = nodes.figure("", nodes.image(uri="a.png"), ids=["ch05-fig-a"])
        unsaved = nodes.figure("", nodes.image(uri="b.png"), ids=["ch05-fig-b"])
        return nodes.section("", saved, unsaved)

    doctree = page()
    figure_files.link_images(app, doctree, "book/05_rope")
    saved, unsaved = doctree.findall(nodes.figure)
    link = saved[0]
    assert isinstance(link, nodes.reference) and link["refuri"] == "../figures/ch05-fig-a.png"
    assert "gb-full-size" in link["classes"] and isinstance(link[0], nodes.image)
    assert isinstance(unsaved[0], nodes.image)  # no file: left to gaugebook.js
    figure_files.link_images(app, doctree, "book/05_rope")  # a second pass changes nothing
    assert isinstance(saved[0], nodes.reference) and isinstance(saved[0][0], nodes.image)
    app.builder.format = "latex"
    other = page()
    figure_files.link_images(app, other, "book/05_rope")
    assert isinstance(next(other.findall(nodes.figure))[0], nodes.image)


def test_citation_labels_name_each_work_once_and_sort_by_surname(tmp_path):
    import author_year

    bib = tmp_path / "refs.bib"
    bib.write_text("""
@misc{paper, author = {Silverstein, Eva and Kunin, Daniel and Shyam, Vasudev},
  title = {Symmetry Breaking}, year = {2026}}
@misc{code, author = {Silverstein, Eva and Kunin, Daniel and Shyam, Vasudev},
  title = {Code for Symmetry Breaking}, year = {2026}}
@misc{wiki, author = {{Gauge symmetry wiki}}, title = {Wiki}, year = {2025}}
@misc{pair, author = {Nanda, Neel and Bloom, Joseph}, title = {Lens}, year = {2022}}
@misc{one, author = {Noether, Emmy}, title = {Invariante}, year = {1918}}
""")
    labels = author_year.citation_labels([bib])
    # by surname (a braced organisation by its letters, not after every "z"), then year and title
    assert list(labels) == ["wiki", "pair", "one", "code", "paper"]
    assert labels == {"wiki": "Gauge symmetry wiki, 2025", "pair": "Nanda and Bloom, 2022",
                      "one": "Noether, 1918", "code": "Silverstein et al., 2026a",
                      "paper": "Silverstein et al., 2026b"}
