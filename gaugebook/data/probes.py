"""Scoring a model on the 14 logic-puzzle tasks of the default corpus."""
from __future__ import annotations

import numpy as np
import torch

from gaugebook.data.generator import TASKS, DefaultCorpus
from gaugebook.data.vocabulary import WordTokenizer
from gaugebook.gpt import eval_mode

__all__ = ["evaluate_probes"]


@torch.no_grad()
def evaluate_probes(model: torch.nn.Module, tokenizer: WordTokenizer, *, n_per_task: int = 64,
                    device=None, context: int | None = None, seed: int = 0,
                    batch_size: int = 64) -> dict[str, dict[str, float]]:
    """Score ``model`` on fresh instances of the 14 logic-puzzle tasks.

    The model is called as ``logits, _ = model(idx)`` with ``idx [b, context]``; the logits at the
    last position predict the first answer token. Returns, for each task and for their ``"mean"``,
    ``{"loss": cross-entropy of the answer token, "top1": accuracy, "top5": accuracy}``; each
    task also gives ``"correct"``, its instances' top-1 hits in order as a string of 0s and 1s
    (for a paired test of two models on the same instances,
    :func:`gaugebook.results.probe_mcnemar`). ``context`` defaults to
    ``model.config.block_size``, ``device`` (where the prompts go) to that of the model's first
    parameter.
    """
    if not isinstance(tokenizer, WordTokenizer):
        raise ValueError(f"the probes are written in the default corpus' words: pass a "
                         f"WordTokenizer, got {type(tokenizer).__name__}")
    if context is None:
        context = getattr(getattr(model, "config", None), "block_size", None)
        if context is None:
            raise ValueError("pass context=... (the model has no config.block_size)")
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if vocab is not None and vocab < tokenizer.vocab_size:  # before a forward pass fails on it
        raise ValueError(f"the model's vocabulary has {vocab} tokens, the probes' tokenizer "
                         f"{tokenizer.vocab_size}: score a model trained on the default corpus")
    if device is None:
        device = next(model.parameters(), torch.empty(0)).device
    corpus = DefaultCorpus(tokenizer=tokenizer)
    scores = {}
    with eval_mode(model):
        for task in TASKS:
            prompts, answers = corpus.probes(task, n_per_task, context=context, seed=seed)
            logits = torch.cat([model(chunk.to(device))[0][:, -1, :].float().cpu()
                                for chunk in prompts.split(batch_size)])
            if logits.shape[-1] < tokenizer.vocab_size:
                raise ValueError(f"the model has {logits.shape[-1]} logits, the tokenizer "
                                 f"{tokenizer.vocab_size} tokens")
            top5 = logits.topk(5, dim=-1).indices  # [n, 5]
            hits = top5[:, 0] == answers  # [n]
            scores[task] = {
                "loss": torch.nn.functional.cross_entropy(logits, answers).item(),
                "top1": hits.float().mean().item(),
                "top5": (top5 == answers[:, None]).any(dim=1).float().mean().item(),
                "correct": "".join("01"[h] for h in hits.tolist()),
            }
    scores["mean"] = {m: float(np.mean([scores[t][m] for t in TASKS]))
                      for m in ("loss", "top1", "top5")}
    return scores
