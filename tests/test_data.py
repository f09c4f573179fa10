"""The default corpus, its probes and the real-text loader (no network: a local HTTP server)."""
import functools
import hashlib
import http.server
import math
import socket
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from gaugebook.data import (TASKS, TINY_SHAKESPEARE_SHA256, Category, CharTokenizer, DefaultCorpus,
                            WordTokenizer, evaluate_probes, load_tiny_shakespeare,
                            text_batches)

SHAKESPEARE = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "tinyshakespeare.txt"


@pytest.fixture(scope="module")
def corpus():
    return DefaultCorpus(seed=0)


@pytest.fixture(scope="module")
def tok(corpus):
    return corpus.tokenizer


# ---------------------------------------------------------------- vocabulary

def test_vocabulary(tok):
    assert 4000 <= tok.vocab_size <= 8000
    assert len(set(tok.words)) == tok.vocab_size
    assert all(w and w.split() == [w] for w in tok.words)  # one word per token, no spaces
    for word in [str(i) for i in range(100)] + list("ABCDEFGHIJKLMNOPQRSTUVWXYZ") + list(".,?!:"):
        assert word in tok.index
    assert all(not tok.words[i].isascii() for i in tok.classes["noise"])
    content = [set(tok.classes[c].tolist()) for c in ("noun", "verb", "verb_base", "adj", "name")]
    assert sum(map(len, content)) == len(set().union(*content))  # disjoint classes
    assert WordTokenizer().words == tok.words  # fixed in advance


def test_encode_decode(tok, corpus):
    text = corpus.text(300, index=3)
    assert tok.decode(tok.encode(text)) == text
    with pytest.raises(ValueError, match="blorptastic"):
        tok.encode("The blorptastic cat")
    with pytest.raises(ValueError, match="token ids"):
        tok.decode([tok.vocab_size])


# ---------------------------------------------------------------- the stream

def test_batches_shift_determinism_and_resume():
    def batches(*, seed, **options):
        return DefaultCorpus(seed).batches(4, 32, **options)

    stream = batches(seed=5)
    first = [next(stream) for _ in range(4)]
    x, y, c = first[0]
    assert x.shape == y.shape == c.shape == (4, 32)
    assert x.dtype == y.dtype == torch.int64 and c.dtype == torch.uint8
    assert torch.equal(x[:, 1:], y[:, :-1])
    resumed = next(batches(seed=5, start=3))
    assert all(torch.equal(a, b) for a, b in zip(resumed, first[3]))
    assert all(torch.equal(a, b) for a, b in zip(next(batches(seed=5)), first[0]))
    for other in (dict(seed=6), dict(seed=5, split="val"), dict(seed=5, rank=1)):
        assert not torch.equal(next(batches(**other)).inputs, x), other
    corpus = DefaultCorpus(seed=5)
    assert corpus.vocab_size == corpus.tokenizer.vocab_size
    assert all(torch.equal(a, b) for a, b in zip(corpus.batch(2, 4, 32), first[2]))
    with pytest.raises(ValueError, match="split"):
        next(batches(seed=0, split="test"))
    with pytest.raises(ValueError, match="seed"):
        next(batches(seed=-1))


def test_categories_are_ground_truth(corpus, tok):
    tokens, cats = corpus.rows(32, 257, index=1)
    t, c = tokens.ravel(), cats.ravel()
    classes = {k: np.isin(t, v) for k, v in tok.classes.items()}
    assert set(np.unique(c)) == set(Category)
    assert np.isin(t[c == Category.PUNCTUATION], [tok.index[p] for p in ".,?!:"]).all()
    assert classes["num"][c == Category.NUMBER].all()
    assert classes["name"][c == Category.NAME].all()
    assert classes["noise"][c == Category.NOISE].all()
    assert classes["letter"][c == Category.LETTER].all()
    assert (classes["qw"] | classes["Qw"])[c == Category.QUESTION_WORD].all()
    assert all(tok.words[i][0].isupper() for i in t[c == Category.SENTENCE_START])
    # A capitalised word after a full stop opens a sentence (unless it is a question word);
    # lower-case words and numbers after a full stop are copies ("Repeat : a b . a b .").
    stop = np.isin(tokens[:, :-1], [tok.index["."], tok.index["!"]])
    capital = np.array([w[0].isupper() for w in tok.words])[tokens[:, 1:]]
    assert np.isin(cats[:, 1:][stop & capital],
                   [Category.SENTENCE_START, Category.QUESTION_WORD, Category.NOISE]).all()
    assert np.isin(cats[:, 1:][stop & ~capital],
                   [Category.CONTENT_WORD, Category.NUMBER, Category.NOISE]).all()
    assert 0.6 * corpus.noise_rate < (c == Category.NOISE).mean() < 1.4 * corpus.noise_rate


