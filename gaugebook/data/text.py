"""Real text, optional: tiny Shakespeare (downloaded on demand, checksum, cache, clear offline
error), a character tokenizer and batches of random windows."""
from __future__ import annotations

import hashlib
import itertools
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from gaugebook.data.stream import Batch, check_stream_args, stream_rng, to_device
from gaugebook.data.vocabulary import Tokenizer

__all__ = ["TINY_SHAKESPEARE_URL", "TINY_SHAKESPEARE_SHA256", "TINY_SHAKESPEARE_BYTES",
           "load_tiny_shakespeare", "CharTokenizer", "text_batches"]


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


class CharTokenizer(Tokenizer):
    """Character-level tokenizer: one id per distinct character of ``text`` (sorted)."""

    def __init__(self, text: str):
        if not text:
            raise ValueError("CharTokenizer needs a non-empty text to build its vocabulary")
        self.chars = self.symbols = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}

    def split(self, text: str) -> list[str]:
        """One symbol per character."""
        return list(text)

    def unknown(self, symbols: list[str]) -> str:
        """The error message, naming up to 10 unknown characters."""
        return f"characters not in the vocabulary: {symbols[:10]}"


def text_batches(ids, batch_size: int, block_size: int, *, seed: int, device="cpu",
                 start: int = 0) -> Iterator[Batch]:
    """Endless batches of random windows of a token sequence ``ids``; batch ``k`` is a pure
    function of ``(seed, k)`` (``start=k`` resumes). ``categories`` is ``None``."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.ndim != 1 or len(ids) < block_size + 1:
        raise ValueError(f"ids must be a 1-D sequence of at least block_size + 1 = "
                         f"{block_size + 1} tokens, got shape {ids.shape}")
    check_stream_args(n=batch_size, length=block_size + 1, seed=seed, index=start, rank=0,
                       split="text")
    device = torch.device(device)
    window = np.arange(block_size + 1)
    for index in itertools.count(start):
        rng = stream_rng("text", seed, index)
        first = rng.integers(0, len(ids) - block_size, batch_size)  # windows may end at the end
        rows = ids[first[:, None] + window]
        yield Batch(to_device(rows[:, :-1], device), to_device(rows[:, 1:], device), None)
