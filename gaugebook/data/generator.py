"""The default corpus: a seeded, unbounded stream of English-like text with known categories,
and the logic-puzzle episodes (probes) in it.

Text: sentences from templates (capitalised starts, punctuation, questions, function words),
content words and names drawn from Zipf laws, facts stated and queried later in the same context
window (hundreds of tokens later in long rows), the logic-puzzle skills (numeric and alphabetic
patterns, near and far retrieval, simple inference, copying), and a small rate of noise tokens.
Every training row is a pure function of ``(split, seed, rank, batch index)``.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Iterator, NamedTuple

import numpy as np
import torch

from gaugebook.data.stream import Batch, check_stream_args, stream_rng, to_device
from gaugebook.data.vocabulary import (SENTENCE_ENDS, Category, WordTokenizer,
                                       default_tokenizer)

__all__ = ["DefaultCorpus", "Probes", "TASKS", "MIN_PROBE_CONTEXT"]

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
# Open classes follow the Zipf-Mandelbrot law p(rank) ~ 1 / (rank + ZIPF_OFFSET)^s with these
# exponents s; the offset is Mandelbrot's value for English, which flattens the first few ranks
# (a pure power law would give the top word of each class an implausibly large share).
ZIPF_EXPONENT = {"noun": 1.0, "verb": 1.0, "verb_base": 1.0, "adj": 1.0, "name": 0.8, "num": 0.6}
ZIPF_OFFSET = 2.7
# Closed classes (function words, listed most frequent first) decay more gently,
# p(rank) ~ 1 / rank^CLOSED_CLASS_EXPONENT: every member of a short closed list is common.
CLOSED_CLASS_EXPONENT = 0.8
# Near-word retrieval binds adjectives to nouns drawn from the most frequent RETRIEVAL_NOUNS of
# the N_NOUNS nouns: the episode tests recall from the context, not knowledge of a rare noun.
RETRIEVAL_NOUNS = 500
# Segments drawn per row beyond ceil(length / shortest segment), which always fill it: a margin.
SPARE_SEGMENTS = 3
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
        noise_rate: fraction of all tokens replaced by noise tokens. They replace tokens of plain
            sentences only, so the rate is at most the sentences' share of the stream, which
            ``skill_rate`` lowers (0.56 at the default, 0 at ``skill_rate=1``): ValueError
            beyond it.
        skill_rate: probability that a segment is a logic-puzzle episode rather than a sentence.

    Each training row of ``length`` tokens also holds one fact ("The color of Tom is wug ." or
    "Tom lives in room 42 .") as its second segment and its query ("What is the color of Tom ?
    wug ." / "Which room does Tom live in ? 42 ."): the query replaces the segment holding a
    position drawn uniformly from ``length // 4`` tokens after the fact's end up to the last one
    at which it still fits. So it starts at least ``length // 4 - 24`` tokens after the fact ends
    (24: the longest segment, 25 tokens, less one), and never before. Every row of at least 55
    tokens holds a pair; about 37% of the rows of 33 tokens (block size 32) hold none.

    Known property, kept so that the recorded runs in ``results/`` stay reproducible: the
    distractor facts of the text (``FACT_TEMPLATES``) are drawn independently of the queried
    fact, so an earlier one can state the queried name and attribute with another value. Measured
    with seed 0 over 8192 rows: 1.0% of the queries in rows of 1025 tokens (block size 1024),
    0.35% at 257 and under 0.1% at 33. The far-retrieval probes (:meth:`probes`) are unaffected:
    their filler holds no facts and their distractor fact is about another name.
    """

    def __init__(self, seed: int = 0, *, tokenizer: WordTokenizer | None = None,
                 noise_rate: float = 0.01, skill_rate: float = 0.3):
        check_stream_args(n=1, length=2, seed=seed, index=0, rank=0, split="train")
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
                weights = 1 / (ranks + ZIPF_OFFSET) ** ZIPF_EXPONENT[name]
            else:  # closed classes: listed most frequent first
                weights = 1 / ranks ** CLOSED_CLASS_EXPONENT
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
        if noise_rate > plain_share:  # the largest rate, rounded down: a value that works
            raise ValueError(f"noise_rate={noise_rate} cannot be reached with skill_rate="
                             f"{skill_rate}: noise replaces only tokens of plain sentences, so "
                             f"the largest rate is {np.floor(plain_share * 1e4) / 1e4:.4f}; ask "
                             f"for at most that, or lower skill_rate")
        self._plain_noise_rate = noise_rate / plain_share if plain_share > 0 else 0.0
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
        nouns = self.tokenizer.classes["noun"][:RETRIEVAL_NOUNS]  # by rank: the most frequent

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

    def _rows(self, rng, n: int, length: int, weights: np.ndarray, *, far: bool):
        """``n`` rows of ``length`` tokens: tokens ``[n, L]``, categories ``[n, L]`` and a mask of
        segment starts ``[n, L]``. Segments follow each other; the last one of a row is cut."""
        n_kinds = len(self.kinds)
        cdf = np.cumsum(weights) / weights.sum()
        columns = -(-length // self._min_length) + SPARE_SEGMENTS  # enough segments to fill a row
        kinds = np.searchsorted(cdf, rng.random((n, columns)), side="right")
        kinds = np.minimum(kinds, n_kinds - 1)  # [n, columns]
        if far:  # a fact in segment 1, its query in the segment holding fact end + [low, high]
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
        """The tokenizer's vocabulary size."""
        return self.tokenizer.vocab_size

    def rows(self, n: int, length: int, *, index: int = 0, split: str = "train",
             rank: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Block ``index`` of ``n`` rows of a stream, as tokens and categories ``[n, length]``: a
        pure function of ``(seed, split, rank, index, n, length)``. ``split="val"`` is the held-out
        stream; under DDP a ``rank`` can draw its own rows."""
        check_stream_args(n=n, length=length, seed=self.seed, index=index, rank=rank, split=split)
        tokens, categories, _ = self._rows(stream_rng(split, self.seed, rank, index), n, length,
                                           self._train_weights, far=True)
        return tokens, categories

    def batch(self, index: int, batch_size: int, block_size: int, *, split: str = "train",
              rank: int = 0, device="cpu") -> Batch:
        """Batch ``index`` (the training step): ``rows(batch_size, block_size + 1, index=index)``
        split into inputs and next-token targets, on ``device``."""
        tokens, categories = self.rows(batch_size, block_size + 1, index=index, split=split,
                                       rank=rank)
        device = torch.device(device)
        return Batch(*(to_device(a, device)
                       for a in (tokens[:, :-1], tokens[:, 1:], categories[:, :-1])))

    def batches(self, batch_size: int, block_size: int, *, start: int = 0, split: str = "train",
                rank: int = 0, device="cpu") -> Iterator[Batch]:
        """Endless :meth:`batch` es from ``index=start`` on (``start=k`` resumes at step ``k``)."""
        check_stream_args(n=batch_size, length=block_size + 1, seed=self.seed, index=start,
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
        check_stream_args(n=n, length=context, seed=seed, index=0, rank=0, split="probe")
        rng = stream_rng("probe", seed, TASKS.index(task))
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
