r"""Aligning two models modulo their symmetries, for linear interpolation and merging (chapter 9).

Two networks trained from different seeds compute similar functions with parameters that differ
by (approximately) a symmetry. Averaging them naively mixes unrelated coordinates; aligning one to
the other first, by a symmetry that preserves its function exactly, can lower the loss barrier on
the straight line between them (Entezari et al. 2022; Ainsworth et al. 2023, "weight matching").
For a :class:`~gaugebook.gpt.GPT` (multi-head attention; with RoPE only the permutations, which
commute with the rotations) the symmetries used are

* **residual features** :math:`\pi \in S_D`: permute the :math:`D` features of the residual
  stream in every tensor that reads or writes it (embeddings, LayerNorm gains and biases, the
  attention and MLP weights). LayerNorm's mean and variance and the tied unembedding
  :math:`\mathrm{logits} = h W_E^\top` are permutation invariant, so this is exact. (A general
  rotation is not: LayerNorm's per-feature gains and the tied embedding break it.)
* **heads** :math:`S_H` per layer, matched by :func:`match_heads` on the gauge-invariant
  circuits :math:`W_Q W_K^\top` and :math:`W_V W_O`;
* **QK and VO matrices** :math:`\GL(d_k) \times \GL(d_v)` per head, fitted by
  :func:`align_factors`, plus the key- and value-bias translations (:func:`align_qk_vo`);
* **MLP hidden units** :math:`S_{4D}` per layer (:func:`align_mlp`).

Permutations are found with ``scipy.optimize.linear_sum_assignment``. Conventions follow
:class:`~gaugebook.gauge.HeadPermutation`: a permutation ``perm`` makes unit ``i`` of the result
unit ``perm[i]`` of the input.

:func:`sample_align` is the method of the source (section 9.4): draw random group elements and keep
the one that lands closest.
"""
from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.linalg
import torch
from scipy.optimize import linear_sum_assignment
from torch import nn

from gaugebook.attention import MultiHeadAttention
from gaugebook.checks import check_positive_ints
from gaugebook.gauge import (GaugeElement, HeadPermutation, KeyBiasShift, QKTransform,
                             ValueBiasShift, VOTransform, gauge_layers, grouped_weights,
                             random_attention_factors)
from gaugebook.gpt import GPT
from gaugebook.gpt_gauge import HiddenPermutation, ResidualPermutation, residual_axes
from gaugebook.lie import float64_parameters
from gaugebook.linalg import DTYPE, ZERO_RTOL

__all__ = ["head_similarity", "match_heads", "align_factors", "align_qk_vo", "align_mlp",
           "permute_mlp", "match_residual", "permute_residual", "align_gpt", "interpolate",
           "parameter_distance", "loss_barrier", "sample_align", "SampledAlignment"]

ALIGN_METHODS = ("lstsq", "procrustes")


