#!/usr/bin/env python3
"""Write the Colab edition of the book: one notebook per chapter that reads like its page.

Usage: python .ci/colab_edition.py [--build _build] [--out book/colab]    (``make colab``)

Colab renders Markdown and MathJax but no MyST, and it never sees what Jupyter Book computed at
build time. So each chapter is rewritten from the build that made its page (``make book``, or
the strict build of ``make test``):

* ``_build/jupyter_execute/book/<chapter>.ipynb``: the executed notebook, its outputs as the
  page shows them, and ``<chapter>.glue.json``: every glued value (myst-nb writes both);
* ``_build/.doctrees/environment.pickle``: the Sphinx environment, for labels, titles, figure,
  section and exercise numbers and glossary terms, so that a link reads as on the page;
* ``_build/html/book/<chapter>.html``: the page, whose images are counted.

What becomes of the Markdown:

* ``{admonition}`` (corrections use ``:class: warning``) and the named admonitions: a box
  (``<div>`` with a coloured left border) with the title in bold; ``{exercise}``: a box titled
  ``Exercise N.k (title)``; ``{solution}``: a ``<details>`` block, closed, as the page's
  dropdown; sphinx-proof's ``{prf:theorem}``, ``{prf:lemma}``, ... (each with a ``:label:``): a
  box titled ``Theorem 4.1 (title)``, numbered as on the page, and ``{prf:proof}``: a box titled
  ``Proof``; ``{glue:figure}``: the glued image (a ``data:`` URI) and its numbered caption;
* ``{glue:text}``: the value written in, formatted by myst-nb's own function; ``{ref}``,
  ``{numref}``, ``{prf:ref}``, ``{doc}``, ``{term}`` and ``{cite}`` (``:p``, ``:t``): links to
  the rendered page with the text the page shows; ``(label)=`` targets and ``%`` comments are
  dropped;
* math stays ``$...$`` / ``$$...$$``; the book's MathJax macros (``_config.yml``) are expanded,
  since Colab's MathJax does not know them.

Anything else in MyST syntax is an error, not a silent pass-through. Code cells are the book's
own, so running them recomputes what the text states. Tags act as on the page: code the page
hides (``hide-input``, ``remove-input``) is folded (Colab's ``cellView: form``: a title, one
click from the code) above its outputs; ``remove-output`` drops the outputs; ``remove-cell``
drops a Markdown cell and folds a code cell without its outputs (later cells may need what it
computes). The chapter's own Colab install cell is replaced by one that installs the release of
``gaugebook/__init__.py``; the second cell links the chapter's page.

Each notebook's metadata (``gaugebook_colab``) records the SHA-256 of its source notebook's cells,
of this script and the release, and the page's image count: ``tests/test_colab_edition.py``
compares them without executing anything.
"""
from __future__ import annotations

import argparse
import base64
import copy
import hashlib
import json
import pickle
import posixpath
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parent.parent
REPOSITORY = "https://github.com/gaugebook/gaugebook"
PAGES = "https://gaugebook.github.io/gaugebook/"  # where the rendered book is published
METADATA_KEY = "gaugebook_colab"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
#: Python's default repr, ``<module.Class object at 0x7f...>``: a new address on every build
DEFAULT_REPR = re.compile(r"<[\w.]+(?: object)? at 0x[0-9a-f]+>")
IMAGE_MIMES = ("image/png", "image/jpeg", "image/svg+xml")
COLAB_INSTALL_MARK = "google.colab"
# Code the page hides is folded in Colab (cellView "form": the title shows, "Show code" opens it),
# by the strongest of its tags
FOLDED = {"remove-cell": "# @title Not on the page; later cells use what it computes\n",
          "remove-input": "# @title The page shows only this cell's output\n",
          "hide-input": "# @title Collapsed on the page, as here\n"}
SHOW_CODE = "Show code: "  # how a titled toggle on the page begins (cell metadata, see fold)

