"""What a reader sees in the rendered book: teaching code apart from bookkeeping (issue 11).

A code cell is *visible* when the page shows its source: cells tagged ``remove-input``,
``remove-cell`` or ``hide-input`` (collapsed, one click away) are not. Over ``book/*.ipynb``:

- no visible cell calls ``glue(`` (gluing is bookkeeping),
- no visible cell holds an ``assert`` (a guard assert is bookkeeping too: it goes in the hidden
  cell that shows the result, so the build still fails when the text stops being true),
- no code line is wider than 88 characters, in a visible cell or a hidden one (a folded cell
  scrolls sideways once opened, and the Colab edition shows every cell),
- no line of code shown in a fence of a markdown cell or page (``book/*.md``), such as an
  exercise's solution, is wider than 88 characters either,
- no visible cell is longer than 45 lines (normally they are <= 25),
- no notebook defines its own ``html_table`` (``gaugebook.notebook.html_table`` is the one),
- every chapter's set-up (import) cell is hidden,
- the visible code of the whole book is at most half of the 7,025 lines it had (issue 11),
- no visible cell and no committed output shows a machine path (``/work/...``, ``/home/...``),
- every value a notebook glues is shown by some page (an unused glue is dead code),
- every notebook is valid under its own nbformat version (Colab and nbclient reject others),
- a folded cell's own toggle title (``mystnb.code_prompt_show``) reads "Show code: <what>", the
  form the Colab edition turns into its title, and only a folded (``hide-input``) cell has one,
- no chapter's markdown uses a TeX macro that only the rendered book defines (``_config.yml``):
  Jupyter, JupyterLab on Binder, VS Code and GitHub show the notebook without it;
- every chapter numbers its learning objectives, every exercise names the ones it practises,
  and every objective has an exercise,
- every library name the text of a chapter or page spells out (``gaugebook.module.name``)
  exists (chapter 4 named a basis function after it had moved and been renamed).

These read the notebooks' JSON only (no kernel), so they are cheap. Run this file as a script
(``python tests/test_notebook_hygiene.py``) to print the numbers per chapter.
"""
from __future__ import annotations

import ast
import importlib.util
import json
import re
import sys
from pathlib import Path

import yaml

BOOK = Path(__file__).resolve().parent.parent / "book"
NOTEBOOKS = sorted(BOOK.glob("*.ipynb"))
HIDDEN_TAGS = {"remove-input", "remove-cell", "hide-input"}
MAX_COLUMNS = 88
MAX_CELL_LINES = 45  # a visible cell is normally <= 25 lines; none is a page long
LINES_BEFORE = 7025  # visible code lines of the book when issue 11 was filed
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|home|tmp|root|Users|mnt|scratch)/")


def code_cells(path: Path) -> list[dict]:
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def source(cell: dict) -> str:
    return "".join(cell["source"])


FENCE = re.compile(r"^\s*(`{3,}|~{3,})(.*)$")
CODE_FENCE = re.compile(r"python|bash|sh|console|text|ipython3?|\{code-block\}|\{code-cell\}")


def markdown_texts(path: Path) -> list[str]:
    """A page's text, or the sources of a notebook's markdown cells."""
    if path.suffix == ".md":
        return [path.read_text()]
    return [source(c) for c in json.loads(path.read_text())["cells"]
            if c["cell_type"] == "markdown"]


def fenced_code(text: str) -> list[str]:
    """The lines inside the code fences of a MyST text. A fence is code when it is bare or names
    a language, ``{code-block}`` or ``{code-cell}``; the fence of another directive (such as
    ``{solution}`` or ``{admonition}``) is not, but it may hold code fences."""
    lines, stack = [], []  # stack: (fence, is_code) of every open fence
    for line in text.split("\n"):
        if m := FENCE.match(line):
            fence, info = m.group(1), m.group(2).strip()
            if stack and not info and fence == stack[-1][0]:
                stack.pop()
            else:
                stack.append((fence, not info or bool(CODE_FENCE.match(info))))
        elif stack and stack[-1][1]:
            lines.append(line)
    return lines


def visible(cell: dict) -> bool:
    return not HIDDEN_TAGS & set(cell.get("metadata", {}).get("tags", []))


def measure(path: Path) -> dict:
    """Counts over the visible code cells of one notebook."""
    cells = [c for c in code_cells(path) if visible(c)]
    lines = [source(c).splitlines() for c in cells]
    return {
        "cells": len(cells),
        "lines": sum(map(len, lines)),
        "glue_cells": sum("glue(" in source(c) for c in cells),
        "wide_lines": sum(len(line) > MAX_COLUMNS for cell in lines for line in cell),
        "long_cells": sum(len(cell) > 25 for cell in lines),
        "html_table_defs": sum("def html_table" in source(c) for c in code_cells(path)),
    }


