"""Data for the experiment (chapter 16): the default corpus, its 14 logic-puzzle probes, real text.

The paper pre-trains on FineWeb-Edu without repeating data. Repeating a small text makes the
comparison of optimizers about over-fitting, so the default corpus is generated: an unbounded,
seeded stream of English-like text whose every token has a known :class:`Category` (ground truth
for the interpretability analysis of chapter 18).

- Vocabulary (:class:`WordTokenizer`, fixed in advance): real English function words, question
  words and a few content words; thousands of pseudo-words built from syllables (nouns, verbs in
  two forms, adjectives with English suffixes, capitalised names); numbers 0-99; letters A-Z;
  punctuation; garbled-Unicode noise tokens (mojibake).
- Text: sentences from templates (capitalised starts, punctuation, questions, function words),
  content words and names drawn from Zipf laws, facts stated and queried hundreds of tokens later
  in the same context window, the logic-puzzle skills (numeric and alphabetic patterns, near and
  far retrieval, simple inference, copying), and a small rate of noise tokens.
- Every training row is a pure function of ``(split, seed, rank, batch index)``: the stream
  resumes exactly at any step and the validation and probe streams use disjoint seed spaces.

:func:`evaluate_probes` scores a model on fresh instances of the 14 tasks (first-answer-token loss,
top-1 and top-5 accuracy). :func:`load_tiny_shakespeare` downloads real text (checksum, cache,
clear offline error) for a :class:`CharTokenizer`.
"""
from __future__ import annotations

import hashlib
import itertools
import os
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from enum import IntEnum
from functools import cache
from pathlib import Path
from typing import Callable, Iterator, NamedTuple

import numpy as np
import torch

__all__ = ["Category", "WordTokenizer", "DefaultCorpus", "Batch", "Probes", "TASKS", "batches",
           "default_tokenizer", "evaluate_probes", "load_tiny_shakespeare", "CharTokenizer",
           "text_batches", "TINY_SHAKESPEARE_URL", "TINY_SHAKESPEARE_SHA256"]


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


# ----------------------------------------------------------------------------------------------
# Vocabulary
# ----------------------------------------------------------------------------------------------

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
N_NOUNS, N_VERBS, N_ADJECTIVES, N_NAMES = 2200, 700, 600, 256
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