# box colours (left border; the background is the same colour, faint, so both Colab themes read)
BOX_COLOURS = {"warning": "#e8a317", "caution": "#e8a317", "attention": "#e8a317",
               "danger": "#d9534f", "error": "#d9534f", "important": "#d9534f",
               "note": "#3b82f6", "seealso": "#3b82f6", "hint": "#22a06b", "tip": "#22a06b",
               "exercise": "#6c757d", "proof": "#6f42c1", "admonition": "#3b82f6"}
NAMED_ADMONITIONS = ("attention", "caution", "danger", "error", "hint", "important", "note",
                     "seealso", "tip", "warning")

FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|:{3,})\s*(?P<info>.*?)\s*$")
DIRECTIVE = re.compile(r"^\{(?P<name>[\w:-]+)\}\s*(?P<arg>.*)$")
OPTION = re.compile(r"^:(?P<key>[\w-]+):\s*(?P<value>.*)$")
# a role, or an inline code span (left alone); leftmost match wins, so `{x}` in code stays code
INLINE = re.compile(r"\{(?P<role>[a-z][\w:-]*)\}`(?P<content>[^`]+)`"
                    r"|(?P<code>(?P<ticks>`+).+?(?P=ticks))", re.S)
EXPLICIT = re.compile(r"^(?P<text>.*?)\s*<(?P<target>[^<>]+)>$", re.S)
EXERCISE = re.compile(r"^ {0,3}(?:`{3,}|:{3,})\{exercise\}[ \t]*(.*)\n"
                      r"(?::[\w-]+:.*\n)*?:label:\s*(\S+)", re.M)
TARGET_LINE = re.compile(r"^\([\w:.-]+\)=\s*$")
COMMENT_LINE = re.compile(r"^%")
# what must not be left in the edition's Markdown (tests/test_colab_edition.py uses it)
MYST_LEFT = [
    ("role", re.compile(r"\{[a-z][\w:-]*\}`")),
    ("directive", re.compile(r"^ {0,3}(`{3,}|:{3,})\s*\{", re.M)),
    ("target", re.compile(r"^\([\w:.-]+\)=\s*$", re.M)),
    ("comment", re.compile(r"^%", re.M)),
    ("colon fence", re.compile(r"^ {0,3}:{3,}", re.M)),
    ("substitution", re.compile(r"\{\{.*?\}\}")),
]


# --- the build: what the page was made from --------------------------------------------------

@dataclass
class Build:
    """What one ``jupyter-book build`` knows: the Sphinx environment's tables and the config."""

    labels: dict            # label -> (docname, anchor, section title)
    anonlabels: dict        # label -> (docname, anchor)
    terms: dict             # lower-case term -> (docname, anchor)
    titles: dict            # docname -> title text
    fignumbers: dict        # docname -> {figtype: {anchor: (n, ...)}}
    secnumbers: dict        # docname -> {"#anchor" or "": (n, ...)}
    numfig_format: dict     # figtype -> "Fig. %s", ...
    citations: dict         # bibtex key -> (docname, anchor)
    bib: dict               # bibtex key -> (authors as cited, year with its letter)
    macros: dict            # MathJax macro name -> expansion
    exercises: dict = field(default_factory=dict)  # label -> (docname, title or "")
    proofs: dict = field(default_factory=dict)  # label -> (docname, realtype, countertype, numbered)
    section_ids: dict = field(default_factory=dict)  # docname -> {any id of a section: its first}

    def url(self, docname: str, anchor: str = "") -> str:
        return PAGES + docname + ".html" + (f"#{anchor}" if anchor else "")

    def number(self, docname: str, anchor: str) -> tuple[str, str]:
        """(figtype, "3.2"): the number Sphinx gives the object ``anchor`` of ``docname``."""
        for figtype, numbers in self.fignumbers.get(docname, {}).items():
            if anchor in numbers:
                return figtype, ".".join(map(str, numbers[anchor]))
        secnums = self.secnumbers.get(docname, {})
        anchor = self.section_ids.get(docname, {}).get(anchor, anchor)  # as Sphinx: ids[0]
        nums = secnums.get("#" + anchor, secnums.get(""))
        if nums is None:
            raise KeyError(f"{docname}#{anchor} has no number")
        return "section", ".".join(map(str, nums))


