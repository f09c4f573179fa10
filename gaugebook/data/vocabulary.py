"""The default corpus' vocabulary: token categories, word lists and the word-level tokenizer.

The vocabulary is fixed in advance (built from :data:`VOCAB_SEED`, never from a data seed): real
English function words, question words and a few content words; thousands of pseudo-words built
from syllables (nouns, verbs in two forms, adjectives with English suffixes, capitalised names);
numbers 0-99; letters A-Z; punctuation; garbled-Unicode noise tokens (mojibake). Every token has
a :class:`Category`.
"""
from __future__ import annotations

import itertools
from enum import IntEnum
from functools import cache

import numpy as np

__all__ = ["Category", "Tokenizer", "WordTokenizer", "default_tokenizer", "VOCAB_SEED",
           "FUNCTION_WORDS", "QUESTION_WORDS", "PUNCTUATION", "SENTENCE_ENDS"]


class Category(IntEnum):
    """What a token is, at its position in the stream (the first token of a sentence is a
    ``SENTENCE_START`` unless it is a question word)."""

    SENTENCE_START = 0
    PUNCTUATION = 1
    QUESTION_WORD = 2
    FUNCTION_WORD = 3
    CONTENT_WORD = 4
    NUMBER = 5
    NAME = 6
    LETTER = 7
    NOISE = 8


PUNCTUATION = (".", ",", "?", "!", ":")
SENTENCE_ENDS = (".", "?", "!")
QUESTION_WORDS = ("what", "where", "who", "when", "why", "how", "which")
FUNCTION_CLASSES = {  # closed classes of real English words, most frequent first
    "det": ("the", "a", "this", "that", "every", "some", "my", "his", "her", "our", "their",
            "each"),
    "pron": ("he", "she", "it"),  # with verbs in -s
    "subj": ("they", "he", "she", "we", "it", "you", "I"),  # with modals
    "obj": ("him", "her", "them", "it", "us", "me"),
    "prep": ("in", "on", "with", "to", "from", "at", "by", "for", "of", "near", "under", "over",
             "behind", "after", "before", "into", "about", "across"),
    "conj": ("and", "but", "or", "because", "so", "while", "if"),
    "modal": ("did", "can", "will", "may", "must"),
    "adv": ("very", "often", "never", "always", "also", "still", "again", "soon", "here", "there",
            "quite", "now"),
    "Adv": ("Then", "Later", "Now", "Today", "Yesterday", "Soon", "Still"),
    "quant": ("Every", "No"),
    "yesno": ("yes", "no"),
}
OTHER_FUNCTION_WORDS = ("is", "are", "was", "were", "has", "have", "not", "than", "that", "does")
ATTRIBUTES = ("color", "pet", "job", "home", "friend", "tool", "song", "secret")
COMPARATIVES = ("taller", "older", "faster", "stronger", "heavier", "smarter", "richer", "louder")
OTHER_CONTENT_WORDS = ("room", "lives", "live", "said", "asked")
SENTENCE_OPENERS = ("Is", "There", "Numbers", "Letters", "Repeat")  # only ever capitalised
FUNCTION_WORDS = frozenset(w.lower() for ws in FUNCTION_CLASSES.values() for w in ws) | \
    frozenset(OTHER_FUNCTION_WORDS)

# Pseudo-words: syllable = onset + nucleus + coda.
ONSETS = ("", "b", "bl", "br", "c", "ch", "cl", "cr", "d", "dr", "f", "fl", "fr", "g", "gl", "gr",
          "h", "j", "k", "l", "m", "n", "p", "pl", "pr", "qu", "r", "s", "sh", "sk", "sl", "sm",
          "sn", "sp", "st", "str", "sw", "t", "th", "tr", "v", "w", "wh", "z")
NUCLEI = ("a", "e", "i", "o", "u", "ai", "ea", "ee", "oo", "ou", "oa", "ie")
CODAS = ("", "b", "ck", "d", "f", "g", "k", "l", "ll", "m", "mp", "n", "nd", "ng", "nk", "nt", "p",
         "r", "rd", "rk", "rn", "s", "sh", "sk", "st", "t", "th", "x", "z")
ADJECTIVE_SUFFIXES = ("y", "ish", "ous", "ful", "al", "ic", "ive", "less")
N_NOUNS, N_VERBS, N_ADJECTIVES, N_NAMES = 2200, 700, 600, 256  # pseudo-words per class
# Syllables per pseudo-word (unless a class fixes it): mostly one or two, as in English.
SYLLABLES, SYLLABLE_PROBABILITIES = (1, 2, 3), (0.4, 0.5, 0.1)
VOCAB_SEED = 20260129  # fixes the vocabulary; never depends on a data seed


