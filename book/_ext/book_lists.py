"""Lists of the book's numbered things, for a reader who looks one up: every numbered statement
(sphinx-proof's definitions, theorems, propositions, ...), every figure and every exercise
(sphinx-exercise), chapter by chapter, each as a link with its number and its title (for a
figure, the first sentence of its caption, and links to the figure's files for slides, see
``figure_files``).

A page asks for a list with the directive ``{book-list} results`` (or ``figures``,
``exercises``). The list is built when the page is written, once every chapter has been read
and numbered, from the chapters' doctrees (resolved, so that glued numbers and references in a
title are filled in) and the numbers Sphinx gave them.
"""
from __future__ import annotations

import re
from functools import cache

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

from figure_files import links

CHAPTER = re.compile(r"book/\d\d_")  # the chapters' document names; appendices have no numbers


class book_list(nodes.General, nodes.Element):
    """Where a list goes (replaced when the page is written)."""


class BookList(SphinxDirective):
    required_arguments = 1

    def run(self):
        kind = self.arguments[0]
        if kind not in KINDS:
            raise self.error(f"book-list: unknown list {kind!r}; use one of {', '.join(KINDS)}")
        # the lists hold the titles' math: an empty formula here makes Sphinx load MathJax on
        # the page (it loads it only where its reader found math)
        return [book_list("", nodes.math("", ""), kind=kind)]


def _title(node):
    """The title of a statement or exercise without the parentheses that the page puts around
    it (`` (`` and ``)``, in its first and last text), or None if it has none."""
    title = node.next_node(nodes.title)
    if title is None or not title.children:
        return None
    # a node's own deepcopy: copy.deepcopy would follow .parent and copy the whole document
    inner = nodes.inline("", "", *(child.deepcopy() for child in title.children))
    first, last = inner.children[0], inner.children[-1]
    if isinstance(first, nodes.Text) and first.lstrip().startswith("("):
        inner.replace(first, nodes.Text(first.lstrip()[1:]))
        last = inner.children[-1]
    if isinstance(last, nodes.Text) and last.rstrip().endswith(")"):
        inner.replace(last, nodes.Text(last.rstrip()[:-1]))
    return inner if inner.astext().strip() else None


def _name(node, numbers, counter, kind):
    """``"Proposition 4.2"``: ``kind`` and the number Sphinx gave ``node`` among the things
    counted by ``counter``, or None if it has none."""
    number = numbers.get(counter, {}).get(node["ids"][0]) if node["ids"] else None
    return None if number is None else f"{kind} {'.'.join(map(str, number))}"


def _titled(node, numbers, counter, kind):
    """(name, title) of a numbered statement or exercise with a title, else None."""
    name, title = _name(node, numbers, counter, kind), _title(node)
    return None if name is None or title is None else (name, title)


def _figure(node, numbers):
    """("Figure 4.1", the first sentence of its caption) of a numbered figure, else None."""
    name, caption = _name(node, numbers, "figure", "Figure"), node.next_node(nodes.caption)
    if name is None or caption is None:
        return None
    first = nodes.inline()
    for child in caption.children:
        text = child.astext() if isinstance(child, nodes.Text) else None
        end = re.search(r"\.(\s|$)", text) if text is not None else None
        if end:
            first += nodes.Text(text[:end.start()] + ".")
            break
        first += child.deepcopy()
    return name, first


def _rebase(title, page: str) -> None:
    """Point the same-page links of ``title`` (``refid``, or a ``refuri`` of ``#id``), copied
    from chapter ``page``, into that chapter: on the page of lists they would name anchors it
    does not have."""
    for ref in title.findall(nodes.reference):
        if "refid" in ref:
            ref["refuri"] = f"{page}#{ref['refid']}"
            del ref["refid"]
        elif ref.get("refuri", "").startswith("#"):
            ref["refuri"] = page + ref["refuri"]


KINDS = {
    "results": lambda n: isinstance(n, nodes.Element) and n.get("realtype") is not None
    and n.get("countertype") is not None,
    "figures": lambda n: isinstance(n, nodes.figure),
    "exercises": lambda n: type(n).__name__ == "exercise_enumerable_node",
}
# (name, title) of a listed node: a statement by its sphinx-proof type and counter; an exercise
# with its title, difficulty and time included
ENTRY = {
    "results": lambda n, numbers: _titled(n, numbers, n["countertype"],
                                          n["realtype"].capitalize()),
    "figures": _figure,
    "exercises": lambda n, numbers: _titled(n, numbers, "exercise", "Exercise"),
}


@cache
def _resolved(app, doc):
    """Chapter ``doc``'s doctree with its references and glued values resolved (a copy: the
    builder writes the chapter from its own)."""
    return app.env.get_and_resolve_doctree(doc, app.builder, doctree=app.env.get_doctree(doc))


def _chapter_list(app, fromdoc, doc, kind):
    """The bullet list of chapter ``doc``'s numbered things of ``kind`` (None if it has none)."""
    numbers = app.env.toc_fignumbers.get(doc, {})
    items = nodes.bullet_list()
    for node in _resolved(app, doc).findall(KINDS[kind]):
        entry = ENTRY[kind](node, numbers)
        if entry is None:
            continue
        name, title = entry
        page = app.builder.get_relative_uri(fromdoc, doc)
        _rebase(title, page)
        uri = f"{page}#{node['ids'][0]}"
        link = nodes.reference("", "", nodes.strong(name, name), refuri=uri, internal=True)
        line = nodes.paragraph("", "", link, nodes.Text(": "), title)
        files = links(app, fromdoc, node["ids"][0]) if kind == "figures" else []
        for i, file_link in enumerate(files):
            line += [nodes.Text(", " if i else " ("), file_link]
        if files:
            line += nodes.Text(")")
        items += nodes.list_item("", line)
    return items if items.children else None


def fill_lists(app, doctree, fromdoc) -> None:
    """Replace each ``book-list`` of the page by its lists, one per chapter."""
    chapters = sorted(d for d in app.env.found_docs if CHAPTER.match(d))
    for placeholder in list(doctree.findall(book_list)):
        out = []
        for doc in chapters:
            items = _chapter_list(app, fromdoc, doc, placeholder["kind"])
            if items is not None:
                number = ".".join(map(str, app.env.toc_secnumbers.get(doc, {}).get("", ())))
                title = f"{number}. {app.env.titles[doc].astext()}".lstrip(". ")
                out += [nodes.rubric(title, title), items]
        placeholder.replace_self(out)


def setup(app):
    app.add_node(book_list)
    app.add_directive("book-list", BookList)
    app.connect("doctree-resolved", fill_lists)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