def test_noise_rates_beyond_the_plain_sentences_are_refused():
    """Noise replaces only tokens of plain sentences; a larger rate used to be capped silently
    (0.1 with skill_rate=1 gave no noise, 0.3 with 0.9 gave 0.059)."""
    with pytest.raises(ValueError, match=r"noise_rate=0.1 cannot be reached with skill_rate=1.0"
                                         r".*the largest rate is 0.0000"):
        DefaultCorpus(0, noise_rate=0.1, skill_rate=1.0)
    with pytest.raises(ValueError, match=r"the largest rate is 0.0567; ask for at most that"):
        DefaultCorpus(0, noise_rate=0.3, skill_rate=0.9)
    _, cats = DefaultCorpus(0, noise_rate=0.0567, skill_rate=0.9).rows(256, 257)
    assert 0.85 * 0.0567 < (cats == Category.NOISE).mean() < 1.15 * 0.0567  # reached
    _, cats = DefaultCorpus(0, noise_rate=0.0, skill_rate=1.0).rows(4, 65)
    assert not (cats == Category.NOISE).any()


def test_content_words_follow_a_zipf_law(corpus, tok):
    tokens, _ = corpus.rows(64, 513, index=2)
    counts = np.bincount(tokens.ravel(), minlength=tok.vocab_size)[tok.classes["noun"]]
    ranks = np.arange(1, 201)
    slope = np.polyfit(np.log(ranks + 2.7), np.log(counts[:200] + 1), 1)[0]
    assert -1.3 < slope < -0.7


def _find(words, pattern, end):
    """Start of the last occurrence of ``pattern`` (None matches anything) before ``end``."""
    for k in range(end - len(pattern), -1, -1):
        if all(p is None or words[k + i] == p for i, p in enumerate(pattern)):
            return k
    return None


def test_facts_are_queried_later_in_the_same_row(corpus, tok):
    length = 257
    tokens, _ = corpus.rows(16, length, index=4)
    for row in tokens:
        words = tok.decode(row).split()
        q = _find(words, ["What", "is", "the", None, "of", None, "?"], len(words))
        if q is not None:  # The color of Tom is wug . ... What is the color of Tom ? wug .
            fact = ["The", words[q + 3], "of", words[q + 5], "is", words[q + 7], "."]
        else:  # Tom lives in room 42 . ... Which room does Tom live in ? 42 .
            q = _find(words, ["Which", "room", "does", None, "live", "in", "?"], len(words))
            fact = [words[q + 3], "lives", "in", "room", words[q + 7], "."]
        k = _find(words, fact, q)
        assert k is not None and q - k >= length // 4 - 10