def _mojibake() -> list[str]:
    """Garbled Unicode: UTF-8 bytes of accented letters and typographic marks read as cp1252,
    once and twice (the classic encoding error), plus replacement characters."""
    source = "éèêëàâäáãåçîïíìôöóòõøûüúùñßæœÉÈÀÇÖÜÑ’‘“”–—…•€£©®°±µ¿¡"
    out = ["\ufffd", "\ufffd\ufffd", "\ufffd?"]
    for c in source:
        once = c.encode("utf-8").decode("cp1252", errors="replace")
        out += [once, once.encode("utf-8").decode("cp1252", errors="replace")]
    seen: dict[str, None] = {}
    for token in out:
        if token.isprintable() and token.split() == [token]:
            seen.setdefault(token, None)
    return list(seen)


def _checked_ids(ids, vocab_size: int) -> np.ndarray:
    """``ids`` flattened; ValueError when any is outside ``[0, vocab_size)``."""
    ids = np.asarray(ids).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"token ids must be in [0, {vocab_size}), got {ids.min()}..{ids.max()}")
    return ids


class Tokenizer:
    """A fixed vocabulary: ``symbols`` (the string of each id) and their ``index``. Text splits
    into symbols by :meth:`split` and joins back with ``separator``; subclasses set these."""

    separator = ""
    symbols: list[str]
    index: dict[str, int]

    @property
    def vocab_size(self) -> int:
        """The number of symbols."""
        return len(self.symbols)

    def split(self, text: str) -> list[str]:  # pragma: no cover - abstract
        """``text`` as a list of symbols (each subclass says how)."""
        raise NotImplementedError

    def unknown(self, symbols: list[str]) -> str:
        """The error message for symbols not in the vocabulary (sorted)."""
        return f"not in the vocabulary: {symbols[:10]}"

    def encode(self, text: str) -> list[int]:
        """Ids of the symbols of ``text``; ValueError naming unknown ones."""
        symbols = self.split(text)
        unknown = sorted(set(symbols) - self.index.keys())
        if unknown:
            raise ValueError(self.unknown(unknown))
        return [self.index[x] for x in symbols]

    def decode(self, ids) -> str:
        """The symbols of ``ids`` joined by ``separator``; ValueError for an id outside
        ``[0, vocab_size)``."""
        ids = _checked_ids(ids, self.vocab_size)
        return self.separator.join(self.symbols[i] for i in ids)