def offenders(check) -> list[str]:
    return [f"{p.name}: {n}" for p in NOTEBOOKS if (n := check(p))]


def test_there_are_chapters():
    assert len(NOTEBOOKS) >= 20


def test_no_visible_glue():
    assert offenders(lambda p: measure(p)["glue_cells"]) == []


def test_no_visible_assert():
    def asserts(path):
        found = []
        for c in code_cells(path):
            if visible(c):  # IPython's magics and shell escapes are not Python
                code = "\n".join(line for line in source(c).splitlines()
                                 if not line.lstrip().startswith(("%", "!")))
                found += [ast.unparse(node)[:40] for node in ast.walk(ast.parse(code))
                          if isinstance(node, ast.Assert)]
        return found

    assert offenders(asserts) == []


def test_no_code_line_wider_than_88():
    def wide(path):
        return [f"{line[:40]}... ({len(line)})" for c in code_cells(path)
                for line in source(c).splitlines() if len(line) > MAX_COLUMNS]

    assert offenders(wide) == []


def test_no_fenced_code_line_wider_than_88():
    sample = "````{solution} x\n:class: dropdown\n\n```python\nx = 1\n```\nprose\n````\n"
    assert fenced_code(sample) == ["x = 1"]
    pages = [*NOTEBOOKS, *sorted(BOOK.glob("*.md"))]
    shown = {p: [line for text in markdown_texts(p) for line in fenced_code(text)] for p in pages}
    assert sum(map(len, shown.values())) > 0  # the parser finds the solutions' code
    wide = [f"{p.name}: {line[:40]}... ({len(line)})" for p, lines in shown.items()
            for line in lines if len(line) > MAX_COLUMNS]
    assert wide == []


def test_no_visible_cell_longer_than_45_lines():
    def long(path):
        return [len(source(c).splitlines()) for c in code_cells(path)
                if visible(c) and len(source(c).splitlines()) > MAX_CELL_LINES]

    assert offenders(long) == []


def test_one_table_helper():
    assert offenders(lambda p: measure(p)["html_table_defs"]) == []


def test_set_up_cell_is_hidden():
    def visible_set_up(path):
        imports = [c for c in code_cells(path)
                   if re.search(r"^(import|from) \w", source(c), re.M)
                   and "google.colab" not in source(c)]
        return bool(imports) and visible(imports[0])

    assert offenders(visible_set_up) == []


def test_visible_code_is_at_most_half_of_before():
    total = sum(measure(p)["lines"] for p in NOTEBOOKS)
    assert total <= LINES_BEFORE // 2, total


def test_no_machine_paths():
    def paths(path):
        found = []
        for c in code_cells(path):
            texts = [source(c)] if visible(c) else []
            for out in c.get("outputs", []):
                texts.append("".join(out.get("text", "")))
                texts.extend("".join(v) if isinstance(v, list) else str(v)
                             for v in out.get("data", {}).values())
            found += [m.group() for t in texts for m in MACHINE_PATH.finditer(t)]
        return found

    assert offenders(paths) == []


GLUED = re.compile(r"""\bglue\(\s*(f?)(["'])(.+?)\2""")
SHOWN = re.compile(r"\{glue(?::\w+)?\}`([^`:]+)|\{glue:figure\}\s+([^\s\\]+)")


def test_every_glued_value_is_shown():
    pages = "".join(p.read_text() for p in [*BOOK.glob("*.ipynb"), *BOOK.glob("*.md")])
    shown = {a or b for a, b in SHOWN.findall(pages)}
    unused = []
    for path in NOTEBOOKS:
        for c in code_cells(path):
            for f, _, name in GLUED.findall(source(c)):
                # an f-string name ("ch17-seed{seed}") stands for every name it can make
                pattern = re.sub(r"\\\{.*?\\\}", ".+", re.escape(name)) if f else re.escape(name)
                if not any(re.fullmatch(pattern, s) for s in shown):
                    unused.append(f"{path.name}: {name}")
    assert unused == []


def test_notebooks_are_valid_nbformat():
    import nbformat

    def invalid(path):
        notebook = nbformat.reads(path.read_text(), as_version=nbformat.NO_CONVERT)
        ids = [c["id"] for c in notebook.cells if "id" in c]
        if len(set(ids)) < len(ids):  # validate() repairs these silently, with a warning
            return "duplicate cell ids"
        try:
            nbformat.validate(notebook)
        except nbformat.ValidationError as error:
            return str(error).splitlines()[0]
        return ""

    assert offenders(invalid) == []


