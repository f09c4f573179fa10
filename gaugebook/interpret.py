r"""What a query bias does to attention, and which tokens a trained model lets it amplify
(chapter 18).

**The factor.** A query that carries a token-independent part ``c`` scores key ``k_s`` as
``(q~_t + c) . k_s / sqrt(d_k)``. Inside the softmax over ``s`` the term ``c . k_s`` does not depend
on the query position ``t``, so

.. math::  A_{ts} = \frac{e^{\tilde q_t \cdot k_s/\sqrt{d_k}}\; e^{c\cdot k_s/\sqrt{d_k}}}
           {\sum_{s'} e^{\tilde q_t \cdot k_{s'}/\sqrt{d_k}}\; e^{c\cdot k_{s'}/\sqrt{d_k}}} :

every key is re-weighted by the same factor ``exp(c . k_s / sqrt(d_k))`` in every query row
(:func:`reweight`). Adding a constant to all log-factors changes nothing, so only differences
between keys matter; :func:`log_factors` centres them.

**Which c.** In a pre-LN GPT-2 block the query of a token is ``(gamma * xhat) W_Q + c`` with
the token-independent offset (:func:`query_offset`)

.. math::  c = \beta W_Q + b_Q + \mathbb E[b_Q^{\text{unlearned}}],

``beta`` the LayerNorm bias, ``b_Q`` the learned query bias and ``E[b_Q] = 0.5 * 1`` the mean of
the symmetry-breaking bias (used at inference). The paper's factor ``e^{k . E[b_Q]}`` is the
last piece alone (``reference="mean"``); the attention weights see the whole of ``c``
(``reference="effective"``). Symmetric models have no ``E[b_Q]``: a fixed vector (the book
uses ``0.5 * 1``) serves as the null reference there.

**Static keys.** The paper also measures alignment without running the model: the *static key*
of vocabulary token ``v`` in head ``h`` is its embedding row times the head's key weights,
``e_v W_K^{(h)}`` (no LayerNorm, position or bias), and its cosine with ``E[b_Q]`` is the
token's alignment (:func:`static_key_cosines`). :func:`alignment_scores` condenses both
measures into one structure score each, which the trainer records for every run.

**Gauge.** Under ``W_Q -> W_Q M``, ``W_K -> W_K M^{-T}`` (with ``c -> c M``) the product ``c . k``
is invariant but the cosine between ``k`` and a *fixed* vector is not: :func:`key_alignment`
measures a gauge-dependent quantity unless something (the resampled unlearned bias) fixes the
gauge, while :func:`log_factors` with ``reference="effective"`` is invariant once centred
(``center=True``, the default: a key-bias shift adds the same ``c . b_K`` to every key).

Shapes: ``L`` layers, ``H`` query heads, ``B`` sequences of ``T`` tokens; keys of grouped
key/value heads are repeated to their query heads.
"""
from __future__ import annotations

import math

import torch

from gaugebook.data import Category
from gaugebook.gpt import GPT, activations

__all__ = ["STRUCTURAL", "SUPPRESSED", "attention_inputs", "layer_keys", "query_offset",
           "reference_vectors", "key_log_factor", "reweight", "key_alignment", "log_factors",
           "by_category", "structure_score", "static_key_cosines", "alignment_scores",
           "centred_on_vocabulary"]

STRUCTURAL = (Category.SENTENCE_START, Category.PUNCTUATION, Category.QUESTION_WORD)
SUPPRESSED = (Category.NOISE,)
REFERENCES = ("mean", "effective")


def _check_model(model) -> None:
    if not isinstance(model, GPT):
        raise TypeError(f"expected a gaugebook.gpt.GPT, got {type(model).__name__}")
    if model.config.rope:
        raise ValueError("with RoPE the key of a token depends on its position through the "
                         "rotation; the analyses here assume a GPT without RoPE")


@torch.no_grad()
def attention_inputs(model: GPT, idx: torch.Tensor) -> list[torch.Tensor]:
    """The input ``ln_1(x) [B, T, D]`` of every block's attention when ``model`` reads ``idx``
    in eval mode (mean biases); the model's train/eval mode is restored afterwards."""
    _check_model(model)
    return activations(model, idx, [block.attn for block in model.blocks])