def load_build(build: Path) -> Build:
    """Read the Sphinx environment pickled by ``jupyter-book build`` (needs Sphinx importable)."""
    with open(build / ".doctrees" / "environment.pickle", "rb") as f:
        env = pickle.load(f)
    std, cite = env.domaindata["std"], env.domaindata["cite"]
    citations = {c.key: (c.bibliography_key.docname, c.citation_id) for c in cite["citations"]}
    exercises = {}
    for label, info in getattr(env, "sphinx_exercise_registry", {}).items():
        if info["type"] == "exercise":
            subtitles = [n.astext() for n in info["node"].children[0].findall()
                         if type(n).__name__ == "exercise_subtitle"]
            exercises[label] = (info["docname"], subtitles[0] if subtitles else "")
    proofs = {label: (info["docname"], info["realtype"], info["countertype"], not info["nonumber"])
              for label, info in getattr(env, "proof_list", {}).items()}
    return Build(
        labels=dict(std["labels"]), anonlabels=dict(std["anonlabels"]),
        terms={name.lower(): place for (kind, name), place in std["objects"].items()
               if kind == "term"},
        titles={doc: node.astext() for doc, node in env.titles.items()},
        fignumbers=env.toc_fignumbers, secnumbers=env.toc_secnumbers,
        numfig_format=dict(env.config.numfig_format), citations=citations,
        bib=read_bib([ROOT / f for f in env.config.bibtex_bibfiles]),
        macros=read_macros(), exercises=exercises, proofs=proofs,
        section_ids={doc: section_ids(build / ".doctrees" / f"{doc}.doctree")
                     for doc in env.toc_secnumbers})


def section_ids(doctree: Path) -> dict:
    """Every id of every section of a document -> the section's first id (which Sphinx numbers)."""
    from docutils import nodes

    with open(doctree, "rb") as f:
        tree = pickle.load(f)
    return {i: section["ids"][0] for section in tree.findall(nodes.section) for i in section["ids"]}


def read_bib(paths) -> dict:
    """key -> (the authors as an author-year citation names them, the year with its letter):
    the book's own labels (``book/_ext/author_year.py``), split at the last comma."""
    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    from author_year import citation_labels

    return {key: tuple(label.rsplit(", ", 1)) for key, label in citation_labels(paths).items()}


def read_macros() -> dict:
    """The MathJax macros the rendered book defines (``_config.yml``)."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    return dict(config["sphinx"]["config"]["mathjax3_config"]["tex"]["macros"])


def release() -> str:
    """The version in ``gaugebook/__init__.py`` (its one home), read without importing."""
    text = (ROOT / "gaugebook" / "__init__.py").read_text()
    return re.search(r'^__version__\s*=\s*"([^"]+)"', text, re.M).group(1)


def install_cell_source(version: str) -> str:
    """The first cell: in Colab only, install the release ``version`` from its git tag."""
    return ("# Colab only: install the gaugebook release this edition was built from\n"
            "import importlib.util, sys\n"
            'if "google.colab" in sys.modules and importlib.util.find_spec("gaugebook") is None:\n'
            f'    %pip install -q "gaugebook @ git+{REPOSITORY}@v{version}"\n')


# --- hashes that tell when the edition is stale ----------------------------------------------

def toggle_title(cell) -> str:
    """The title of a folded cell's toggle on the page, if it has its own (else "")."""
    return cell.get("metadata", {}).get("mystnb", {}).get("code_prompt_show", "")