def test_toggle_titles():
    edition = sys.modules.get("colab_edition")  # its SHOW_CODE: the form of a Colab title
    if edition is None:  # (registered before it runs: its dataclasses look themselves up)
        spec = importlib.util.spec_from_file_location("colab_edition",
                                                      BOOK.parent / ".ci" / "colab_edition.py")
        edition = sys.modules["colab_edition"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(edition)

    def wrong(path):
        return [title for c in code_cells(path)
                if (title := c["metadata"].get("mystnb", {}).get("code_prompt_show"))
                and not (title.startswith(edition.SHOW_CODE)
                         and "hide-input" in c["metadata"]["tags"])]

    assert offenders(wrong) == []


def test_no_macro_that_only_the_rendered_book_defines():
    config = yaml.safe_load((BOOK.parent / "_config.yml").read_text())
    macros = config["sphinx"]["config"]["mathjax3_config"]["tex"]["macros"]
    pattern = re.compile(r"\\(" + "|".join(map(re.escape, macros)) + r")(?![A-Za-z])")
    assert offenders(lambda p: sum(len(pattern.findall(t)) for t in markdown_texts(p))) == []


if __name__ == "__main__":
    rows = {p.name: measure(p) for p in NOTEBOOKS}
    keys = list(next(iter(rows.values())))
    print(f"{'notebook':34s}" + "".join(f"{k:>16s}" for k in keys))
    for name, row in rows.items():
        print(f"{name:34s}" + "".join(f"{row[k]:16d}" for k in keys))
    print(f"{'total':34s}" + "".join(f"{sum(r[k] for r in rows.values()):16d}" for k in keys))


EXERCISE_TITLE = re.compile(r"^`{3,}\{exercise\}\s*(.*)$", re.M)
EXERCISE_LABEL = re.compile(r"\((★(?:★|☆){2}), [^()]+\)$")


def test_every_exercise_is_labelled_for_instructors():
    """Each exercise's title ends with its difficulty and time, as the front page explains:
    ``(★☆☆, 10 min)``, optionally followed by "CPU minutes" or "GPU"."""
    titles = [m.group(1).strip() for p in NOTEBOOKS for text in markdown_texts(p)
              for m in EXERCISE_TITLE.finditer(text)]
    assert len(titles) >= 60
    unlabelled = [t for t in titles if not EXERCISE_LABEL.search(t)]
    assert unlabelled == []


OBJECTIVES = re.compile(r"^`{3,}\{admonition\} Learning objectives\n(.*?)^`{3,}", re.M | re.S)
EXERCISE_OBJECTIVES = re.compile(r"; objectives? (\d+(?:, \d+)*)\)$")


def test_every_exercise_names_the_objectives_it_practises():
    """Each chapter numbers its learning objectives (``1.``, ``2.``, ...), and each exercise's
    title ends with the objectives it practises, ``(★☆☆, 15 min; objective 2)`` or
    ``(...; objectives 1, 3)``, which must be numbers of its chapter's list; every objective is
    practised by at least one exercise of its chapter."""
    tagged = 0
    for path in (p for p in NOTEBOOKS if re.match(r"\d\d_", p.name)):
        text = "\n".join(markdown_texts(path))
        block = OBJECTIVES.search(text)
        assert block, f"{path.name}: no Learning objectives admonition"
        items = re.findall(r"^(\d+)\. \S", block.group(1), re.M)
        assert items and items == [str(i) for i in range(1, len(items) + 1)], \
            f"{path.name}: the learning objectives are not a numbered list 1, 2, ..."
        assert not re.search(r"^[-*] ", block.group(1), re.M), f"{path.name}: a bullet objective"
        practised = set()
        for m in EXERCISE_TITLE.finditer(text):
            title = m.group(1).strip()
            found = EXERCISE_OBJECTIVES.search(title)
            assert found, f"{path.name}: {title!r} names no objective"
            numbers = [int(n) for n in found.group(1).split(", ")]
            assert all(1 <= n <= len(items) for n in numbers), \
                f"{path.name}: {title!r} names an objective the chapter does not have"
            practised |= set(numbers)
            tagged += 1
        unpractised = sorted(set(range(1, len(items) + 1)) - practised)
        assert not unpractised, f"{path.name}: no exercise practises objectives {unpractised}"
    assert tagged >= 60


def test_every_library_name_in_the_text_exists():
    """``gaugebook.x.y`` in markdown resolves: the longest importable module prefix, then
    attributes (addresses such as ``gaugebook.github.io`` are not names)."""
    import importlib

    def resolves(dotted: str) -> bool:
        parts = dotted.split(".")
        for k in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:k]))
            except ImportError:
                continue
            for name in parts[k:]:
                if not hasattr(obj, name):
                    return False
                obj = getattr(obj, name)
            return True
        return False

    pages = NOTEBOOKS + sorted(BOOK.glob("*.md"))
    missing = sorted({f"{path.name}: {name}" for path in pages for text in markdown_texts(path)
                      for name in re.findall(r"gaugebook(?:\.[A-Za-z_]\w*)+(?![\w/])", text)
                      if not name.startswith("gaugebook.github") and not resolves(name)})
    assert not missing, missing