class WordTokenizer(Tokenizer):
    """Word-level tokenizer of the default corpus; words are separated by single spaces.

    The vocabulary is fixed in advance (built from ``VOCAB_SEED``): every word, punctuation mark,
    number 0-99, letter A-Z and noise token has an id. ``classes`` maps a word class (``noun``,
    ``verb``, ``verb_base``, ``adj``, ``name``, ``num``, ``letter``, ``noise``, ``attr``, ``comp``
    and the function-word classes) to its ids.

    ``token_categories`` is one :class:`Category` per id, whatever its position: the class of a
    lower-case word, name, number, letter (``A`` and ``I`` are also words; they count as
    letters), punctuation mark or noise token, and ``SENTENCE_START`` for every capitalised form
    of a word (``The``, ``He``, ``Then``, ``Every``, ``Is``, ...), the capitalised question words
    ``What``, ``Which``, ``Who``, ... included: such a form occurs only at a sentence start. The
    stream labels a capitalised question word ``QUESTION_WORD`` instead (:class:`Category`), so
    the table and the stream differ there, and the ``QUESTION_WORD`` group of an analysis of the
    vocabulary by this table (the static scores of
    :func:`~gaugebook.interpret.alignment_scores`) holds the lower-case question words only.
    """

    def __init__(self):
        rng = np.random.default_rng(VOCAB_SEED)
        english = {w for ws in FUNCTION_CLASSES.values() for w in ws if w.islower()} \
            | set(OTHER_FUNCTION_WORDS) | set(QUESTION_WORDS) | set(ATTRIBUTES) \
            | set(COMPARATIVES) | set(OTHER_CONTENT_WORDS)  # lower case; "I" comes with letters
        taken = english | FUNCTION_WORDS | {w.lower() for w in SENTENCE_OPENERS}  # grows below
        nouns = self._pseudo_words(rng, N_NOUNS, taken)
        stems = self._pseudo_words(rng, N_VERBS, taken, third_person=True)
        verbs_base, verbs = stems, [self._third_person(w) for w in stems]
        adjectives = self._pseudo_words(rng, N_ADJECTIVES, taken, suffixes=ADJECTIVE_SUFFIXES)
        names = [w.capitalize() for w in self._pseudo_words(rng, N_NAMES, taken, syllables=2)]
        letters = [chr(ord("A") + i) for i in range(26)]
        classes: dict[str, list[str]] = {
            "num": [str(i) for i in range(100)], "letter": letters, "name": names,
            "noun": nouns, "verb": verbs, "verb_base": verbs_base, "adj": adjectives,
            "attr": list(ATTRIBUTES), "comp": list(COMPARATIVES),
            "qw": list(QUESTION_WORDS), "Qw": [w.capitalize() for w in QUESTION_WORDS],
            **{k: list(v) for k, v in FUNCTION_CLASSES.items()},
            "Det": [w.capitalize() for w in FUNCTION_CLASSES["det"]],
            "Pron": [w.capitalize() for w in FUNCTION_CLASSES["pron"]],
            "Subj": [w.capitalize() for w in FUNCTION_CLASSES["subj"]],
            "noise": _mojibake(),
        }
        self.words: list[str] = []
        self.symbols = self.words  # the Tokenizer's name for them
        self.index: dict[str, int] = {}
        categories: list[Category] = []

        def add(word: str, category: Category) -> None:
            if word not in self.index:
                self.index[word] = len(self.words)
                self.words.append(word)
                categories.append(category)

        for word in PUNCTUATION:
            add(word, Category.PUNCTUATION)
        for name, category in (("num", Category.NUMBER), ("letter", Category.LETTER),
                               ("name", Category.NAME), ("noise", Category.NOISE)):
            for word in classes[name]:
                add(word, category)
        for word in sorted(english):
            add(word, self.word_category(word))
        for name in ("noun", "verb", "verb_base", "adj"):
            for word in classes[name]:
                add(word, Category.CONTENT_WORD)
        for word in itertools.chain(*classes.values(), SENTENCE_OPENERS):  # the capitalised forms
            add(word, Category.SENTENCE_START)
        self.classes = {k: np.array([self.index[w] for w in v], dtype=np.int64)
                        for k, v in classes.items()}
        self.token_categories = np.array(categories, dtype=np.uint8)

    @staticmethod
    def word_category(word: str) -> Category:
        """Category of a literal word away from a sentence start (names, numbers, letters and
        noise tokens have their own classes)."""
        if word in PUNCTUATION:
            return Category.PUNCTUATION
        if word.lower() in QUESTION_WORDS:
            return Category.QUESTION_WORD
        if word.lower() in FUNCTION_WORDS:
            return Category.FUNCTION_WORD
        return Category.CONTENT_WORD

    @staticmethod
    def _third_person(stem: str) -> str:
        return stem + ("es" if stem.endswith(("s", "sh", "ch", "x", "z")) else "s")

    @classmethod
    def _pseudo_words(cls, rng, n, taken, *, syllables=None, suffixes=(), third_person=False):
        """``n`` new words of 1-3 syllables (or exactly ``syllables``), added to ``taken``."""
        words: list[str] = []
        while len(words) < n:
            m = 2 * (n - len(words)) + 16  # candidates per round
            k = np.full(m, syllables) if syllables else \
                rng.choice(list(SYLLABLES), m, p=list(SYLLABLE_PROBABILITIES))
            onset, nucleus, coda = (rng.integers(len(parts), size=(m, 3))
                                    for parts in (ONSETS, NUCLEI, CODAS))
            inner_coda = rng.random((m, 3)) < 0.2  # codas close the last syllable, rarely others
            suffix = rng.integers(max(len(suffixes), 1), size=m)
            for r in range(m):
                word = "".join(ONSETS[onset[r, i]] + NUCLEI[nucleus[r, i]] +
                               (CODAS[coda[r, i]] if i == k[r] - 1 or inner_coda[r, i] else "")
                               for i in range(k[r]))
                word += suffixes[suffix[r]] if suffixes else ""
                forms = {word, cls._third_person(word)} if third_person else {word}
                if len(word) > 1 and not forms & taken and len(words) < n:
                    taken.update(forms)
                    words.append(word)
        return words

    separator = " "

    def split(self, text: str) -> list[str]:
        """The words of ``text``, split at whitespace."""
        return text.split()

    def unknown(self, symbols: list[str]) -> str:
        """The error message: how many words are unknown, and up to 5 of them."""
        return f"{len(symbols)} words are not in the vocabulary, e.g. {symbols[:5]}"


@cache
def default_tokenizer() -> WordTokenizer:
    """The default corpus' :class:`WordTokenizer` (built once per process)."""
    return WordTokenizer()