def source_hash(nb) -> str:
    """SHA-256 of a notebook's cells (type, source, tags, toggle title): what the edition is
    built from."""
    def key(c) -> list:
        source = c["source"] if isinstance(c["source"], str) else "".join(c["source"])
        plain = [c["cell_type"], source, sorted(c.get("metadata", {}).get("tags", []))]
        return plain + [toggle_title(c)] if toggle_title(c) else plain  # (untitled: as before)

    return hashlib.sha256(json.dumps([key(c) for c in nb["cells"]]).encode()).hexdigest()


def builder_hash() -> str:
    """SHA-256 of this script: a changed converter makes the edition stale too."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


# --- Markdown ----------------------------------------------------------------------------------

@dataclass
class Page:
    """One chapter being converted: its docname, glue data and the build."""

    docname: str
    glue: dict
    build: Build
    exercise_titles: dict = field(default_factory=dict)  # label -> title as written in MyST

    def fail(self, message: str):
        raise ValueError(f"{self.docname}: {message}")


def convert_markdown(text: str, page: Page) -> str:
    """MyST Markdown -> the Markdown Colab renders."""
    lines, out, plain, i = text.split("\n"), [], [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            if not (TARGET_LINE.match(lines[i]) or COMMENT_LINE.match(lines[i])
                    or lines[i].strip() == "+++"):
                plain.append(lines[i])
            i += 1
            continue
        end = closing_fence(lines, i, m["fence"])
        if plain:
            out.append(convert_inline("\n".join(plain), page))
            plain = []
        directive = DIRECTIVE.match(m["info"])
        if directive is None:  # a code block: verbatim
            out.append("\n".join(lines[i:end + 1]))
        else:
            out.append(render_directive(directive["name"], directive["arg"], lines[i + 1:end],
                                        page))
        i = end + 1
    if plain:
        out.append(convert_inline("\n".join(plain), page))
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip("\n")


def closing_fence(lines: list[str], start: int, fence: str) -> int:
    """Index of the line closing the fence opened at ``start`` (same character, as long or more)."""
    close = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}\s*$")
    for j in range(start + 1, len(lines)):
        if close.match(lines[j]):
            return j
    raise ValueError(f"unclosed fence {fence!r}: {lines[start]!r}")


def split_options(body: list[str]) -> tuple[dict, str]:
    """A directive's ``:key: value`` lines and the content after them."""
    options, i = {}, 0
    while i < len(body) and (m := OPTION.match(body[i])):
        options[m["key"]] = m["value"]
        i += 1
    return options, "\n".join(body[i:]).strip("\n")


def box(title: str, content: str, kind: str) -> str:
    """A titled box: a ``<div>`` with a coloured left border around Markdown (blank lines
    around the content, so that Markdown inside the HTML block is still Markdown)."""
    colour = BOX_COLOURS.get(kind, BOX_COLOURS["admonition"])
    style = (f"border-left: 4px solid {colour}; background: {colour}1a; "
             "padding: 0.1em 1em; margin: 1em 0;")
    return f'<div style="{style}">\n\n**{title}**\n\n{content}\n\n</div>'


def render_directive(name: str, arg: str, body: list[str], page: Page) -> str:
    """The Colab form of the directive ``{name} arg`` with the lines ``body``."""
    options, content = split_options(body)
    if name == "admonition":
        kind = (options.get("class", "").split() or ["admonition"])[0]
        return box(convert_inline(arg, page), convert_markdown(content, page), kind)
    if name in NAMED_ADMONITIONS:
        title = convert_inline(arg, page) if arg else name.capitalize()
        return box(title, convert_markdown(content, page), name)
    if name == "exercise":
        return box(exercise_title(options["label"], page), convert_markdown(content, page),
                   "exercise")
    if name == "solution":
        title = "Solution to " + exercise_title(arg.strip(), page)
        return (f"<details>\n<summary><b>{markdown_to_html_inline(title)}</b></summary>\n\n"
                f"{convert_markdown(content, page)}\n\n</details>")
    if name == "prf:proof":
        return box("Proof", convert_markdown(content, page), "proof")
    if name.startswith("prf:"):
        if "label" not in options:
            page.fail(f"{{{name}}} {arg} has no :label: (the edition numbers it by its label)")
        title = proof_name(options["label"], page)
        if arg:
            title += f" ({convert_inline(arg, page)})"
        return box(title, convert_markdown(content, page), "proof")
    if name == "glue:figure":
        return glue_figure(arg.strip(), options, content, page)
    page.fail(f"no Colab form for the directive {{{name}}}")