@torch.no_grad()
def layer_keys(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    """Keys ``k = ln_1(x) W_K + b_K`` of every layer and query head, ``[L, H, B, T, dk]``."""
    out = []
    for block, x in zip(model.blocks, attention_inputs(model, idx)):
        _, k, _ = block.attn.project(x)  # (B, Hkv, T, dk)
        out.append(k.repeat_interleave(block.attn.group_size, dim=1).transpose(0, 1))
    return torch.stack(out)  # (L, H, B, T, dk)


@torch.no_grad()
def query_offset(block, *, include_mean_shift: bool = True) -> torch.Tensor:
    """The token-independent part of every query of ``block``'s heads, ``[H, dk]``:
    ``beta W_Q + b_Q`` (LayerNorm bias and learned query bias, where present) plus, with
    ``include_mean_shift`` and a symmetry-breaking block, the unlearned bias' mean ``E[b_Q]``."""
    attn = block.attn
    c = torch.zeros(attn.n_heads, attn.d_head, dtype=attn.W_Q.dtype, device=attn.W_Q.device)
    if block.ln_1.bias is not None:
        c = c + torch.einsum("d,hde->he", block.ln_1.bias, attn.W_Q)  # (H, dk)
    if attn.has_bias:
        c = c + attn.b_Q
    if include_mean_shift and block.breaking is not None:
        c = c + block.breaking.q_mean.to(c.dtype)  # (dk,) broadcast over heads
    return c


def reference_vectors(model: GPT, reference) -> torch.Tensor:
    """One reference direction per layer and head, ``[L, H, dk]``.

    ``reference`` is ``"mean"`` (``E[b_Q]`` of each layer's unlearned bias; the model must break
    the symmetry), ``"effective"`` (:func:`query_offset`, everything in the query that does not
    depend on the token) or a tensor ``[dk]``, ``[H, dk]`` or ``[L, H, dk]`` (e.g. ``0.5 * 1`` as
    a null reference in a symmetric model)."""
    _check_model(model)
    L, H, dk = model.config.n_layer, model.config.n_head, model.config.head_size
    if isinstance(reference, str):
        if reference not in REFERENCES:
            raise ValueError(f"reference must be one of {REFERENCES} or a tensor, "
                             f"got {reference!r}")
        if reference == "mean":
            if model.config.symmetry_breaking is None:
                raise ValueError("a symmetric model has no E[b_Q]: pass a fixed reference "
                                 "vector (e.g. torch.full((d_head,), 0.5)) or 'effective'")
            rows = [block.breaking.q_mean.expand(H, dk) for block in model.blocks]
        else:
            rows = [query_offset(block) for block in model.blocks]
        return torch.stack(rows).detach()  # (L, H, dk)
    reference = torch.as_tensor(reference)
    if tuple(reference.shape) not in {(dk,), (H, dk), (L, H, dk)}:
        raise ValueError(f"a reference tensor must have shape [{dk}], [{H}, {dk}] or "
                         f"[{L}, {H}, {dk}], got {tuple(reference.shape)}")
    return reference.expand(L, H, dk)


def key_log_factor(keys: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    r""":math:`\log f = k \cdot c / \sqrt{d_k}` for keys ``[..., H, T, dk]`` and offsets
    ``[..., H, dk]`` (or ``[dk]``), broadcast against the keys: the log of the factor by which a
    query offset :math:`c` re-weights each key (``[..., H, T]``)."""
    if keys.shape[-1] != offset.shape[-1]:
        raise ValueError(f"keys have width {keys.shape[-1]}, the offset {offset.shape[-1]}")
    return (keys * offset[..., None, :]).sum(-1) / math.sqrt(keys.shape[-1])  # (..., H, T)


def reweight(pattern: torch.Tensor, log_factor: torch.Tensor) -> torch.Tensor:
    """Multiply every column ``s`` of the attention pattern ``A [..., T, T]`` by
    ``exp(log_factor[..., s])`` and renormalise the rows: the pattern of the same layer with
    the query offset that produced ``log_factor`` added. Masked entries (zeros) stay zero."""
    if log_factor.shape[-1] != pattern.shape[-1]:
        raise ValueError(f"log_factor has {log_factor.shape[-1]} keys, the pattern "
                         f"{pattern.shape[-1]}")
    f = log_factor - log_factor.amax(-1, keepdim=True)  # the constant cancels; avoids overflow
    weighted = pattern * f.exp()[..., None, :]  # (..., T, T)
    return weighted / weighted.sum(-1, keepdim=True)


def key_alignment(model: GPT, idx: torch.Tensor, reference="mean") -> torch.Tensor:
    """Cosine between each token's key and the layer's reference direction
    (:func:`reference_vectors`), ``[L, H, B, T]``. Gauge-dependent; see the module docstring."""
    keys = layer_keys(model, idx)  # (L, H, B, T, dk)
    ref = reference_vectors(model, reference).to(keys)  # (L, H, dk)
    return torch.nn.functional.cosine_similarity(keys, ref[:, :, None, None, :], dim=-1)


def log_factors(model: GPT, idx: torch.Tensor, reference="effective", *,
                center: bool = True) -> torch.Tensor:
    r""":math:`k \cdot r / \sqrt{d_k}` for every layer, head and token, ``[L, H, B, T]``
    (nats); with ``center`` the mean over all tokens of ``idx`` is subtracted per layer and
    head, so that a value :math:`a` means: this key gets :math:`e^a` times the weight of an
    average key."""
    keys = layer_keys(model, idx)  # (L, H, B, T, dk)
    ref = reference_vectors(model, reference).to(keys)  # (L, H, dk)
    f = key_log_factor(keys.flatten(2, 3), ref).unflatten(-1, keys.shape[2:4])  # (L, H, B, T)
    return f - f.mean(dim=(2, 3), keepdim=True) if center else f


def by_category(values: torch.Tensor, categories: torch.Tensor) -> dict[Category, torch.Tensor]:
    """Mean of ``values [..., B, T]`` over the tokens of each :class:`~gaugebook.data.Category`
    (``categories [B, T]``), as ``{category: [...]}``; categories absent from the batch are
    left out."""
    if values.shape[-2:] != categories.shape:
        raise ValueError(f"values end in {tuple(values.shape[-2:])}, categories have shape "
                         f"{tuple(categories.shape)}")
    flat, cats = values.flatten(-2), categories.flatten().long()
    out = {}
    for category in Category:
        mask = cats == int(category)
        if mask.any():
            out[category] = flat[..., mask].mean(-1)
    return out


def structure_score(table: dict[Category, torch.Tensor], structural=STRUCTURAL,
                    suppressed=SUPPRESSED) -> torch.Tensor:
    """Mean of ``table`` over the ``structural`` categories minus its mean over the
    ``suppressed`` ones: positive where structure is amplified relative to noise (the pattern the
    paper links to better puzzle accuracy)."""
    missing = [c.name for c in (*structural, *suppressed) if c not in table]
    if missing:
        raise ValueError(f"the batch has no tokens of {missing}: use a larger batch")
    plus = torch.stack([table[c] for c in structural]).mean(0)
    minus = torch.stack([table[c] for c in suppressed]).mean(0)
    return plus - minus


def _static_keys(model: GPT, rows: torch.Tensor | None = None) -> list[torch.Tensor]:
    r"""Each layer's static keys :math:`e_v W_K^{(i)}` of the ``rows [V, D]`` (token embeddings by
    default), ``[H, V, dk]``; keys of grouped key/value heads repeated to their query heads."""
    rows = (model.wte.weight if rows is None else rows).detach()
    out = []
    for block in model.blocks:
        attn = block.attn
        keys = torch.einsum("vd,hde->hve", rows.to(attn.W_K), attn.W_K)  # (Hkv, V, dk)
        out.append(keys.repeat_interleave(attn.group_size, dim=0))  # (H, V, dk)
    return out


def _cosines(keys: list[torch.Tensor], ref: torch.Tensor) -> torch.Tensor:
    """Cosine of each layer's keys ``[H, V, dk]`` with its reference ``ref[l] [H, dk]``:
    ``[L, H, V]``."""
    return torch.stack([torch.nn.functional.cosine_similarity(k, r.to(k)[:, None, :], dim=-1)
                        for k, r in zip(keys, ref)])


@torch.no_grad()
def static_key_cosines(model: GPT, reference="mean", *, rows: torch.Tensor | None = None
                       ) -> torch.Tensor:
    r"""Cosine of each static key :math:`e_v W_K^{(i)}` with the layer's reference direction
    (:func:`reference_vectors`: ``"mean"`` is ``E[b_Q]``, the paper's measure; a tensor
    ``[dk]`` is a fixed or random direction, e.g. for a null distribution), ``[L, H, V]``.
    ``rows [V, D]`` are the token embeddings by default; pass ``model.wpe.weight`` for
    positions. Keys of grouped key/value heads are repeated to their query heads."""
    ref = reference_vectors(model, reference)  # (L, H, dk)
    return _cosines(_static_keys(model, rows), ref)


def centred_on_vocabulary(category_means: dict[str, float],
                          token_categories: torch.Tensor) -> dict[str, float]:
    r"""Category means :math:`m_c` of a per-word score (``{"noise": m_c, ...}``, as
    :func:`alignment_scores` records ``"static_by_category"``) minus the score's mean over the
    whole vocabulary, :math:`m_c - \sum_{c'} n_{c'} m_{c'} / V` with :math:`n_c` the words of
    category :math:`c` among the ``token_categories [V]``. Only differences between keys
    re-weight attention, so this is what centring each head's cosines on their vocabulary mean
    gives; it needs every category of the vocabulary."""
    token_categories = torch.as_tensor(token_categories)
    counts = {c.name.lower(): int((token_categories == int(c)).sum()) for c in Category}
    unknown = sorted(set(category_means) - set(counts))
    if unknown:
        raise ValueError(f"unknown categories {unknown}; valid: {sorted(counts)}")
    missing = [name for name, n in counts.items() if n and name not in category_means]
    if missing:
        raise ValueError(f"no mean for the vocabulary's {missing} words: the vocabulary mean "
                         "needs every category the vocabulary has")
    mean = sum(counts[c] * m for c, m in category_means.items()) / sum(counts.values())
    return {c: m - mean for c, m in category_means.items()}


NULL_DIRECTIONS = 64
"""Random reference directions behind the static score's null band (:func:`alignment_scores`)."""


def _static_score(keys: list[torch.Tensor], ref: torch.Tensor,
                  token_categories: torch.Tensor) -> tuple[float, dict]:
    """The static-key structure score of ``keys`` (:func:`_static_keys`) against ``ref
    [L, H, dk]``, and the mean cosine per category."""
    cos = _cosines(keys, ref).mean((0, 1))  # (V,)
    words = by_category(cos[None, :], token_categories[None, :])
    return structure_score(words).item(), {c.name.lower(): v.item() for c, v in words.items()}


@torch.no_grad()
def alignment_scores(model: GPT, idx: torch.Tensor, categories: torch.Tensor,
                     token_categories: torch.Tensor) -> dict:
    """Alignment summaries of a trained model, each :func:`structure_score` (structural
    categories minus noise) averaged over layers and heads:

    * ``"in_context"``: of the centred log-factor of the whole query offset
      (``reference="effective"``, gauge-invariant) on the tokens ``idx [B, T]`` with their
      ``categories [B, T]`` (nats);
    * ``"static"``: of the static-key cosine with ``E[b_Q]`` (:func:`static_key_cosines`), mean
      over each category's vocabulary words (``token_categories [V]``); ``None`` for a model
      without a query-breaking bias (it has no ``E[b_Q]``). ``"static_by_category"``: that
      mean cosine per category (``{"function_word": ...}``), or ``None`` likewise;
    * ``"static_null"``: the same static score against ``NULL_DIRECTIONS`` random directions
      (one per layer, shared by its heads as ``E[b_Q]`` is; a fixed seed, so the same for every
      model of a shape), for any model: ``{"mean", "low", "high"}``, ``low, high`` the 2.5% and
      97.5% quantiles, the band a score with no relation to ``E[b_Q]`` falls in.
    """
    token_categories = torch.as_tensor(token_categories)
    table = by_category(log_factors(model, idx, "effective"), categories)
    L, H, dk = model.config.n_layer, model.config.n_head, model.config.head_size
    keys = _static_keys(model)  # computed once for every reference below
    generator = torch.Generator().manual_seed(0)
    null = torch.tensor([_static_score(keys, torch.randn(L, 1, dk, generator=generator,
                                                         dtype=torch.float64).expand(L, H, dk),
                                       token_categories)[0]
                         for _ in range(NULL_DIRECTIONS)])
    low, high = torch.quantile(null, torch.tensor([0.025, 0.975], dtype=null.dtype)).tolist()
    scores = {"in_context": structure_score(table).mean().item(), "static": None,
              "static_by_category": None,
              "static_null": {"mean": null.mean().item(), "low": low, "high": high}}
    if model.config.symmetry_breaking is not None:
        scores["static"], scores["static_by_category"] = _static_score(
            keys, reference_vectors(model, "mean"), token_categories)
    return scores