class WordTokenizer:
    """Word-level tokenizer of the default corpus; words are separated by single spaces.

    The vocabulary is fixed in advance (built from ``VOCAB_SEED``): every word, punctuation mark,
    number 0-99, letter A-Z and noise token has an id. ``classes`` maps a word class (``noun``,
    ``verb``, ``verb_base``, ``adj``, ``name``, ``num``, ``letter``, ``noise``, ``attr``, ``comp``
    and the function-word classes) to its ids; ``token_categories`` is each id's category away from
    a sentence start (the letters ``A`` and ``I`` are also words; they count as letters there).
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
            k = np.full(m, syllables) if syllables else rng.choice([1, 2, 3], m, p=[0.4, 0.5, 0.1])
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

    @property
    def vocab_size(self) -> int:
        return len(self.words)

    def encode(self, text: str) -> list[int]:
        """Ids of the space-separated words of ``text``; ValueError naming unknown words."""
        words = text.split()
        unknown = sorted({w for w in words if w not in self.index})
        if unknown:
            raise ValueError(f"{len(unknown)} words are not in the vocabulary, e.g. {unknown[:5]}")
        return [self.index[w] for w in words]

    def decode(self, ids) -> str:
        ids = _checked_ids(ids, self.vocab_size)
        return " ".join(self.words[i] for i in ids)


# ----------------------------------------------------------------------------------------------
# The corpus: segment kinds
# ----------------------------------------------------------------------------------------------

PLAIN_TEMPLATES = (
    "$Det $adj $noun $verb $det $noun .",
    "$Det $noun $verb $prep $det $adj $noun .",
    "$name $verb $det $noun $conj $pron $verb $det $noun .",
    "$Pron $verb $det $noun $prep $name .",
    "$name $verb $num $noun .",
    "$Adv , $name $verb $det $adj $noun .",
    "$Qw does $name $verb_base ?",
    "$Qw $verb $det $adj $noun ?",
    "$Qw is $det $noun ?",
    "Is $det $noun $adj ?",
    "$name said that $det $noun $verb $adv .",
    "$name asked $qw $det $noun $verb .",
    "$Det $noun of $name is $adv $adj .",
    "$Subj $modal not $verb_base $det $noun .",
    "$Det $adj $noun $conj $det $noun $verb $prep $det $noun .",
    "$name and $name $verb_base $det $noun , $conj $pron $verb $adv .",
    "$name $verb $det $adj $noun !",
    "There is $det $adj $noun $prep $det $noun .",
)
FACT_TEMPLATES = (  # facts that are never queried: distractors for far retrieval
    "The $attr of $name is $noun .",
    "$name lives in room $num .",
)
ZIPF_EXPONENT = {"noun": 1.0, "verb": 1.0, "verb_base": 1.0, "adj": 1.0, "name": 0.8, "num": 0.6}
CLASS_CATEGORY = {
    **{k: Category.CONTENT_WORD for k in ("noun", "verb", "verb_base", "adj", "attr", "comp")},
    **{k: Category.FUNCTION_WORD for k in ("det", "Det", "pron", "Pron", "subj", "Subj", "obj",
                                           "prep", "conj", "modal", "adv", "Adv", "quant",
                                           "yesno")},
    "name": Category.NAME, "num": Category.NUMBER, "letter": Category.LETTER,
    "noise": Category.NOISE, "qw": Category.QUESTION_WORD, "Qw": Category.QUESTION_WORD,
}

TASKS = ("numeric_successor", "numeric_step", "numeric_descending", "numeric_cycle",
         "letters_successor", "letters_skip", "near_number", "near_word",
         "far_attribute", "far_room", "inference_transitive", "inference_syllogism",
         "copy_words", "copy_numbers")
SPLITS = {"train": 0, "val": 1, "probe": 2, "text": 3}
MIN_PROBE_CONTEXT = 32  # every episode fits; "far" facts sit at least half the context back
FILLER_MARGIN = 64  # longer than any segment: a filler row always has a boundary this close


@dataclass(frozen=True)
class _Kind:
    """A segment kind: a fixed-length token pattern (``spec``: literal words and ``$class``
    slots) and a vectorised ``fill(rng, n) -> [n, len(spec)]`` of token ids."""

    name: str
    spec: tuple[str, ...]
    fill: Callable[[np.random.Generator, int], np.ndarray] | None  # None: filled with its pair
    plain: bool = False  # plain text: noise tokens may replace its tokens
    task: str | None = None  # the probe task this kind trains
    size: int = 0  # pattern length / pairs / span of a skill kind


class Batch(NamedTuple):
    """``inputs`` and next-token ``targets`` ``[B, T]`` (int64); ``categories [B, T]`` (uint8,
    :class:`Category` of each input token; ``None`` for real text)."""

    inputs: torch.Tensor
    targets: torch.Tensor
    categories: torch.Tensor | None


class Probes(NamedTuple):
    """``prompts [n, context]`` (int64) and the first answer token ``answers [n]``."""

    prompts: torch.Tensor
    answers: torch.Tensor


def _distinct(rng, n: int, k: int, size: int) -> np.ndarray:
    """``[n, k]`` indices into ``range(size)``, distinct within each row (random start and gaps)."""
    gaps = rng.integers(1, size // k + 1, (n, k))
    return (rng.integers(0, size, (n, 1)) + np.cumsum(gaps, axis=1)) % size


class DefaultCorpus:
    """The default corpus: a seeded, unbounded stream of English-like text with known categories.

    Args:
        seed: the stream's seed (rows are a pure function of seed, split, rank and index).
        tokenizer: the vocabulary (default: :func:`default_tokenizer`).
        noise_rate: fraction of all tokens replaced by noise tokens (placed in plain sentences).
        skill_rate: probability that a segment is a logic-puzzle episode rather than a sentence.

    Each training row also holds one fact ("The color of Tom is wug ." or "Tom lives in room 42 .")
    near its start and its query ("What is the color of Tom ? wug ." / "Which room does Tom live
    in ? 42 .") at least a quarter of the row later.
    """

    def __init__(self, seed: int = 0, *, tokenizer: WordTokenizer | None = None,
                 noise_rate: float = 0.01, skill_rate: float = 0.3):
        _check_stream_args(n=1, length=2, seed=seed, index=0, rank=0, split="train")
        if not 0 <= noise_rate < 0.5:
            raise ValueError(f"noise_rate must be in [0, 0.5), got {noise_rate}")
        if not 0 <= skill_rate <= 1:
            raise ValueError(f"skill_rate must be in [0, 1], got {skill_rate}")
        self.seed = seed
        self.tokenizer = tokenizer or default_tokenizer()
        self.noise_rate, self.skill_rate = noise_rate, skill_rate
        self._samplers = {}
        for name, ids in self.tokenizer.classes.items():
            ranks = np.arange(1, len(ids) + 1)
            if name in ZIPF_EXPONENT:  # Zipf-Mandelbrot over the class, by rank
                weights = 1 / (ranks + 2.7) ** ZIPF_EXPONENT[name]
            else:  # closed classes: listed most frequent first
                weights = 1 / ranks ** 0.8
            self._samplers[name] = (ids, np.cumsum(weights) / weights.sum())
        self.kinds = self._make_kinds()
        index = {k.name: i for i, k in enumerate(self.kinds)}
        self._length = np.array([len(k.spec) for k in self.kinds])
        self._plain = np.array([k.plain for k in self.kinds])
        rows = [self._categories(k.spec) for k in self.kinds]
        self._category_offset = np.cumsum([0] + [len(r) for r in rows[:-1]])
        self._category_flat = np.concatenate(rows)
        self._facts = np.array([index["far_attribute_fact"], index["far_room_fact"]])
        self._queries = np.array([index["far_attribute_query"], index["far_room_query"]])
        self._pair_fill = {index["far_attribute_fact"]: self._far_attribute,
                           index["far_room_fact"]: self._far_room}
        self._task_kinds = {t: [i for i, k in enumerate(self.kinds) if k.task == t] for t in TASKS}

        plain = np.array([k.plain and not k.name.startswith("fact") for k in self.kinds], float)
        facts = np.array([k.name.startswith("fact") for k in self.kinds], float)
        skills = np.zeros(len(self.kinds))
        for t in TASKS:  # the far-retrieval kinds are placed per row, not sampled
            kinds = [i for i in self._task_kinds[t] if self.kinds[i].fill is not None]
            skills[kinds] = 1 / max(len(kinds), 1)
        # Sentences : facts = 10 : 1 among plain segments; skill tasks share skill_rate equally.
        text = plain / plain.sum() * 10 / 11 + facts / facts.sum() / 11
        self._train_weights = (1 - skill_rate) * text + skill_rate * skills / skills.sum()
        self._filler_weights = plain / plain.sum()
        mean_length = self._train_weights @ self._length
        plain_share = (self._train_weights * self._plain) @ self._length / mean_length
        self._plain_noise_rate = min(1.0, noise_rate / plain_share) if plain_share > 0 else 0.0
        self._min_length = int(self._length.min())

    # ---------------------------------------------------------------- kinds and their fill rules

    def _categories(self, spec: tuple[str, ...]) -> np.ndarray:
        """Category of each position of a segment: a capitalised word at the start or after a
        sentence end is a SENTENCE_START unless it is a question word."""
        out = []
        for j, item in enumerate(spec):
            if item.startswith("$"):
                category = CLASS_CATEGORY[item[1:]]
                word = self.tokenizer.words[self.tokenizer.classes[item[1:]][0]]
            else:
                category, word = self.tokenizer.word_category(item), item
            starts = j == 0 or spec[j - 1] in SENTENCE_ENDS
            if starts and word[:1].isupper() and category != Category.QUESTION_WORD:
                category = Category.SENTENCE_START
            out.append(category)
        return np.array(out, dtype=np.uint8)

    def _sample(self, rng, name: str, shape) -> np.ndarray:
        ids, cdf = self._samplers[name]
        return ids[np.minimum(np.searchsorted(cdf, rng.random(shape), side="right"), len(ids) - 1)]

    def _id(self, word: str) -> int:
        return self.tokenizer.index[word]

    def _template(self, spec: tuple[str, ...]):
        def fill(rng, n):
            out = np.empty((n, len(spec)), dtype=np.int64)
            for j, item in enumerate(spec):
                out[:, j] = (self._sample(rng, item[1:], n) if item.startswith("$")
                             else self._id(item))
            return out
        return fill

    def _columns(self, n: int, *columns) -> np.ndarray:
        """Stack literal words (str), id vectors ``[n]`` and blocks ``[n, k]`` into ``[n, L]``."""
        blocks = [np.full((n, 1), self._id(c)) if isinstance(c, str)
                  else np.asarray(c).reshape(n, -1) for c in columns]
        return np.concatenate(blocks, axis=1)

    def _numbers(self, rule: str, m: int):
        num = self.tokenizer.classes["num"]

        def fill(rng, n):
            k = np.arange(m)
            if rule == "cycle":  # period 2 or 3 over distinct values
                values = _distinct(rng, n, 3, 100)
                period = rng.integers(2, 4, (n, 1))
                seq = np.take_along_axis(values, k % period, axis=1)
            else:
                step = {"successor": np.ones(n, np.int64), "step": rng.integers(2, 10, n),
                        "descending": -rng.integers(1, 10, n)}[rule]
                span = np.abs(step) * (m - 1)
                first = rng.integers(0, 100 - span) + np.where(step < 0, span, 0)
                seq = first[:, None] + step[:, None] * k
            return self._columns(n, "Numbers", ":", num[seq], ".")
        return fill

    def _letters(self, step: int, m: int):
        letter = self.tokenizer.classes["letter"]

        def fill(rng, n):
            first = rng.integers(0, 26 - step * (m - 1), n)
            sequence = letter[first[:, None] + step * np.arange(m)]
            return self._columns(n, "Letters", ":", sequence, ".")
        return fill

    def _near_number(self, p: int):
        names, num = self.tokenizer.classes["name"], self.tokenizer.classes["num"]

        def fill(rng, n):
            who = names[_distinct(rng, n, p, len(names))]
            value = num[rng.integers(0, 100, (n, p))]
            q = rng.integers(0, p, n)
            ends = [","] * (p - 1) + ["."]
            pairs = [c for j in range(p) for c in (who[:, j], "has", value[:, j], ends[j])]
            asked = np.arange(n), q
            return self._columns(n, *pairs, who[asked], "has", value[asked], ".")
        return fill

    def _near_word(self, p: int):
        nouns = self.tokenizer.classes["noun"][:500]

        def fill(rng, n):
            noun = nouns[_distinct(rng, n, p, len(nouns))]
            adj = self._sample(rng, "adj", (n, p))
            q = rng.integers(0, p, n)
            clauses = [c for j in range(p) for c in
                       (("The",) if j == 0 else (",", "the")) + (noun[:, j], "is", adj[:, j])]
            return self._columns(n, *clauses, ".", "The", noun[np.arange(n), q], "is",
                                 adj[np.arange(n), q], ".")
        return fill

    def _transitive(self, rng, n):
        names = self.tokenizer.classes["name"]
        a, b, c = names[_distinct(rng, n, 3, len(names))].T
        comp = self._sample(rng, "comp", n)
        first = self._columns(n, a, "is", comp, "than", b, ".")
        second = self._columns(n, b, "is", comp, "than", c, ".")
        swap = rng.random(n) < 0.5
        premises = np.where(swap[:, None], np.concatenate([second, first], 1),
                            np.concatenate([first, second], 1))
        yes = rng.random(n) < 0.5
        x, y = np.where(yes, a, c), np.where(yes, c, a)
        answer = np.where(yes, self._id("yes"), self._id("no"))
        return self._columns(n, premises, "Is", x, comp, "than", y, "?", answer, ".")

    def _syllogism(self, rng, n):
        every = rng.random(n) < 0.5
        noun, adj, name = (self._sample(rng, c, n) for c in ("noun", "adj", "name"))
        return self._columns(n, np.where(every, self._id("Every"), self._id("No")), noun, "is", adj,
                             ".", name, "is", "a", noun, ".", "Is", name, adj, "?",
                             np.where(every, self._id("yes"), self._id("no")), ".")

    def _copy(self, source: str, k: int):
        def fill(rng, n):
            if source == "num":
                span = self.tokenizer.classes["num"][rng.integers(0, 100, (n, k))]
            else:
                span = self._sample(rng, source, (n, k))
            return self._columns(n, "Repeat", ":", span, ".", span, ".")
        return fill

    def _far_attribute(self, rng, n):
        attr, name, value = (self._sample(rng, c, n) for c in ("attr", "name", "noun"))
        return (self._columns(n, "The", attr, "of", name, "is", value, "."),
                self._columns(n, "What", "is", "the", attr, "of", name, "?", value, "."))

    def _far_room(self, rng, n):
        name = self._sample(rng, "name", n)
        room = self.tokenizer.classes["num"][rng.integers(0, 100, n)]
        return (self._columns(n, name, "lives", "in", "room", room, "."),
                self._columns(n, "Which", "room", "does", name, "live", "in", "?", room, "."))

    def _make_kinds(self) -> list[_Kind]:
        def kind(name, spec: str, fill="template", **kw) -> _Kind:
            spec = tuple(spec.split())
            return _Kind(name, spec, self._template(spec) if fill == "template" else fill, **kw)

        kinds = [kind(f"plain{i}", s, plain=True) for i, s in enumerate(PLAIN_TEMPLATES)]
        kinds += [kind(f"fact{i}", s, plain=True) for i, s in enumerate(FACT_TEMPLATES)]
        for rule in ("successor", "step", "descending", "cycle"):
            kinds += [kind(f"numeric_{rule}{m}", "Numbers : " + "$num " * m + ".",
                           self._numbers(rule, m), task=f"numeric_{rule}", size=m)
                      for m in range(5, 9)]
        for task, step in (("letters_successor", 1), ("letters_skip", 2)):
            kinds += [kind(f"{task}{m}", "Letters : " + "$letter " * m + ".",
                           self._letters(step, m), task=task, size=m) for m in range(5, 9)]
        for p in (3, 4, 5):
            spec = " , ".join(["$name has $num"] * p) + " . $name has $num ."
            kinds.append(kind(f"near_number{p}", spec, self._near_number(p), task="near_number",
                              size=p))
        for p in (2, 3, 4):
            spec = "The " + " , the ".join(["$noun is $adj"] * p) + " . The $noun is $adj ."
            kinds.append(kind(f"near_word{p}", spec, self._near_word(p), task="near_word", size=p))
        kinds.append(kind("inference_transitive", "$name is $comp than $name . " * 2 +
                          "Is $name $comp than $name ? $yesno .", self._transitive,
                          task="inference_transitive"))
        kinds.append(kind("inference_syllogism", "$quant $noun is $adj . $name is a $noun . "
                          "Is $name $adj ? $yesno .", self._syllogism, task="inference_syllogism"))
        for task, source in (("copy_words", "noun"), ("copy_numbers", "num")):
            kinds += [kind(f"{task}{k}", "Repeat : " + f"${source} " * k + ". " + f"${source} " * k
                           + ".", self._copy(source, k), task=task, size=k) for k in range(3, 9)]
        # Far-retrieval pairs are filled together (fill=None) and placed per row.
        kinds += [
            kind("far_attribute_fact", "The $attr of $name is $noun .", None, task="far_attribute"),
            kind("far_attribute_query", "What is the $attr of $name ? $noun .", None,
                 task="far_attribute"),
            kind("far_room_fact", "$name lives in room $num .", None, task="far_room"),
            kind("far_room_query", "Which room does $name live in ? $num .", None, task="far_room"),
        ]
        return kinds

    # ---------------------------------------------------------------- rows of the stream

    @staticmethod
    def _rng(split: str, seed: int, *key: int) -> np.random.Generator:
        return np.random.default_rng(np.random.SeedSequence([SPLITS[split], seed, *key]))

    def _rows(self, rng, n: int, length: int, weights: np.ndarray, *, far: bool):
        """``n`` rows of ``length`` tokens: tokens ``[n, L]``, categories ``[n, L]`` and a mask of
        segment starts ``[n, L]``. Segments follow each other; the last one of a row is cut."""
        n_kinds = len(self.kinds)
        cdf = np.cumsum(weights) / weights.sum()
        columns = -(-length // self._min_length) + 3  # enough segments to fill a row
        kinds = np.searchsorted(cdf, rng.random((n, columns)), side="right")
        kinds = np.minimum(kinds, n_kinds - 1)  # [n, columns]
        if far:  # a fact in segment 1, its query at least length // 4 tokens later
            pair = rng.integers(0, 2, n)
            fact, query = self._facts[pair], self._queries[pair]
            fact_end = self._length[kinds[:, 0]] + self._length[fact]
            low, high = length // 4, length - fact_end - self._length[query] - 1
            rows = np.flatnonzero(high >= low)
            kinds[rows, 1] = fact[rows]
            ends = np.cumsum(self._length[kinds[rows]], axis=1)
            target = fact_end[rows] + rng.integers(low, high[rows] + 1)
            kinds[rows, np.argmax(ends > target[:, None], axis=1)] = query[rows]  # starts <= target
        lengths = self._length[kinds]
        starts = np.cumsum(lengths, axis=1) - lengths
        used = starts < length
        kinds, lengths = kinds[used], np.minimum(lengths, length - starts)[used]  # row-major order

        # Fill each kind once, vectorised over all its segments; the i-th fact and the i-th query
        # of a pair kind belong to the same row.
        counts = np.bincount(kinds, minlength=n_kinds)
        order = np.argsort(kinds, kind="stable")
        ordinal = np.empty_like(kinds)
        ordinal[order] = np.arange(len(kinds)) - np.repeat(np.cumsum(counts) - counts, counts)
        pools: dict[int, np.ndarray] = {}
        for k in np.flatnonzero(counts):
            if k in self._pair_fill:
                query = self._queries[self._facts == k][0]
                pools[k], pools[query] = self._pair_fill[k](rng, counts[k])
            elif self.kinds[k].fill is not None:
                pools[k] = self.kinds[k].fill(rng, counts[k])
        offset = np.zeros(n_kinds, dtype=np.int64)
        offset[sorted(pools)] = np.cumsum([0] + [pools[k].size for k in sorted(pools)][:-1])
        pool = np.concatenate([pools[k].ravel() for k in sorted(pools)])

        # Gather: output position -> (segment, position in segment) -> pool / category table.
        segment_start = np.cumsum(lengths) - lengths
        position = np.arange(n * length)
        in_segment = position - np.repeat(segment_start, lengths)
        kind_at = np.repeat(kinds, lengths)
        first = offset[kinds] + ordinal * self._length[kinds]  # each segment's start in the pool
        tokens = pool[np.repeat(first, lengths) + in_segment]
        categories = self._category_flat[self._category_offset[kind_at] + in_segment]
        noisy = self._plain[kind_at] & (rng.random(n * length) < self._plain_noise_rate)
        tokens[noisy] = self._sample(rng, "noise", int(noisy.sum()))
        categories[noisy] = Category.NOISE
        return (tokens.reshape(n, length), categories.reshape(n, length),
                (in_segment == 0).reshape(n, length))

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def rows(self, n: int, length: int, *, index: int = 0, split: str = "train",
             rank: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Block ``index`` of ``n`` rows of a stream, as tokens and categories ``[n, length]``: a
        pure function of ``(seed, split, rank, index, n, length)``. ``split="val"`` is the held-out
        stream; under DDP a ``rank`` can draw its own rows."""
        _check_stream_args(n=n, length=length, seed=self.seed, index=index, rank=rank, split=split)
        tokens, categories, _ = self._rows(self._rng(split, self.seed, rank, index), n, length,
                                           self._train_weights, far=True)
        return tokens, categories

    def batch(self, index: int, batch_size: int, block_size: int, *, split: str = "train",
              rank: int = 0, device="cpu") -> Batch:
        """Batch ``index`` (the training step): ``rows(batch_size, block_size + 1, index=index)``
        split into inputs and next-token targets, on ``device``."""
        tokens, categories = self.rows(batch_size, block_size + 1, index=index, split=split,
                                       rank=rank)
        device = torch.device(device)
        return Batch(*(_to_device(a, device)
                       for a in (tokens[:, :-1], tokens[:, 1:], categories[:, :-1])))

    def batches(self, batch_size: int, block_size: int, *, start: int = 0, split: str = "train",
                rank: int = 0, device="cpu") -> Iterator[Batch]:
        """Endless :meth:`batch` es from ``index=start`` on (``start=k`` resumes at step ``k``)."""
        _check_stream_args(n=batch_size, length=block_size + 1, seed=self.seed, index=start,
                           rank=rank, split=split)
        for index in itertools.count(start):
            yield self.batch(index, batch_size, block_size, split=split, rank=rank, device=device)

    def text(self, n_tokens: int = 200, *, index: int = 0) -> str:
        """A sample of the training stream as text."""
        return self.tokenizer.decode(self.rows(1, n_tokens, index=index)[0])

    # ---------------------------------------------------------------- probes

    def probes(self, task: str, n: int, *, context: int, seed: int = 0) -> Probes:
        """``n`` fresh instances of a logic-puzzle ``task``: each prompt is ``context`` tokens of
        stream-like text ending just before the first answer token. Probe seeds live in their own
        seed space, so no probe row is a training row."""
        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}; the tasks are {TASKS}")
        if context < MIN_PROBE_CONTEXT:
            raise ValueError(f"probe prompts need context >= {MIN_PROBE_CONTEXT} tokens, "
                             f"got {context}")
        _check_stream_args(n=n, length=context, seed=seed, index=0, rank=0, split="probe")
        rng = self._rng("probe", seed, TASKS.index(task))
        filler, _, starts = self._filler(rng, n, context)
        if task.startswith("far_"):
            pieces = self._far_probes(rng, task, n, context)
        else:
            pieces = self._near_probes(rng, task, n)
        prompts = np.empty((n, context), dtype=np.int64)
        answers = np.empty(n, dtype=np.int64)
        for i, (body, answer) in enumerate(pieces):
            prompts[i] = np.concatenate([_tail(filler[i], starts[i], context - len(body)), body])
            answers[i] = answer
        return Probes(torch.from_numpy(prompts), torch.from_numpy(answers))

    def _filler(self, rng, n: int, context: int):
        """Rows of plain sentences (no facts), longer than a prompt: text to put before a probe."""
        return self._rows(rng, n, context + FILLER_MARGIN, self._filler_weights, far=False)

    def _near_probes(self, rng, task: str, n: int) -> list[tuple[np.ndarray, int]]:
        """(episode cut before the answer, answer) for the tasks whose episode is one segment."""
        kinds = self._task_kinds[task]
        choice = rng.integers(0, len(kinds), n)
        pieces: list = [None] * n
        for c, k in enumerate(kinds):
            rows = np.flatnonzero(choice == c)
            if len(rows) == 0:
                continue
            episodes, size = self.kinds[k].fill(rng, len(rows)), self.kinds[k].size
            if task.startswith(("numeric", "letters")):  # show 4 .. m-1 terms
                cuts = 2 + rng.integers(4, size, len(rows))
            elif task.startswith("copy"):  # copy 1 .. k-1 words of the span
                cuts = 3 + size + rng.integers(1, size, len(rows))
            else:  # retrieval and inference: the answer is the word before the final "."
                cuts = np.full(len(rows), episodes.shape[1] - 2)
            for i, episode, cut in zip(rows, episodes, cuts):
                pieces[i] = (episode[:cut], episode[cut])
        return pieces

    def _far_probes(self, rng, task, n, context) -> list[tuple[np.ndarray, int]]:
        """Fact, then whole filler sentences with a distractor fact (another name), then the
        query: the fact sits at least half the context before the answer."""
        filler, _, starts = self._filler(rng, n, context)
        fill = self._far_attribute if task == "far_attribute" else self._far_room
        facts, queries = fill(rng, 2 * n)
        name_column = 3 if task == "far_attribute" else 0
        names = self.tokenizer.classes["name"]
        target, distractor = facts[:n, name_column], facts[n:, name_column]
        same = distractor == target
        facts[n:, name_column][same] = names[(np.searchsorted(names, target[same]) + 1)
                                             % len(names)]
        pieces = []
        for i in range(n):
            fact, distractor, query = facts[i], facts[n + i], queries[i]
            budget = context - len(fact) - len(distractor) - (len(query) - 2)
            boundaries = np.flatnonzero(starts[i])
            end = boundaries[boundaries <= budget - rng.integers(0, 9)].max()  # whole sentences
            split = rng.choice(boundaries[boundaries <= end])
            middle = filler[i, :end]
            pieces.append((np.concatenate([fact, middle[:split], distractor, middle[split:],
                                           query[:-2]]), query[-2]))
        return pieces