def proof_name(label: str, page: Page) -> str:
    """``Theorem 4.1``: a sphinx-proof block's type and number, as its page and ``{prf:ref}``
    show them (``Lemma`` alone where it is unnumbered)."""
    if label not in page.build.proofs:
        page.fail(f"unknown theorem label {label!r}")
    docname, realtype, countertype, numbered = page.build.proofs[label]
    if not numbered:
        return realtype.title()
    number = page.build.fignumbers[docname][countertype][label]
    return f"{realtype.title()} {'.'.join(map(str, number))}"


def exercise_title(label: str, page: Page) -> str:
    """``Exercise 1.2 (its title)``; the title as the chapter writes it (math and all)."""
    docname, title = page.build.exercises[label]
    title = page.exercise_titles.get(label, title)
    _, number = page.build.number(docname, label)
    return f"Exercise {number}" + (f" ({convert_inline(title, page)})" if title else "")


def exercise_titles(nb) -> dict:
    """label -> title of each ``{exercise}`` of a notebook's Markdown."""
    found = {}
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for title, label in EXERCISE.findall(cell.source):
                found[label] = title.strip()
    return found


def markdown_to_html_inline(text: str) -> str:
    """Inline Markdown that HTML (``<summary>``) would show raw: emphasis and code."""
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)
    text = re.sub(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])", r"<i>\1</i>", text)
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", text)


def glue_figure(key: str, options: dict, caption: str, page: Page) -> str:
    """The glued image as a ``data:`` URI with its alt text, then its numbered caption."""
    data = page.glue.get(key, {}).get("data", {})
    mime = next((m for m in IMAGE_MIMES if m in data), None)
    if mime is None:
        page.fail(f"glued figure {key!r} has no image in the build")
    payload = data[mime]
    if mime == "image/svg+xml":
        payload = base64.b64encode(payload.encode()).decode()
    alt = re.sub(r"\s+", " ", options.get("alt", "")).replace("[", "(").replace("]", ")")
    lines = [f"![{alt}](data:{mime};base64,{payload.strip()})"]
    name = options.get("name")
    prefix = ""
    if name:
        figtype, number = page.build.number(page.docname, name)
        prefix = f"**{page.build.numfig_format[figtype] % number}** "
    if caption or prefix:
        lines.append(f"{prefix}{convert_markdown(caption, page)}".strip())
    return "\n\n".join(lines)


def convert_inline(text: str, page: Page) -> str:
    """Roles -> text and links; the book's macros expanded outside code."""
    out, pos = [], 0
    for m in INLINE.finditer(text):
        out.append(expand_macros(text[pos:m.start()], page.build.macros))
        out.append(m["code"] if m["code"] else render_role(m["role"], m["content"], page))
        pos = m.end()
    out.append(expand_macros(text[pos:], page.build.macros))
    return "".join(out)


def expand_macros(text: str, macros: dict) -> str:
    """Replace the book's MathJax macros (``\\GL`` -> ``\\mathrm{GL}``) in ``text``."""
    if not macros:
        return text
    pattern = re.compile(r"\\(" + "|".join(map(re.escape, macros)) + r")(?![A-Za-z])")
    return pattern.sub(lambda m: macros[m[1]], text)