def _w(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(DTYPE)


def _check_pair(a: MultiHeadAttention, b: MultiHeadAttention, *,
                permutations_only: bool = False) -> None:
    for m in (a, b):
        if not isinstance(m, MultiHeadAttention):
            raise TypeError(f"expected a MultiHeadAttention, got {type(m).__name__}")
        gauge_layers(m, permutations_only=permutations_only)
    shape = ("d_model", "n_heads", "n_kv_heads", "d_head", "d_value", "has_bias")
    wrong = [f"{k}: {getattr(a, k)} vs {getattr(b, k)}" for k in shape
             if getattr(a, k) != getattr(b, k)]
    if wrong:
        raise ValueError("the two attention layers differ in " + ", ".join(wrong))


def _cosine(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``[n, ...] x [m, ...] -> [n, m]`` cosine similarities of flattened entries."""
    x, y = x.flatten(1), y.flatten(1)
    return (x / x.norm(dim=1, keepdim=True)) @ (y / y.norm(dim=1, keepdim=True)).T


def head_similarity(attn_a: MultiHeadAttention, attn_b: MultiHeadAttention) -> torch.Tensor:
    r""":math:`S_{ij} = \cos(W_Q^a W_K^{a\top}, W_Q^b W_K^{b\top}) + \cos(W_V^a W_O^a, W_V^b W_O^b)`
    for head :math:`i` of ``attn_a`` and head :math:`j` of ``attn_b``: both circuits (``[D, D]``
    each) are invariant under the head's :math:`\GL(d_k) \times \GL(d_v)`, so :math:`S` compares
    heads modulo that gauge (and, under RoPE, modulo its commutant). ``[H, H]``, entries in
    :math:`[-2, 2]`."""
    _check_pair(attn_a, attn_b, permutations_only=True)

    def circuits(m):
        G = m.group_size
        W_K, W_V = _w(m.W_K).repeat_interleave(G, 0), _w(m.W_V).repeat_interleave(G, 0)
        qk = _w(m.W_Q) @ W_K.transpose(-1, -2)  # (H, D, D)
        ov = W_V @ _w(m.W_O)  # (H, D, D)
        return qk, ov

    (qk_a, ov_a), (qk_b, ov_b) = circuits(attn_a), circuits(attn_b)
    return _cosine(qk_a, qk_b) + _cosine(ov_a, ov_b)


def _assignment(similarity: torch.Tensor) -> torch.Tensor:
    """The permutation ``perm`` maximising ``sum_i similarity[i, perm[i]]`` (solved by scipy on
    the CPU; returned on ``similarity``'s device)."""
    rows, cols = linear_sum_assignment(similarity.detach().cpu().numpy(), maximize=True)
    return torch.as_tensor(cols[np.argsort(rows)], dtype=torch.long, device=similarity.device)


def match_heads(attn_a: MultiHeadAttention, attn_b: MultiHeadAttention) -> torch.Tensor:
    """The head permutation of ``attn_b`` that best matches ``attn_a`` by :func:`head_similarity`:
    ``HeadPermutation(perm).act(attn_b)`` has at position ``i`` the head most like head ``i`` of
    ``attn_a`` (one-to-one). Key/value groups of size > 1 are not supported."""
    if attn_a.group_size != 1:
        raise ValueError("match_heads needs one key/value head per query head (no GQA/MQA)")
    return _assignment(head_similarity(attn_a, attn_b))


def _pair_residual(M, X_a, Y_a, X_b, Y_b):
    r""":math:`\|X_b M - X_a\|^2 + \|Y_b M^{-\top} - Y_a\|^2`."""
    return ((X_b @ M - X_a) ** 2).sum() + \
        ((Y_b @ torch.linalg.inv(M).transpose(-1, -2) - Y_a) ** 2).sum()


def align_factors(X_a: torch.Tensor, Y_a: torch.Tensor, X_b: torch.Tensor, Y_b: torch.Tensor,
                  *, method: str = "lstsq", max_iter: int = 50) -> torch.Tensor:
    r"""The :math:`M` that best maps the factor pair :math:`(X_b, Y_b)` onto :math:`(X_a, Y_a)`
    under the action :math:`(X, Y) \mapsto (X M, Y M^{-\top})`, which preserves :math:`X Y^\top`.

    ``X [m, k]``, ``Y [n, k]``; returns ``M [k, k]``. Uses: QK (:math:`X = W_Q`, :math:`Y = W_K`),
    VO (:math:`X = W_V`, :math:`Y = W_O^\top`), LoRA (:math:`X = B`, :math:`Y = A^\top`).

    * ``"procrustes"``: the orthogonal :math:`M` maximising
      :math:`\langle X_b M, X_a \rangle + \langle Y_b M, Y_a \rangle` (:math:`M^{-\top} = M`):
      :math:`U V^\top` from the SVD of :math:`X_b^\top X_a + Y_b^\top Y_a`. Never
      ill-conditioned, but blind to the non-orthogonal part of the gauge.
    * ``"lstsq"`` (default): the least-squares fit over all of :math:`\GL(k)`,
      :math:`\min_M \|X_b M - X_a\|^2 + \|Y_b M^{-\top} - Y_a\|^2`. Both terms grow when
      :math:`M` degenerates, so the minimum is well conditioned. Started from the better of the
      Procrustes solution and the *linearised* fit (multiply the second condition by
      :math:`M^\top`: the Sylvester equation
      :math:`(X_b^\top X_b) M + M (Y_a^\top Y_a) = X_b^\top X_a + Y_b^\top Y_a`, exact when
      :math:`(X_b, Y_b) = (X_a M_0^{-1}, Y_a M_0^\top)`, but ill-conditioned for unrelated factors
      because it does not penalise a large :math:`M^{-1}`), then refined by L-BFGS (at most
      ``max_iter`` iterations).
    """
    if method not in ALIGN_METHODS:
        raise ValueError(f"method must be one of {ALIGN_METHODS}, got {method!r}")
    X_a, Y_a, X_b, Y_b = (_w(t) for t in (X_a, Y_a, X_b, Y_b))
    if X_a.shape != X_b.shape or Y_a.shape != Y_b.shape or X_a.shape[1] != Y_a.shape[1]:
        raise ValueError(f"factor shapes do not match: X_a {tuple(X_a.shape)}, X_b "
                         f"{tuple(X_b.shape)}, Y_a {tuple(Y_a.shape)}, Y_b {tuple(Y_b.shape)}")
    cross = X_b.T @ X_a + Y_b.T @ Y_a  # (k, k)
    U, _, Vh = torch.linalg.svd(cross)
    procrustes = U @ Vh
    if method == "procrustes":
        return procrustes
    starts = [procrustes]
    linear = torch.as_tensor(scipy.linalg.solve_sylvester(  # scipy, on the CPU
        (X_b.T @ X_b).cpu().numpy(), (Y_a.T @ Y_a).cpu().numpy(), cross.cpu().numpy()),
        dtype=DTYPE, device=cross.device)
    if torch.isfinite(linear).all() and torch.linalg.cond(linear) < 1 / ZERO_RTOL:
        starts.append(linear)
    M = min(starts, key=lambda S: _pair_residual(S, X_a, Y_a, X_b, Y_b).item()).clone()
    scale = (X_a ** 2).sum() + (Y_a ** 2).sum()
    if _pair_residual(M, X_a, Y_a, X_b, Y_b) <= ZERO_RTOL ** 2 * scale:  # squared norms
        return M  # exact already
    M.requires_grad_(True)
    opt = torch.optim.LBFGS([M], max_iter=max_iter, tolerance_grad=1e-12, tolerance_change=1e-15,
                            history_size=20, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        value = _pair_residual(M, X_a, Y_a, X_b, Y_b) / scale
        value.backward()
        return value

    opt.step(closure)
    return M.detach()


def align_qk_vo(attn_a: MultiHeadAttention, attn_b: MultiHeadAttention, *,
                method: str = "lstsq", target: str = "") -> GaugeElement:
    r"""A gauge element that moves ``attn_b`` (heads already matched) towards ``attn_a``.

    Per key/value group: :math:`M` from :func:`align_factors` on :math:`X = [W_Q; b_Q]` (the
    group's query heads stacked) and :math:`Y = W_K`, :math:`N` on :math:`X = W_V` and
    :math:`Y = W_O^\top` (the group's output matrices stacked); with biases then the translations
    that make :math:`b_K` and :math:`b_V` equal to ``attn_a``'s (:math:`b_K` cancels in the
    softmax; a :math:`b_V` shift is absorbed by :math:`b_O`). :math:`b_K` and :math:`b_V` stay
    out of the fits because the translations reach any value.
    ``target`` is the submodule path the factors act on.
    """
    _check_pair(attn_a, attn_b)
    D = attn_a.d_model

    def sides(m):  # X = [W_Q; b_Q] and W_K; W_V and W_O^T, per key/value group (no b_K, b_V)
        W = grouped_weights(m)
        return W["Q"], W["K"][:, :D], W["V"][:, :D], W["O"].mT

    (Xq_a, K_a, Xv_a, Yv_a), (Xq_b, K_b, Xv_b, Yv_b) = sides(attn_a), sides(attn_b)
    M = torch.stack([align_factors(Xq_a[g], K_a[g], Xq_b[g], K_b[g], method=method)
                     for g in range(attn_a.n_kv_heads)])
    N = torch.stack([align_factors(Xv_a[g], Yv_a[g], Xv_b[g], Yv_b[g], method=method)
                     for g in range(attn_a.n_kv_heads)])
    factors = [QKTransform(M, target=target), VOTransform(N, target=target)]
    if attn_a.has_bias:  # b_K, b_V of attn_b after M and N, then translated onto attn_a's
        moved = GaugeElement([QKTransform(M), VOTransform(N)]).transform(
            float64_parameters(attn_b), attn_b)
        factors += [KeyBiasShift(_w(attn_a.b_K) - moved["b_K"], target=target),
                    ValueBiasShift(_w(attn_a.b_V) - moved["b_V"], target=target)]
    return GaugeElement(factors)


# ----------------------------------------------------------------------------------------------
# permutations of MLP hidden units and of residual features
# ----------------------------------------------------------------------------------------------

def _mlp_units(mlp: nn.Module) -> torch.Tensor:
    """One row per hidden unit: its input weights and bias, output weights, PReLU slope."""
    parts = [_w(mlp.c_fc.weight), _w(mlp.c_proj.weight).T]  # (4D, D) each
    if mlp.c_fc.bias is not None:
        parts.append(_w(mlp.c_fc.bias)[:, None])
    if isinstance(mlp.act, nn.PReLU):
        parts.append(_w(mlp.act.weight)[:, None])
    return torch.cat(parts, dim=1)


def align_mlp(mlp_a: nn.Module, mlp_b: nn.Module) -> torch.Tensor:
    r"""The hidden-unit permutation of ``mlp_b`` that best matches ``mlp_a`` (weight matching):
    ``perm`` :math:`= \pi` maximises :math:`\sum_i \langle u_i^a, u_{\pi(i)}^b \rangle` over the
    units' weight rows :math:`u` (input weights and bias, output weights, PReLU slope)."""
    U_a, U_b = _mlp_units(mlp_a), _mlp_units(mlp_b)
    if U_a.shape != U_b.shape:
        raise ValueError(f"the two MLPs differ in shape: {tuple(U_a.shape)} vs {tuple(U_b.shape)}")
    return _assignment(U_a @ U_b.T)


def permute_mlp(mlp: nn.Module, perm: torch.Tensor) -> None:
    """Permute the hidden units of ``mlp`` in place: unit ``i`` of the result is unit
    ``perm[i]`` of the input (:class:`~gaugebook.gpt_gauge.HiddenPermutation`); the function is
    unchanged because the activation acts unit by unit."""
    factor = HiddenPermutation(perm)
    factor.apply_(factor.resolve(mlp))


def _check_gpt_pair(model_a: GPT, model_b: GPT, *, permutations_only: bool = True) -> None:
    for m in (model_a, model_b):
        if not isinstance(m, GPT):
            raise TypeError(f"expected a GPT, got {type(m).__name__}")
        gauge_layers(m, permutations_only=permutations_only)
    if model_a.config != model_b.config:
        raise ValueError(f"the models' configs differ: {model_a.config} vs {model_b.config}")


def match_residual(model_a: GPT, model_b: GPT) -> torch.Tensor:
    r"""The permutation of ``model_b``'s residual features that best matches ``model_a``: it
    maximises :math:`\sum_W \langle W^a, \pi(W^b) \rangle` over every tensor :math:`W` with a
    residual axis (weight matching).
    Tensors whose other axes are also permuted by a symmetry (heads, QK/VO frames, MLP units)
    only make sense here once those are aligned: :func:`align_gpt` alternates."""
    _check_gpt_pair(model_a, model_b)
    C = torch.zeros(model_a.config.n_embd, model_a.config.n_embd, dtype=DTYPE,
                    device=model_a.wte.weight.device)
    params_a, params_b = dict(model_a.named_parameters()), dict(model_b.named_parameters())
    for name, axis in residual_axes(model_a).items():
        if name in params_a:
            wa, wb = (_w(w).movedim(axis, 0).reshape(w.shape[axis], -1)
                      for w in (params_a[name], params_b[name]))
            C += wa @ wb.T  # (D, D)
    return _assignment(C)


def permute_residual(model: GPT, perm: torch.Tensor) -> GPT:
    """A copy of ``model`` whose residual feature ``i`` is feature ``perm[i]`` of ``model``
    (the same function: LayerNorm statistics and the tied unembedding are permutation
    invariant)."""
    return GaugeElement([ResidualPermutation(perm)]).act(model)


# ----------------------------------------------------------------------------------------------
# the whole model
# ----------------------------------------------------------------------------------------------

def align_gpt(model_a: GPT, model_b: GPT, *, method: str = "lstsq", residual: bool = True,
              heads: bool = True, frames: bool = True, mlp: bool = True,
              rounds: int = 2) -> GPT:
    """A copy of ``model_b`` moved towards ``model_a`` by exact symmetries (same function).

    Alternates ``rounds`` times: (1) permute residual features by :func:`match_residual`;
    (2) per layer, permute heads by :func:`match_heads`, fit the QK and VO frames and bias
    translations by :func:`align_qk_vo` (``method``), permute MLP units by :func:`align_mlp`.
    Each step can be switched off (``residual``, ``heads``, ``frames``, ``mlp``) to measure what
    it contributes. The first residual matching sees only the tensors no other symmetry touches
    (embeddings, LayerNorm, output biases) in a meaningful frame; later rounds see everything
    aligned. Head matching needs one key/value head per query head: under GQA or MQA pass
    ``heads=False``. With RoPE the QK frames are not a symmetry of the full group: pass
    ``frames=False`` to align by the permutations alone, which commute with the rotations.
    """
    _check_gpt_pair(model_a, model_b, permutations_only=not frames)
    check_positive_ints(rounds=rounds)
    if heads and model_a.config.kv_heads != model_a.config.n_head:
        raise ValueError(f"head matching needs one key/value head per query head, but the models "
                         f"have {model_a.config.kv_heads} for {model_a.config.n_head}: pass "
                         "heads=False to align them without it")
    b = copy.deepcopy(model_b)
    for _ in range(rounds):
        if residual:
            b = permute_residual(b, match_residual(model_a, b))
        for i, block_a in enumerate(model_a.blocks):
            path = f"blocks.{i}.attn"
            if heads:
                perm = match_heads(block_a.attn, b.blocks[i].attn)
                b = GaugeElement([HeadPermutation(perm, target=path)]).act(b)
            if frames:
                b = align_qk_vo(block_a.attn, b.blocks[i].attn, method=method,
                                target=path).act(b)
            if mlp:
                permute_mlp(b.blocks[i].mlp, align_mlp(block_a.mlp, b.blocks[i].mlp))
    return b


def _parameter_pairs(model_a: nn.Module, model_b: nn.Module):
    pa, pb = list(model_a.named_parameters()), list(model_b.named_parameters())
    if [(n, p.shape) for n, p in pa] != [(n, p.shape) for n, p in pb]:
        raise ValueError("the models have different parameters (names or shapes)")
    return [(a, b) for (_, a), (_, b) in zip(pa, pb)]


def parameter_distance(model_a: nn.Module, model_b: nn.Module) -> float:
    r""":math:`\|\theta_a - \theta_b\|` (Euclidean, over all parameters, frozen ones included;
    float64)."""
    return sum(((_w(a) - _w(b)) ** 2).sum() for a, b in _parameter_pairs(model_a, model_b)) \
        .sqrt().item()


def interpolate(model_a: nn.Module, model_b: nn.Module, t: float) -> nn.Module:
    r"""A copy of ``model_a`` with parameters :math:`(1 - t) \theta_a + t \theta_b` (all, frozen
    ones included; tied weights stay tied; buffers come from ``model_a``): ``t = 0`` gives
    ``model_a``'s parameters and ``t = 1`` ``model_b``'s, both exactly; other ``t`` in
    :math:`[0, 1]` lie on the segment between them, outside it on its extension."""
    out = copy.deepcopy(model_a)
    pairs = _parameter_pairs(model_a, model_b)
    with torch.no_grad():
        for p, (a, b) in zip(out.parameters(), pairs):
            p.copy_((1 - t) * a + t * b)
    return out


def loss_barrier(ts: Sequence[float], losses: Sequence[float]) -> float:
    r""":math:`\max_t [L(t) - ((1 - t) L(0) + t L(1))]` on a path sampled at ``ts`` (0 to 1):
    the largest rise above the straight line between the end losses (the barrier of Entezari et
    al. 2022; Frankle et al. 2020 subtract the mean of the end losses instead)."""
    ts, losses = torch.as_tensor(ts, dtype=DTYPE), torch.as_tensor(losses, dtype=DTYPE)
    if ts.ndim != 1 or ts.shape != losses.shape or ts[0] != 0 or ts[-1] != 1:
        raise ValueError("ts and losses must be matching 1-D sequences with ts from 0 to 1")
    return (losses - ((1 - ts) * losses[0] + ts * losses[-1])).max().item()


# ----------------------------------------------------------------------------------------------
# the source's method: random sampling
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SampledAlignment:
    """Result of :func:`sample_align`."""

    model: nn.Module  #: the closest transformed copy of model_b
    distance: float  #: ``|theta_a - best(theta_b)|``
    initial_distance: float  #: ``|theta_a - theta_b|``
    n_samples: int
    seconds: float
    distances: list[float]  #: ``|theta_a - tau(theta_b)|`` of every sample, in order


def sample_align(model_a: nn.Module, model_b: nn.Module, n_samples: int = 1000, *,
                 cond: float = 1.0, generator: torch.Generator | None = None) -> SampledAlignment:
    r"""The source's ``align_models``: draw ``n_samples`` random elements :math:`\tau` of the
    attention gauge group :math:`\prod_\text{layers} (\GL(d_k)^H \times \GL(d_v)^H) \rtimes S_H`
    and keep the :math:`\tau` minimising :math:`\|\theta_a - \tau(\theta_b)\|`.

    The source does not say how to sample a non-compact group; here each layer's element is
    :func:`~gaugebook.gauge.random_attention_factors`: every QK and VO matrix
    :func:`~gaugebook.linalg.random_gl` with condition number ``cond`` (``cond=1``: Haar
    orthogonal, the uniform distribution on the maximal compact subgroup), the head permutation
    uniform. Under GQA or MQA the matrices are one per key/value head and the permutation is
    uniform over the wreath product (groups, and heads within a group). As in the source, the
    identity is not a candidate. Only the attention layers' per-head tensors change, so each
    distance is computed from them and the fixed rest (the same number as acting on the whole
    model; the returned model is the library's action).
    ``model_b`` must pass :func:`~gaugebook.gauge.gauge_layers` (no RoPE, no symmetry-breaking
    biases).
    """
    check_positive_ints(n_samples=n_samples)
    layers = gauge_layers(model_b)
    start = time.perf_counter()
    initial = parameter_distance(model_a, model_b)
    per_head = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V")
    targets = [{k: _w(getattr(model_a.get_submodule(n), k)) for k in per_head
                if getattr(m, k) is not None} for n, m in layers]
    sources = [{k: _w(getattr(m, k)) for k in t} for t, (_, m) in zip(targets, layers)]
    rest_sq = initial ** 2 - sum(((sources[i][k] - t[k]) ** 2).sum().item()
                                 for i, t in enumerate(targets) for k in t)

    def factors(M, N, perm, target=""):  # one layer's element: QK, VO, then the heads
        return (QKTransform(M, target=target), VOTransform(N, target=target),
                HeadPermutation(perm, target=target))

    device = next(model_b.parameters()).device

    def draw(m):  # one random (M, N, perm) for layer m, drawn on the CPU from generator
        factors = random_attention_factors(m, cond=cond, generator=generator)
        return tuple(x.to(device) for x in factors)

    best, best_draws, distances = None, None, []
    for _ in range(n_samples):
        draws = [draw(m) for _, m in layers]
        d_sq = rest_sq + sum(((x - t[k]) ** 2).sum().item()
                             for t, w, (_, m), draw in zip(targets, sources, layers, draws)
                             for k, x in GaugeElement(factors(*draw)).transform(w, m).items()
                             if k in t)
        distances.append(max(d_sq, 0.0) ** 0.5)
        if best is None or d_sq < best:
            best, best_draws = d_sq, draws
    element = GaugeElement(f for (n, _), draw in zip(layers, best_draws)
                           for f in factors(*draw, target=n))
    aligned = element.act(model_b)
    return SampledAlignment(aligned, parameter_distance(model_a, aligned), initial, n_samples,
                            time.perf_counter() - start, distances)