def test_the_placed_query_follows_its_fact_as_documented(corpus, tok):
    """DefaultCorpus's docstring: the query of the fact in segment 1 starts at least
    ``length // 4 - 24`` tokens after the fact ends, never before; every row of 55 tokens or
    more holds the pair, and many rows of 33 do not."""
    from gaugebook.data.stream import stream_rng

    for length in (33, 55, 129, 257):
        tokens, _, starts = corpus._rows(stream_rng("train", 0, 0, 9), 64, length,
                                         corpus._train_weights, far=True)
        gaps = []
        for row, start in zip(tokens, starts):
            words, segments = [tok.words[i] for i in row], np.flatnonzero(start)
            queries = [s for s in segments if words[s:s + 3] == ["Which", "room", "does"]
                       or words[s:s + 3] == ["What", "is", "the"] and words[s + 4] == "of"]
            if queries:
                fact = segments[1]
                gaps.append(queries[0] - fact - (7 if words[fact] == "The" else 6))
        assert min(gaps) >= max(0, length // 4 - 24), length
        assert len(gaps) == 64 if length >= 55 else len(gaps) < 48


# ---------------------------------------------------------------- solving the tasks from text

def solve(words):
    """The answer a perfect reader gives after the prompt ``words`` (any of the 14 tasks)."""
    if words[-1] == "?":
        if words[-7:-4] == ["What", "is", "the"]:
            k = _find(words, ["The", words[-4], "of", words[-2], "is", None], len(words) - 7)
            return words[k + 5]
        if words[-7:-5] == ["Which", "room"]:
            return words[_find(words, [words[-4], "lives", "in", "room", None], len(words) - 7) + 4]
        if words[-3] == "than":  # Is X taller than Y ?
            x, y, comp = words[-5], words[-2], words[-4]
            premises = words[-18:-6]
            bigger = {(premises[k], premises[k + 4]) for k in (0, 6)}
            bigger |= {(a, d) for a, b in bigger for c, d in bigger if b == c}
            assert premises[2] == comp
            return "yes" if (x, y) in bigger else "no"
        return "yes" if words[-14] == "Every" else "no"  # Every/No N is A . X is a N . Is X A ?
    if words[-1] in ("has", "is"):  # near retrieval: the same subject earlier in the episode
        return words[_find(words, [words[-2], words[-1], None], len(words) - 2) + 2]
    opener = max(k for w in ("Numbers", "Letters", "Repeat")
                 if (k := _find(words, [w, ":"], len(words))) is not None)
    if words[opener] == "Repeat":
        stop = words.index(".", opener)
        return words[opener + 2 + len(words) - stop - 1]
    letters = words[opener] == "Letters"
    seq = [ord(w) if letters else int(w) for w in words[opener + 2:]]
    steps = set(np.diff(seq).tolist())
    period = next((p for p in (2, 3) if all(seq[j] == seq[j - p] for j in range(p, len(seq)))),
                  None)
    value = seq[-1] + steps.pop() if len(steps) == 1 else seq[-period]
    return chr(value) if letters else str(value)


class Oracle(nn.Module):
    """Reads each prompt and puts all its probability on the solved answer."""

    def __init__(self, tok):
        super().__init__()
        self.tok = tok

    def forward(self, idx):
        logits = torch.full((len(idx), idx.shape[1], self.tok.vocab_size), -30.0)
        for i, row in enumerate(idx):
            logits[i, -1, self.tok.index[solve(self.tok.decode(row.numpy()).split())]] = 30.0
        return logits, None


class Constant(nn.Module):
    def __init__(self, vocab_size, generator=None):
        super().__init__()
        self.vocab_size, self.generator = vocab_size, generator

    def forward(self, idx):
        shape = (len(idx), 1, self.vocab_size)
        if self.generator is None:
            return torch.zeros(shape), None
        return torch.randn(shape, generator=self.generator), None


def test_every_skill_episode_is_solvable(corpus, tok):
    """Each answer inside each kind of skill episode is what a perfect reader gives."""
    rng = np.random.default_rng(0)
    checked = set()
    for kind in corpus.kinds:
        if kind.task is None or kind.fill is None:
            continue
        for episode in kind.fill(rng, 20):
            words = tok.decode(episode).split()
            if kind.task.startswith(("numeric", "letters")):
                positions = range(6, len(words) - 1)
            elif kind.task.startswith("copy"):
                positions = range(words.index(".") + 1, len(words) - 1)
            else:
                positions = [len(words) - 2]
            for j in positions:
                assert solve(words[:j]) == words[j], " ".join(words)
        checked.add(kind.task)
    for fill in (corpus._far_attribute, corpus._far_room):
        facts, queries = fill(rng, 20)
        for fact, query in zip(facts, queries):
            words = tok.decode(np.concatenate([fact, query])).split()
            assert solve(words[:-2]) == words[-2]
    assert checked == set(TASKS) - {"far_attribute", "far_room"}


def test_stream_patterns_and_copies(corpus, tok):
    tokens, _ = corpus.rows(16, 513, index=9)
    n_patterns = n_copies = 0
    for row in tokens:
        words = tok.decode(row).split()
        for k in range(len(words) - 2):
            stops = [i for i in range(k, len(words)) if words[i] == "."][:2]
            if words[k:k + 2] in (["Numbers", ":"], ["Letters", ":"]) and stops:
                assert solve(words[:stops[0] - 1]) == words[stops[0] - 1]
                n_patterns += 1
            if words[k:k + 2] == ["Repeat", ":"] and len(stops) == 2:
                assert words[k + 2:stops[0]] == words[stops[0] + 1:stops[1]]
                n_copies += 1
    assert n_patterns > 10 and n_copies > 5


def test_probes_are_solvable_and_fresh(corpus, tok):
    context = 96
    scores = evaluate_probes(Oracle(tok), tok, n_per_task=24, context=context, seed=1)
    assert set(scores) == set(TASKS) | {"mean"}
    for task in TASKS:
        assert scores[task]["top1"] == scores[task]["top5"] == 1.0, task
        assert scores[task]["loss"] < 1e-6
        assert scores[task]["correct"] == "1" * 24  # each instance's top-1 hit, in order
    for task in TASKS:
        a, b = (corpus.probes(task, 8, context=context, seed=1) for _ in range(2))
        assert torch.equal(a.prompts, b.prompts) and torch.equal(a.answers, b.answers)
        assert not torch.equal(a.prompts, corpus.probes(task, 8, context=context, seed=2).prompts)
    far = corpus.probes("far_room", 16, context=context, seed=0)
    for prompt in far.prompts:
        words = tok.decode(prompt).split()
        fact = _find(words, [words[-4], "lives", "in", "room"], len(words) - 7)
        assert len(words) - fact >= context // 2


def test_probe_scores_at_chance(tok):
    vocab = tok.vocab_size
    uniform = Constant(vocab)
    uniform.train()
    scores = evaluate_probes(uniform, tok, n_per_task=16, context=64)
    assert uniform.training  # mode restored
    for task in TASKS:
        assert abs(scores[task]["loss"] - math.log(vocab)) < 1e-4
        assert scores[task]["top1"] == 0.0 and scores[task]["correct"] == "0" * 16
    noisy = evaluate_probes(Constant(vocab, torch.Generator().manual_seed(0)), tok, n_per_task=16,
                            context=64)
    assert noisy["mean"]["top5"] < 0.02
    with pytest.raises(ValueError, match="context"):
        evaluate_probes(uniform, tok, n_per_task=4)
    with pytest.raises(ValueError, match="context >= 32"):
        evaluate_probes(uniform, tok, n_per_task=4, context=16)
    with pytest.raises(ValueError, match="WordTokenizer"):
        evaluate_probes(uniform, CharTokenizer("abc"), n_per_task=4, context=64)
    with pytest.raises(ValueError, match="unknown task"):
        DefaultCorpus().probes("arithmetic", 4, context=64)


# ---------------------------------------------------------------- real text

class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def serve():
    servers = []

    def start(directory):
        server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(directory)))
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_tiny_shakespeare_download_and_cache(serve, tmp_path):
    if not SHAKESPEARE.is_file():
        pytest.skip(f"the test copy of tiny Shakespeare is not at {SHAKESPEARE.resolve()}")
    url = serve(SHAKESPEARE.parent) + "/" + SHAKESPEARE.name
    text = load_tiny_shakespeare(cache_dir=tmp_path, url=url)
    assert len(text.encode()) == 1_115_394 and text.startswith("First Citizen")
    cached = tmp_path / "tinyshakespeare.txt"
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == TINY_SHAKESPEARE_SHA256
    assert load_tiny_shakespeare(cache_dir=tmp_path, url="http://127.0.0.1:9/") == text  # cache hit
    chars = CharTokenizer(text)
    assert chars.vocab_size == 65 and chars.decode(chars.encode(text[:500])) == text[:500]
    ids = chars.encode(text[:5000])
    a = [next(text_batches(ids, 4, 16, seed=1, start=k)) for k in range(3)]
    stream = text_batches(ids, 4, 16, seed=1)
    for batch in a:
        x, y, categories = next(stream)
        assert torch.equal(x, batch.inputs) and torch.equal(x[:, 1:], y[:, :-1])
        assert categories is None