def escape_markdown(text: str) -> str:
    """``text`` shown literally in Markdown (a glued value may hold ``*``, ``_``, ``$``...)."""
    return re.sub(r"([\\`*_\[\]<>$|])", r"\\\1", text)


def link(text: str, url: str) -> str:
    """A Markdown link."""
    return f"[{text}]({url})"


def split_explicit(content: str) -> tuple[str | None, str]:
    """``"text <target>"`` -> (text, target); ``"target"`` -> (None, target)."""
    m = EXPLICIT.match(content)
    return (m["text"], m["target"].strip()) if m else (None, content.strip())


def render_role(role: str, content: str, page: Page) -> str:
    """The Colab form of the role ``{role}`content```: a value, or a link with the page's text."""
    build = page.build
    if role in ("glue:text", "glue"):
        return glue_text(content, page, role)
    text, target = split_explicit(content)
    if role == "ref":
        if target in build.exercises:  # the page writes "Exercise 5.1", without its title
            docname, anchor = build.exercises[target][0], target
            title = f"Exercise {build.number(docname, target)[1]}"
        elif target in build.labels:
            docname, anchor, title = build.labels[target]
        elif target in build.anonlabels and text:
            (docname, anchor), title = build.anonlabels[target], text
        else:
            page.fail(f"unknown label {target!r}")
        return link(text or title, build.url(docname, anchor))
    if role == "numref":
        if target in build.anonlabels:
            docname, anchor = build.anonlabels[target]
        elif target in build.labels:
            docname, anchor = build.labels[target][:2]
        else:
            page.fail(f"unknown label {target!r}")
        figtype, number = build.number(docname, anchor)
        if text:
            shown = text.replace("{number}", number).replace("%s", number)
        else:
            shown = build.numfig_format[figtype] % number
        return link(shown, build.url(docname, anchor))
    if role == "prf:ref":
        if target not in build.proofs:
            page.fail(f"unknown theorem label {target!r}")
        return link(text or proof_name(target, page), build.url(build.proofs[target][0], target))
    if role == "doc":
        docname = posixpath.normpath(posixpath.join(posixpath.dirname(page.docname), target))
        if docname not in build.titles:
            page.fail(f"unknown document {target!r}")
        return link(text or build.titles[docname], build.url(docname))
    if role == "term":
        place = build.terms.get(target.lower())
        if place is None:
            page.fail(f"unknown glossary term {target!r}")
        return link(text or target, build.url(*place))
    if role in ("cite", "cite:p", "cite:t"):
        return citation(role, content, page)
    page.fail(f"no Colab form for the role {{{role}}}")


def glue_text(content: str, page: Page, role: str) -> str:
    """The glued value as myst-nb pastes it: ``{glue:text}`key:fmt``` formats it with myst-nb's
    own function (``fmt`` a format spec ending in its type, ``s`` by default); ``{glue}`key```
    shows its text as it is."""
    from myst_nb.core.variables import format_plain_text

    key, fmt = content, "s"
    if role == "glue:text" and ":" in content:
        key, fmt = content.rsplit(":", 1)
    data = page.glue.get(key, {}).get("data")
    if data is None or "text/plain" not in data:
        page.fail(f"no glued text for {key!r} in the build")
    text = data["text/plain"]
    return escape_markdown(format_plain_text(text, fmt) if role == "glue:text" else text)


def citation(role: str, content: str, page: Page) -> str:
    """Author-year citations as the page shows them: ``Name et al. [2026]`` (``:t``), else
    ``[Name et al., 2026, Other, 2020]``, each linked to its bibliography entry."""
    parts = []
    for key in (k.strip() for k in content.split(",")):
        if key not in page.build.bib or key not in page.build.citations:
            page.fail(f"unknown citation {key!r}")
        names, year = page.build.bib[key]
        url = page.build.url(*page.build.citations[key])
        parts.append(f"{names} [{link(year, url)}]" if role == "cite:t"
                     else link(f"{names}, {year}", url))
    # brackets around a link stay literal in Markdown (and a backslash-escaped one could read
    # as a display-math delimiter)
    return ", ".join(parts) if role == "cite:t" else "[" + ", ".join(parts) + "]"


