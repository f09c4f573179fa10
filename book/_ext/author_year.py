"""Author-year citations that name one work each, and a bibliography labelled the same way.

sphinxcontrib-bibtex's ``author_year`` style cites by the ``year`` field, so the paper and the
code of Silverstein et al. (both 2026) read alike in the text, and its ``plain`` bibliography
labels the entries ``[1]``, ``[2]``, ... that no citation names. Here every entry's label is its
citation, ``Silverstein et al., 2026b``: one author by surname, two joined by "and", three or
more as the first "et al.", and a letter after the year where authors and year repeat (in the
order of the sorted bibliography). The bibliography shows the label; a citation in the text
takes its year, letter included, from it.
"""
from collections import Counter
from dataclasses import dataclass
from string import ascii_lowercase

import pybtex.plugin
from pybtex.database import parse_file
from pybtex.richtext import Text
from pybtex.style.formatting.plain import Style as PlainStyle
from pybtex.style.labels import BaseLabelStyle
from pybtex.style.sorting.author_year_title import SortingStyle as AuthorYearTitleSorting
from sphinxcontrib.bibtex.plugin import register_plugin
from sphinxcontrib.bibtex.style.referencing.author_year import AuthorYearReferenceStyle
from sphinxcontrib.bibtex.style.referencing.basic_author_year import (
    BasicAuthorYearParentheticalReferenceStyle, BasicAuthorYearTextualReferenceStyle)
from sphinxcontrib.bibtex.style.template import join, join2, node, post_text, pre_text, reference

STYLE = "gaugebook"  # the name of both styles, for bibtex_default_style and bibtex_reference_style


def _authors(entry) -> str:
    """``A``, ``A and B`` or ``A et al.``: the surnames as the in-text citation prints them."""
    persons = entry.persons.get("author") or entry.persons.get("editor") or []
    if not persons:
        return entry.fields.get("title", entry.key)
    surname = pybtex.plugin.find_plugin("pybtex.style.names", "last")()
    last = [surname.format(p, True).format().render_as("text") for p in persons]
    return " and ".join(last) if len(last) <= 2 else f"{last[0]} et al."


class AuthorYearLabels(BaseLabelStyle):
    """Labels ``Surname et al., 2026``, with ``a``, ``b``, ... after a repeated author-year."""

    def format_labels(self, sorted_entries):
        bases = [f"{_authors(e)}, {e.fields.get('year', 'n.d.')}" for e in sorted_entries]
        repeats, seen = Counter(bases), Counter()
        for base in bases:
            letter = ascii_lowercase[seen[base]] if repeats[base] > 1 else ""
            seen[base] += 1
            yield base + letter


class AuthorYearTitleOrder(AuthorYearTitleSorting):
    """pybtex's order by authors, year and title, reading a braced name (``{Anonymous}``, an
    organisation) by its letters: the brace would sort it after every "z"."""

    def person_key(self, person):
        return super().person_key(person).replace("{", "").replace("}", "")


class AuthorYearStyle(PlainStyle):
    """pybtex's ``plain`` entries, sorted by authors, year and title, under author-year
    labels."""

    default_label_style = AuthorYearLabels
    default_sorting_style = AuthorYearTitleOrder


def citation_labels(paths) -> dict[str, str]:
    """``{key: label}`` for every entry of the BibTeX files ``paths``, as the bibliography
    (``:all:``) sorts and labels them; the Colab edition writes its citations from these."""
    entries = [entry for path in paths for entry in parse_file(str(path)).entries.values()]
    style = AuthorYearStyle()
    ordered = style.sort(entries)
    return dict(zip((e.key for e in ordered), style.format_labels(ordered)))


@node
def label_year(children, data):
    """The cited year with its letter (``2026b``), read from the entry's label."""
    assert not children
    return Text(data["formatted_entry"].label.rsplit(", ", 1)[-1])


@dataclass
class _Parenthetical(BasicAuthorYearParentheticalReferenceStyle):
    """``{cite:p}``: (Surname et al., 2026b)."""

    def inner(self, role_name):
        return join2(sep1=self.pre_text_sep, sep2=self.post_text_sep)[
            pre_text,
            reference[join(sep=self.author_year_sep)[
                self.person.author_or_editor_or_title(full="s" in role_name), label_year]],
            post_text,
        ]


@dataclass
class _Textual(BasicAuthorYearTextualReferenceStyle):
    """``{cite:t}``: Surname et al. (2026b)."""

    def inner(self, role_name):
        return join(sep=self.text_reference_sep)[
            self.person.author_or_editor_or_title(full="s" in role_name),
            join[self.bracket.left,
                 join2(sep1=self.pre_text_sep, sep2=self.post_text_sep)[
                     pre_text, reference[label_year], post_text],
                 self.bracket.right],
        ]


@dataclass
class AuthorYearReferences(AuthorYearReferenceStyle):
    """sphinxcontrib-bibtex's ``author_year`` referencing, with the year taken from the label."""

    def __post_init__(self):
        super().__post_init__()
        shared = dict(person=self.person, pre_text_sep=self.pre_text_sep,
                      post_text_sep=self.post_text_sep)
        self.styles[:2] = [
            _Parenthetical(bracket=self.bracket_parenthetical,
                           author_year_sep=self.author_year_sep, **shared),
            _Textual(bracket=self.bracket_textual,
                     text_reference_sep=self.text_reference_sep, **shared)]
        self.role_style.update((role, style) for style in self.styles[:2]
                               for role in style.role_names())


def setup(app):
    pybtex.plugin.register_plugin("pybtex.style.formatting", STYLE, AuthorYearStyle)
    register_plugin("sphinxcontrib.bibtex.style.referencing", STYLE, AuthorYearReferences)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
