"""Corpus generation speed: tokens/s at which :class:`gaugebook.data.DefaultCorpus` makes rows.

A wall-clock rate depends on the machine and on what else runs on it, so it is measured here and
not asserted in the unit tests (``tests/test_data.py`` checks what the rows contain). The target
is a rate above what a training loop reads (about 1e6 tokens/s for the book's GPU preset; see
``bench_training.py``, which measures both in one run). Usage::

    python benchmarks/bench_data.py                       # print the rate
    python benchmarks/bench_data.py --out benchmarks/results/data_cpu.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from gaugebook.data import DefaultCorpus

TARGET = 1e6  # tokens/s: above the rate the GPU preset's training loop consumes


def generation_rate(rows: int, length: int, blocks: int, repeats: int, seed: int = 0) -> list[float]:
    """Tokens/s of ``repeats`` timings, each generating ``blocks`` blocks of ``rows x length``
    tokens after one warm-up block."""
    corpus = DefaultCorpus(seed=seed)
    corpus.rows(rows, length)  # warm-up: vocabulary tables and caches
    rates = []
    for r in range(repeats):
        start = time.perf_counter()
        for index in range(blocks):
            corpus.rows(rows, length, index=r * blocks + index)
        rates.append(blocks * rows * length / (time.perf_counter() - start))
    return rates


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--length", type=int, default=513, help="block_size + 1 of a batch")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    rates = generation_rate(args.rows, args.length, args.blocks, args.repeats)
    result = dict(rows=args.rows, length=args.length, blocks=args.blocks, rates=rates,
                  median_tokens_per_s=statistics.median(rates), target_tokens_per_s=TARGET,
                  met=statistics.median(rates) > TARGET)
    print(f"corpus generation: median {result['median_tokens_per_s'] / 1e6:.2f} M tokens/s "
          f"over {args.repeats} timings (target > {TARGET / 1e6:.0f} M): "
          f"{'met' if result['met'] else 'not met'}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