# --- notebooks ---------------------------------------------------------------------------------

def page_outputs(outputs: list) -> list:
    """The outputs a reader sees on the page, in forms Colab shows. A widget's view needs a live
    kernel in Colab (its text form is only a repr), so it goes: running the cell shows it. An
    explorer with a static twin (``gaugebook.interactive.StaticTwin``) keeps the twin, its
    ``text/html``, which is what the page shows and responds without a kernel. A ``text/plain``
    that is only Python's default repr goes where a richer form is kept (Colab shows that one),
    so that rebuilding the edition does not rewrite every table's address."""
    kept = []
    for output in outputs:
        data = output.get("data", {})
        if WIDGET_VIEW in data and "text/html" not in data:
            continue
        output = copy.deepcopy(output)
        if WIDGET_VIEW in data:
            output["data"] = {k: v for k, v in data.items() if k in ("text/html", "text/plain")}
        data = output.get("data", {})
        if len(data) > 1 and DEFAULT_REPR.fullmatch("".join(data.get("text/plain", "")).strip()):
            del data["text/plain"]
        output.get("metadata", {}).pop("scrapbook", None)
        kept.append(output)
    return kept


def fold(cell, tags: set, prompt: str = ""):
    """Fold a code cell whose code the page hides (``FOLDED``); others stay as they are. A cell
    whose page toggle has its own title (``prompt``, the source cell's
    ``mystnb.code_prompt_show``: "Show code: <what>") keeps that title in Colab."""
    tag = next((t for t in FOLDED if t in tags), None)
    if tag is not None:
        what = prompt.removeprefix(SHOW_CODE) if prompt.startswith(SHOW_CODE) else ""
        title = (f"# @title {what[:1].upper()}{what[1:]} (collapsed on the page)\n"
                 if what and tag == "hide-input" else FOLDED[tag])
        cell.source = title + cell.source
        cell.metadata["cellView"] = "form"


def convert_notebook(source, executed, page: Page, version: str):
    """The Colab notebook of one chapter from its source and executed notebooks."""
    if source_hash(source) != source_hash(executed):
        page.fail("the build is older than book/: rebuild it (make book) first")
    failed = [i for i, c in enumerate(executed.cells)
              if any(o.get("output_type") == "error" for o in c.get("outputs", []))]
    if failed:
        page.fail(f"cell {failed[0]} raised when the book was built")
    cells = [nbformat.v4.new_code_cell(install_cell_source(version)),
             nbformat.v4.new_markdown_cell(edition_note(page.docname, version))]
    for cell, ran in zip(source.cells, executed.cells):
        tags = set(cell.metadata.get("tags", []))
        if cell.cell_type == "markdown":
            if "remove-cell" not in tags:
                cells.append(nbformat.v4.new_markdown_cell(convert_markdown(cell.source, page)))
            continue
        if cell.cell_type != "code":
            continue
        if "remove-cell" in tags and COLAB_INSTALL_MARK in cell.source:
            continue  # replaced by the pinned install cell above
        new = nbformat.v4.new_code_cell(cell.source)
        if tags:
            new.metadata["tags"] = sorted(tags)
        if not tags & {"remove-output", "remove-cell"}:
            new.outputs = page_outputs(ran.get("outputs", []))
            new.execution_count = ran.get("execution_count")
        fold(new, tags, toggle_title(cell))
        cells.append(new)
    for i, new in enumerate(cells):  # ids from the content: the same book, the same edition
        new.id = hashlib.sha1(f"{page.docname}:{i}:{new.source}".encode()).hexdigest()[:8]
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
        "colab": {"provenance": [], "toc_visible": True},
    }
    return nb