def test_tiny_shakespeare_checksum_mismatch(serve, tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    (served / "input.txt").write_text("To be, or not to be\n")
    with pytest.raises(ValueError, match="sha256"):
        load_tiny_shakespeare(cache_dir=tmp_path / "cache", url=serve(served) + "/input.txt")
    assert not (tmp_path / "cache" / "tinyshakespeare.txt").exists()


def test_tiny_shakespeare_offline(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/input.txt"
    with pytest.raises(ConnectionError) as error:
        load_tiny_shakespeare(cache_dir=tmp_path, url=url)
    message = str(error.value)
    assert url in message and str(tmp_path / "tinyshakespeare.txt") in message
    assert TINY_SHAKESPEARE_SHA256 in message


def test_text_batches_reach_the_last_token():
    ids = np.arange(20)
    stream = text_batches(ids, 8, 4, seed=0)
    assert max(int(next(stream).targets.max()) for _ in range(10)) == 19
    only = next(text_batches(np.arange(5), 2, 4, seed=0))  # one window: the whole sequence
    assert only.inputs.tolist() == [[0, 1, 2, 3]] * 2
    with pytest.raises(ValueError, match="at least block_size \\+ 1 = 5 tokens"):
        text_batches(np.arange(4), 2, 4, seed=0).__next__()


def test_char_tokenizer_refuses_ids_outside_its_vocabulary():
    chars = CharTokenizer("abc")
    assert chars.decode([0, 2]) == "ac"
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 3\), got -1\.\.-1"):
        chars.decode([-1])
