"""Data for the experiments (chapters 9, 12 and 17 to 20): the default corpus, its 14 puzzle
probes, real text.

The paper pre-trains on FineWeb-Edu without repeating data. Repeating a small text makes the
comparison of optimizers about over-fitting, so the default corpus is generated: an unbounded,
seeded stream of English-like text whose every token has a known :class:`Category` (ground truth
for the interpretability analysis of chapter 18).

- Vocabulary (:class:`WordTokenizer`, fixed in advance): real English function words, question
  words and a few content words; thousands of pseudo-words built from syllables (nouns, verbs in
  two forms, adjectives with English suffixes, capitalised names); numbers 0-99; letters A-Z;
  punctuation; garbled-Unicode noise tokens (mojibake).
- Text: sentences from templates (capitalised starts, punctuation, questions, function words),
  content words and names drawn from Zipf laws, facts stated and queried later in the same
  context window (hundreds of tokens later in long rows), the logic-puzzle skills (numeric and alphabetic patterns, near and
  far retrieval, simple inference, copying), and a small rate of noise tokens.
- Every training row is a pure function of ``(split, seed, rank, batch index)``: the stream
  resumes exactly at any step and the validation and probe streams use disjoint seed spaces.

:func:`evaluate_probes` scores a model on fresh instances of the 14 tasks (first-answer-token loss,
top-1 and top-5 accuracy). :func:`load_tiny_shakespeare` downloads real text (checksum, cache,
clear offline error) for a :class:`CharTokenizer`.

The package's modules: ``vocabulary`` (categories, words, :class:`WordTokenizer`),
``generator`` (:class:`DefaultCorpus`: its kinds of segments, rows and probes), ``probes``
(:func:`evaluate_probes`), ``text`` (tiny Shakespeare) and ``stream`` (what the streams share:
seed spaces, :class:`Batch`, checks). Every public name is importable from ``gaugebook.data``.
"""
from gaugebook.data.generator import MIN_PROBE_CONTEXT, TASKS, DefaultCorpus, Probes
from gaugebook.data.probes import evaluate_probes
from gaugebook.data.stream import Batch
from gaugebook.data.text import (TINY_SHAKESPEARE_SHA256, TINY_SHAKESPEARE_URL, CharTokenizer,
                                 load_tiny_shakespeare, text_batches)
from gaugebook.data.vocabulary import Category, Tokenizer, WordTokenizer, default_tokenizer

__all__ = ["Category", "Tokenizer", "WordTokenizer", "DefaultCorpus", "Batch", "Probes", "TASKS",
           "default_tokenizer", "evaluate_probes", "load_tiny_shakespeare", "CharTokenizer",
           "text_batches", "TINY_SHAKESPEARE_URL", "TINY_SHAKESPEARE_SHA256", "MIN_PROBE_CONTEXT"]