def edition_note(docname: str, version: str) -> str:
    """The second cell: what this notebook is, and where its page is."""
    return (f"*Colab edition of [this chapter's page]({PAGES}{docname}.html) "
            f"(gaugebook {version}). The numbers in the text and the figures are those of the "
            "build that made the page; running the cells recomputes them.*")


def page_images(html_file: Path) -> int:
    """Images of the page's content: ``<img>`` inside its ``<article>`` (the theme's logos and
    launch-button icons lie outside)."""
    html = html_file.read_text(encoding="utf-8")
    article = re.search(r"<article\b.*?</article>", html, re.S)
    if article is None:
        raise ValueError(f"{html_file} has no <article>")
    return len(re.findall(r"<img\b", article.group(0)))


def notebook_images(nb) -> int:
    """Images a reader of the notebook sees, counted as the page's ``<img>`` are: in Markdown
    (``data:`` URIs), image outputs, and ``<img>`` inside HTML outputs (the frames of an
    interactive figure that the page precomputed)."""
    count = 0
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            count += len(re.findall(r"!\[[^\]]*\]\(data:image/", cell.source))
            continue
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if any(m in data for m in IMAGE_MIMES):
                count += 1
            elif "text/html" in data:
                count += len(re.findall(r"<img\b", data["text/html"]))
    return count


def chapters() -> list[str]:
    """Docnames of the chapters (notebooks) in ``_toc.yml`` order."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [ch["file"] for part in toc["parts"] for ch in part["chapters"]]
    return [f for f in files if (ROOT / f"{f}.ipynb").is_file()]


def chapter_edition(docname: str, build_dir: Path, build: Build, version: str):
    """The Colab notebook of chapter ``docname``, with its metadata, from the build."""
    source = nbformat.read(ROOT / f"{docname}.ipynb", as_version=4)
    executed_path = build_dir / "jupyter_execute" / f"{docname}.ipynb"
    glue_path = executed_path.with_suffix(".glue.json")
    executed = nbformat.read(executed_path, as_version=4)
    glue = json.loads(glue_path.read_text()) if glue_path.is_file() else {}
    page = Page(docname, glue, build, exercise_titles(source))
    nb = convert_notebook(source, executed, page, version)
    expected, shown = page_images(build_dir / "html" / f"{docname}.html"), notebook_images(nb)
    if expected != shown:
        page.fail(f"the page shows {expected} images, the edition {shown}")
    nb.metadata[METADATA_KEY] = {
        "source": f"{docname}.ipynb", "source_sha256": source_hash(source),
        "builder_sha256": builder_hash(), "release": version,
        "page": build.url(docname), "page_images": expected,
    }
    return nb


def build_edition(build_dir: Path, out: Path) -> list[str]:
    """Write every chapter's Colab notebook into ``out``; returns the failures (one line each),
    after writing the chapters that succeeded."""
    build, version = load_build(build_dir), release()
    out.mkdir(parents=True, exist_ok=True)
    failures = []
    for docname in chapters():
        try:
            nb = chapter_edition(docname, build_dir, build, version)
        except (ValueError, KeyError, FileNotFoundError) as exc:
            failures.append(str(exc))
            continue
        path = out / Path(docname).with_suffix(".ipynb").name
        nbformat.write(nb, path)
        print(f"{path}: {len(nb.cells)} cells, {notebook_images(nb)} images")
    return failures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", type=Path, default=ROOT / "_build",
                        help="the jupyter-book build folder (default _build)")
    parser.add_argument("--out", type=Path, default=ROOT / "book" / "colab",
                        help="where the edition goes (default book/colab)")
    args = parser.parse_args(argv)
    if not (args.build / ".doctrees" / "environment.pickle").is_file():
        print(f"no build in {args.build}: run `make book` first", file=sys.stderr)
        return 1
    failures = build_edition(args.build, args.out)
    for line in failures:
        print(f"not written: {line}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