def _tail(row: np.ndarray, starts: np.ndarray, need: int) -> np.ndarray:
    """The last ``need`` tokens before the first segment boundary at or after ``need``."""
    if need == 0:
        return row[:0]
    end = np.flatnonzero(starts[need:])[0] + need
    return row[end - need:end]


def _check_stream_args(*, n, length, seed, index, rank, split) -> None:
    for name, value, low in (("batch size", n, 1), ("length", length, 2), ("seed", seed, 0),
                             ("start index", index, 0), ("rank", rank, 0)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {tuple(SPLITS)}, got {split!r}")


def _to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


@cache
def default_tokenizer() -> WordTokenizer:
    """The default corpus' :class:`WordTokenizer` (built once per process)."""
    return WordTokenizer()


def batches(batch_size: int, block_size: int, *, seed: int, device="cpu", start: int = 0,
            split: str = "train", rank: int = 0) -> Iterator[Batch]:
    """:meth:`DefaultCorpus.batches` of the default corpus with this ``seed``."""
    return DefaultCorpus(seed).batches(batch_size, block_size, start=start, split=split, rank=rank,
                                       device=device)


# ----------------------------------------------------------------------------------------------
# Scoring a model on the probes
# ----------------------------------------------------------------------------------------------

@torch.no_grad()
def evaluate_probes(model: torch.nn.Module, tokenizer: WordTokenizer, *, n_per_task: int = 64,
                    device="cpu", context: int | None = None, seed: int = 0,
                    batch_size: int = 64) -> dict[str, dict[str, float]]:
    """Score ``model`` on fresh instances of the 14 logic-puzzle tasks.

    The model is called as ``logits, _ = model(idx)`` with ``idx [b, context]``; the logits at the
    last position predict the first answer token. Returns, for each task and for their ``"mean"``,
    ``{"loss": cross-entropy of the answer token, "top1": accuracy, "top5": accuracy}``.
    ``context`` defaults to ``model.config.block_size``.
    """
    if not isinstance(tokenizer, WordTokenizer):
        raise ValueError(f"the probes are written in the default corpus' words: pass a "
                         f"WordTokenizer, got {type(tokenizer).__name__}")
    if context is None:
        context = getattr(getattr(model, "config", None), "block_size", None)
        if context is None:
            raise ValueError("pass context=... (the model has no config.block_size)")
    corpus = DefaultCorpus(tokenizer=tokenizer)
    was_training = model.training
    model.eval()
    scores = {}
    try:
        for task in TASKS:
            prompts, answers = corpus.probes(task, n_per_task, context=context, seed=seed)
            logits = torch.cat([model(chunk.to(device))[0][:, -1, :].float().cpu()
                                for chunk in prompts.split(batch_size)])
            if logits.shape[-1] < tokenizer.vocab_size:
                raise ValueError(f"the model has {logits.shape[-1]} logits, the tokenizer "
                                 f"{tokenizer.vocab_size} tokens")
            top5 = logits.topk(5, dim=-1).indices
            scores[task] = {
                "loss": torch.nn.functional.cross_entropy(logits, answers).item(),
                "top1": (top5[:, 0] == answers).float().mean().item(),
                "top5": (top5 == answers[:, None]).any(dim=1).float().mean().item(),
            }
    finally:
        model.train(was_training)
    scores["mean"] = {m: float(np.mean([scores[t][m] for t in TASKS]))
                      for m in ("loss", "top1", "top5")}
    return scores


# ----------------------------------------------------------------------------------------------
# Real text: tiny Shakespeare
# ----------------------------------------------------------------------------------------------

TINY_SHAKESPEARE_URL = ("https://raw.githubusercontent.com/karpathy/char-rnn/master/data/"
                        "tinyshakespeare/input.txt")
TINY_SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
TINY_SHAKESPEARE_BYTES = 1_115_394


def load_tiny_shakespeare(cache_dir: str | os.PathLike | None = None,
                          url: str = TINY_SHAKESPEARE_URL) -> str:
    """The tiny Shakespeare corpus as text, downloaded once into ``cache_dir`` (default
    ``~/.cache/gaugebook``) and verified by its sha256 checksum.

    Raises ``ConnectionError`` when offline (naming the URL and where to put the file by hand) and
    ``ValueError`` when the download has the wrong checksum (nothing is saved then).
    """
    cache_dir = Path(cache_dir if cache_dir is not None else "~/.cache/gaugebook").expanduser()
    path = cache_dir / "tinyshakespeare.txt"
    if path.is_file():
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() == TINY_SHAKESPEARE_SHA256:
            return data.decode("utf-8")
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            data = response.read()
    except (urllib.error.URLError, OSError) as error:
        raise ConnectionError(
            f"could not download tiny Shakespeare from {url} ({error}). If this machine is "
            f"offline, download that file elsewhere and save it as {path} "
            f"(sha256 {TINY_SHAKESPEARE_SHA256}, {TINY_SHAKESPEARE_BYTES:,} bytes)") from error
    digest = hashlib.sha256(data).hexdigest()
    if digest != TINY_SHAKESPEARE_SHA256:
        raise ValueError(f"the file at {url} has sha256 {digest} ({len(data):,} bytes), expected "
                         f"{TINY_SHAKESPEARE_SHA256} ({TINY_SHAKESPEARE_BYTES:,} bytes); nothing "
                         "was saved")
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as tmp:  # atomic: no half files
        tmp.write(data)
    os.replace(tmp.name, path)
    return data.decode("utf-8")


class CharTokenizer:
    """Character-level tokenizer: one id per distinct character of ``text`` (sorted)."""

    def __init__(self, text: str):
        if not text:
            raise ValueError("CharTokenizer needs a non-empty text to build its vocabulary")
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        unknown = sorted(set(text) - self.index.keys())
        if unknown:
            raise ValueError(f"characters not in the vocabulary: {unknown[:10]}")
        return [self.index[c] for c in text]

    def decode(self, ids) -> str:
        ids = _checked_ids(ids, self.vocab_size)
        return "".join(self.chars[i] for i in ids)


def text_batches(ids, batch_size: int, block_size: int, *, seed: int, device="cpu",
                 start: int = 0) -> Iterator[Batch]:
    """Endless batches of random windows of a token sequence ``ids``; batch ``k`` is a pure
    function of ``(seed, k)`` (``start=k`` resumes). ``categories`` is ``None``."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.ndim != 1 or len(ids) < block_size + 1:
        raise ValueError(f"ids must be a 1-D sequence of at least block_size + 1 = "
                         f"{block_size + 1} tokens, got shape {ids.shape}")
    _check_stream_args(n=batch_size, length=block_size + 1, seed=seed, index=start, rank=0,
                       split="text")
    device = torch.device(device)
    window = np.arange(block_size + 1)
    for index in itertools.count(start):
        rng = DefaultCorpus._rng("text", seed, index)
        first = rng.integers(0, len(ids) - block_size, batch_size)  # windows may end at the end
        rows = ids[first[:, None] + window]
        yield Batch(_to_device(rows[:, :-1], device), _to_device(rows[:, 1:], device), None)
