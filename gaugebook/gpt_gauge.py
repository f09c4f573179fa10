r"""The symmetries of a GPT beyond its attention layers, as factors of :mod:`gaugebook.lie`.

Every read from the residual stream goes through a LayerNorm :math:`y = \gamma \odot n + \beta`
whose normalised :math:`n` has mean zero and fixed length; its *readers* are the weights that
multiply :math:`y`: :math:`W_Q, W_K, W_V` (and the gates of gated RoPE) after ``ln_1``, the MLP's
input layer after ``ln_2``. Per block (target: the ``Block`` of :mod:`gaugebook.gpt`):

* :class:`LayerNormScale` ``s [D]``: :math:`\gamma_i, \beta_i \to s_i \gamma_i, s_i \beta_i` and
  row :math:`i` of every reader over :math:`s_i`.
* :class:`LayerNormShift` ``delta [D]``: :math:`\beta \to \beta + \delta`, every reader's bias
  :math:`b \to b - \delta W` (a gate of gated RoPE, which has no bias, moves its columns along
  :math:`1/\gamma` instead).
* :class:`ReaderCentring` ``u``: column :math:`j` of every reader plus :math:`u_j / \gamma` (its
  bias minus :math:`(\beta \cdot 1/\gamma)\, u_j`): since :math:`n \cdot \mathbf{1} = 0`,
  :math:`y \cdot (1/\gamma) = \beta \cdot (1/\gamma)` is a constant.
* :class:`ResidualCentring` ``c``: what the block writes along :math:`\mathbf{1}` (rows of
  :math:`W_O`, columns of the MLP's output weight, the output biases) is removed by every later
  LayerNorm, so it is invisible inside a GPT (not for the block on its own).

Per MLP (target: ``MLP``): :class:`HiddenRescaling` (PReLU is positively
homogeneous) and :class:`HiddenPermutation`. Per model (target: the :class:`~gaugebook.gpt.GPT`):
:class:`ResidualPermutation` of the residual features, and on the token and position
embeddings :math:`W_E` (``wte``) and :math:`W_\text{pos}` (``wpe``) :class:`PositionCentring`
:math:`W_\text{pos}[t] \to W_\text{pos}[t] + c_t \mathbf{1}` and :class:`EmbeddingShift`
:math:`W_E \to W_E + \mathbf{1} w^\top`, :math:`W_\text{pos} \to W_\text{pos} - \mathbf{1} w^\top`
(the logits all move by :math:`w \cdot h`, which log-softmax removes).
:mod:`gaugebook.gpt_redundancy` counts and differentiates them.

One more factor of a GPT is a symmetry only when every LayerNorm has :math:`\epsilon = 0`
(:attr:`gaugebook.gpt.GPTConfig.layer_norm_eps`), a *near-symmetry* otherwise, and is not
counted: :class:`StreamScaling`, everything that writes to the residual stream times :math:`s`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from gaugebook.gpt import GPT, MLP, Block, PReLU
from gaugebook.lie import PermutationFactor, ScalingFactor, TranslationFactor, unit_basis
from gaugebook.linalg import DTYPE

__all__ = ["LayerNormScale", "LayerNormShift", "ReaderCentring", "ResidualCentring",
           "HiddenRescaling", "HiddenPermutation", "ResidualPermutation", "PositionCentring",
           "EmbeddingShift", "StreamScaling", "LAYERNORMS", "residual_axes"]

LAYERNORMS = ("ln_1", "ln_2")


def _readers(block: Block, which: str) -> list[tuple[str, str | None, bool]]:
    """``(weight, bias, per_head)`` of every parameter that multiplies ``which``'s output:
    per-head weights ``[n, D, c]`` (biases ``[n, c]``) of attention, or the MLP's
    ``c_fc.weight [4D, D]`` (bias ``[4D]``). Gates of gated RoPE read ``ln_1`` without a bias."""
    if which not in LAYERNORMS:
        raise ValueError(f"which must be one of {LAYERNORMS}, got {which!r}")
    if which == "ln_2":
        return [("mlp.c_fc.weight", "mlp.c_fc.bias", False)]
    out = [(f"attn.W_{s}", f"attn.b_{s}", True) for s in "QKV"]
    if block.attn.rope == "gated":
        out += [("attn.W_GQ", None, True), ("attn.W_GK", None, True)]
    return out


def _reader_columns(block: Block, readers) -> list[int]:
    """Output columns of each reader: ``n c`` for per-head weights, rows of ``c_fc``."""
    params = dict(block.named_parameters())
    return [params[w].shape[0] * params[w].shape[2] if per_head else params[w].shape[0]
            for w, _, per_head in readers]


def _centring_readers(block: Block, which: str):
    r"""The readers whose columns can move along :math:`1/\gamma`: all of them when the LayerNorm
    has no bias (:math:`y \cdot 1/\gamma = 0`); with a bias only those with a bias to absorb the
    constant."""
    readers = _readers(block, which)  # validates which
    has_beta = getattr(block, which).bias is not None
    return [r for r in readers if r[1] is not None or not has_beta]


@dataclass(frozen=True, eq=False)
class LayerNormScale(ScalingFactor):
    r""":math:`\gamma, \beta \to s \odot \gamma, s \odot \beta` (per feature) and row :math:`i` of
    every reader over :math:`s_i`; :math:`s` has no zero entry."""

    s: torch.Tensor  #: [D]
    which: str = "ln_1"
    acts_on: ClassVar = Block
    positive: ClassVar = False  # a negative gain with negated reader rows is a symmetry too

    @classmethod
    def shape(cls, block, which="ln_1"):
        """``[D]``, the shape of the gain of ``which``."""
        _readers(block, which)
        return getattr(block, which).weight.shape

    def transform(self, params, block):
        r""":math:`\gamma, \beta \to s \odot \gamma, s \odot \beta`; input feature :math:`i` of
        every reader over :math:`s_i`."""
        s = self.s.to(params[f"{self.which}.weight"].device)
        out = {f"{self.which}.weight": params[f"{self.which}.weight"] * s}
        if f"{self.which}.bias" in params:
            out[f"{self.which}.bias"] = params[f"{self.which}.bias"] * s
        for weight, _, per_head in _readers(block, self.which):
            out[weight] = params[weight] / (s[:, None] if per_head else s)
        return out


@dataclass(frozen=True, eq=False)
class LayerNormShift(TranslationFactor):
    r""":math:`\beta \to \beta' = \beta + \delta`, every reader's bias :math:`b \to b - \delta W`.

    A reader without a bias (a gate :math:`W_G` of gated RoPE) absorbs the constant
    :math:`\delta W_G` through its columns instead: :math:`W_G \to W_G + (1/\gamma)\, u^\top` with
    :math:`u = -\delta W_G / (\beta' \cdot 1/\gamma)`, since :math:`y \cdot (1/\gamma) =
    \beta' \cdot (1/\gamma)` for every token (:math:`n \cdot \mathbf{1} = 0`). Defined where
    :math:`\beta' \cdot 1/\gamma \neq 0`, which holds at generic weights."""

    delta: torch.Tensor  #: [D]
    which: str = "ln_1"
    acts_on: ClassVar = Block

    @classmethod
    def shape(cls, block, which="ln_1"):
        """``[D]``, the shape of the bias of ``which``."""
        _readers(block, which)
        return getattr(block, which).weight.shape

    def check(self, block):
        """The shape check, and ValueError when the LayerNorm ``which`` has no bias."""
        super().check(block)
        if getattr(block, self.which).bias is None:
            raise ValueError(f"LayerNormShift needs {self.which} with a bias (bias=True)")

    def transform(self, params, block):
        r""":math:`\beta \to \beta + \delta`, each reader's bias :math:`b \to b - \delta W`; a
        gate of gated RoPE (no bias) :math:`W_G \to W_G + (1/\gamma)\, u^\top` instead."""
        delta = self.delta.to(params[f"{self.which}.bias"].device)
        beta = params[f"{self.which}.bias"] + delta  # [..., D]
        inv_gamma = 1 / params[f"{self.which}.weight"]  # [..., D]
        out = {f"{self.which}.bias": beta}
        for weight, bias, per_head in _readers(block, self.which):
            W = params[weight]
            read = (torch.einsum("d,...ndc->...nc", delta, W) if per_head
                    else torch.einsum("...jd,d->...j", W, delta))
            if bias is not None:
                out[bias] = params[bias] - read
            else:  # a gate [..., n, D, c]: u [..., n, c]
                u = -read / (beta * inv_gamma).sum(-1)[..., None, None]
                out[weight] = W + inv_gamma[..., None, :, None] * u[..., :, None, :]
        return out

    @classmethod
    def lie_basis(cls, block, which="ln_1"):
        """Every coordinate of ``delta``, ``[D, D]``; none, ``[0, D]``, when the LayerNorm has no
        bias."""
        shape = cls.shape(block, which)  # validates which
        if getattr(block, which).bias is None:
            return torch.zeros(0, shape.numel(), dtype=DTYPE)
        return unit_basis(shape)


@dataclass(frozen=True, eq=False)
class ReaderCentring(TranslationFactor):
    r"""Column :math:`j` of the readers of ``which`` plus :math:`u_j / \gamma`, its bias minus
    :math:`(\beta \cdot 1/\gamma)\, u_j`; :math:`u` runs over the columns of every reader that
    can take it (all of them without a LayerNorm bias, else those with a bias), in order, each
    flattened row-major (``[n, c]`` for per-head weights)."""

    u: torch.Tensor  #: [columns]
    which: str = "ln_1"
    acts_on: ClassVar = Block

    @classmethod
    def shape(cls, block, which="ln_1"):
        """``[columns]``: one entry per output column of every reader that can take the
        centring."""
        return (sum(_reader_columns(block, _centring_readers(block, which))),)

    def transform(self, params, block):
        r"""Column :math:`j` of each reader plus :math:`u_j / \gamma` and, where the reader and
        the LayerNorm have biases, its bias minus :math:`(\beta \cdot 1/\gamma)\, u_j`."""
        gamma = params[f"{self.which}.weight"]
        beta = params.get(f"{self.which}.bias")
        if beta is not None:  # y . (1/gamma) = beta . (1/gamma), [..., 1]
            offset = (beta / gamma).sum(-1)[..., None]
        readers = _centring_readers(block, self.which)
        u_parts = self.u.to(gamma.device).split(_reader_columns(block, readers))
        out = {}
        for (weight, bias, per_head), u in zip(readers, u_parts):
            W = params[weight]
            if per_head:  # W [.., n, D, c], u [n, c]
                u = u.reshape(W.shape[-3], W.shape[-1])
                out[weight] = W + (1 / gamma)[..., None, :, None] * u[:, None, :]
            else:  # W [.., 4D, D], u [4D]
                out[weight] = W + u[:, None] * (1 / gamma)[..., None, :]
            if bias is not None and beta is not None:
                out[bias] = params[bias] - (offset[..., None] if per_head else offset) * u
        return out


def _writers(block: Block) -> list[tuple[str, str]]:
    """``(name, kind)`` of what a block writes into the residual stream: ``W_O [H, dv, D]``
    (rows), ``c_proj.weight [D, 4D]`` (columns), and the output biases ``[D]``."""
    out = [("attn.W_O", "rows"), ("mlp.c_proj.weight", "columns")]
    out += [(b, "bias") for b in ("attn.b_O", "mlp.c_proj.bias")
            if b in dict(block.named_parameters())]
    return out


def _writer_sizes(block: Block) -> list[int]:
    params = dict(block.named_parameters())
    sizes = {"rows": lambda w: w.shape[0] * w.shape[1], "columns": lambda w: w.shape[1],
             "bias": lambda w: 1}
    return [sizes[kind](params[name]) for name, kind in _writers(block)]


@dataclass(frozen=True, eq=False)
class ResidualCentring(TranslationFactor):
    r"""Everything the block writes moves along :math:`\mathbf{1}`: row :math:`e` of
    :math:`W_O^{(h)}` plus :math:`c\, \mathbf{1}`, column :math:`j` of the MLP's output weight plus
    :math:`c' \mathbf{1}`, each output bias plus a multiple of :math:`\mathbf{1}`; ``c`` in the
    order of the writers, each flattened row-major. Invisible inside a GPT, where every reader of
    the residual stream is a LayerNorm."""

    c: torch.Tensor  #: [H dv + 4D + 2b]
    acts_on: ClassVar = Block

    @classmethod
    def shape(cls, block):
        """``[H d_v + 4D + 2b]``: one entry per row of ``W_O``, per column of the MLP's
        ``c_proj.weight`` and per output bias (``b = 1`` with biases)."""
        return (sum(_writer_sizes(block)),)

    def transform(self, params, block):
        r"""Row :math:`(h, e)` of ``W_O`` plus :math:`c_{he} \mathbf{1}`, column :math:`j` of
        ``c_proj.weight`` plus :math:`c_j \mathbf{1}`, each output bias plus a multiple of
        :math:`\mathbf{1}`."""
        parts = self.c.to(params["attn.W_O"].device).split(_writer_sizes(block))
        out = {}
        for (name, kind), c in zip(_writers(block), parts):
            W = params[name]
            if kind == "rows":  # (H, dv, D): row (h, e) + c[h, e] 1
                out[name] = W + c.reshape(W.shape[-3], W.shape[-2])[..., None]
            else:  # (D, 4D): column j + c_j 1; a bias (D,) + c 1
                out[name] = W + c
        return out


@dataclass(frozen=True, eq=False)
class HiddenRescaling(ScalingFactor):
    r"""Hidden unit :math:`j` of a PReLU MLP: input weights and bias times :math:`s_j > 0`, output
    weights over :math:`s_j` (:math:`\operatorname{PReLU}(sz) = s \operatorname{PReLU}(z)` for
    :math:`s > 0`)."""

    s: torch.Tensor  #: [4D]
    acts_on: ClassVar = MLP

    @classmethod
    def shape(cls, mlp):
        """``[4D]`` for a PReLU MLP, ``[0]`` otherwise."""
        return (mlp.c_fc.weight.shape[0] if isinstance(mlp.act, PReLU) else 0,)

    def check(self, mlp):
        """ValueError unless the MLP uses PReLU; then the shape check."""
        if not isinstance(mlp.act, PReLU):
            raise ValueError("rescaling hidden units is a symmetry of a PReLU MLP only, this MLP "
                             f"uses {type(mlp.act).__name__}")
        super().check(mlp)

    def transform(self, params, mlp):
        r"""Row :math:`j` of ``c_fc.weight`` and ``c_fc.bias[j]`` times :math:`s_j`, column
        :math:`j` of ``c_proj.weight`` over :math:`s_j`."""
        s = self.s.to(params["c_fc.weight"].device)
        out = {"c_fc.weight": params["c_fc.weight"] * s[:, None],
               "c_proj.weight": params["c_proj.weight"] / s}
        if "c_fc.bias" in params:
            out["c_fc.bias"] = params["c_fc.bias"] * s
        return out


@dataclass(frozen=True, eq=False)
class HiddenPermutation(PermutationFactor):
    """Relabel the MLP's hidden units: unit ``i`` of the result is unit ``perm[i]`` (the
    activation acts unit by unit)."""

    perm: torch.Tensor  #: [4D]
    acts_on: ClassVar = MLP

    @classmethod
    def shape(cls, mlp):
        """``[4D]``, one entry per hidden unit."""
        return (mlp.c_fc.weight.shape[0],)

    def transform(self, params, mlp):
        """Rows of ``c_fc.weight``, entries of ``c_fc.bias`` and of the PReLU slopes
        (``act.weight``), and columns of ``c_proj.weight``, in the order ``perm``."""
        perm = self.perm.to(params["c_fc.weight"].device)
        out = {"c_fc.weight": params["c_fc.weight"].index_select(-2, perm),
               "c_proj.weight": params["c_proj.weight"].index_select(-1, perm)}
        for name in ("c_fc.bias", "act.weight"):
            if name in params:
                out[name] = params[name].index_select(-1, perm)
        return out


def residual_axes(model: GPT) -> dict[str, int]:
    """``{parameter name: its axis over residual features, counted from the end}``."""
    axes = {"wte.weight": -1, "ln_f.weight": -1, "ln_f.bias": -1, "wpe.weight": -1}
    for i, block in enumerate(model.blocks):
        p = f"blocks.{i}"
        for ln in LAYERNORMS:
            axes[f"{p}.{ln}.weight"] = axes[f"{p}.{ln}.bias"] = -1
        for name in ("W_Q", "W_K", "W_V", "W_GQ", "W_GK"):
            axes[f"{p}.attn.{name}"] = -2
        axes.update({f"{p}.attn.W_O": -1, f"{p}.attn.b_O": -1, f"{p}.mlp.c_fc.weight": -1,
                     f"{p}.mlp.c_proj.weight": -2, f"{p}.mlp.c_proj.bias": -1})
    return axes


class _PerResidualFeature:
    """Factors of a GPT whose parameter has one entry per residual feature (``[n_embd]``)."""

    acts_on: ClassVar = GPT

    @classmethod
    def shape(cls, model):
        return (model.config.n_embd,)


@dataclass(frozen=True, eq=False)
class ResidualPermutation(_PerResidualFeature, PermutationFactor):
    """Residual feature ``i`` of the result is feature ``perm[i]``, in every tensor that reads or
    writes the stream (LayerNorm statistics and the tied unembedding are permutation
    invariant)."""

    perm: torch.Tensor  #: [D]

    def transform(self, params, model):
        """Every tensor's residual-feature axis (:func:`residual_axes`) in the order ``perm``."""
        perm = self.perm.to(params["wte.weight"].device)
        return {name: params[name].index_select(axis, perm)
                for name, axis in residual_axes(model).items() if name in params}


@dataclass(frozen=True, eq=False)
class PositionCentring(TranslationFactor):
    r""":math:`W_\text{pos}[t] \to W_\text{pos}[t] + c_t \mathbf{1}` (``wpe``): the first LayerNorm
    of every block removes it, and so does every later one (learned positions only)."""

    c: torch.Tensor  #: [block_size]
    acts_on: ClassVar = GPT

    @classmethod
    def shape(cls, model):
        """``[block_size]`` with learned positions; none with RoPE."""
        return (model.config.block_size if model.wpe is not None else 0,)

    def transform(self, params, model):
        r""":math:`W_\text{pos}[t] \to W_\text{pos}[t] + c_t \mathbf{1}`; nothing with RoPE (no
        ``wpe``)."""
        if "wpe.weight" not in params:  # RoPE: c has shape [0], nothing moves
            return {}
        return {"wpe.weight": params["wpe.weight"] + self.c.to(params["wpe.weight"])[:, None]}


@dataclass(frozen=True, eq=False)
class EmbeddingShift(_PerResidualFeature, TranslationFactor):
    r""":math:`W_E \to W_E + \mathbf{1} w^\top` (``wte``),
    :math:`W_\text{pos} \to W_\text{pos} - \mathbf{1} w^\top` (``wpe``): the residual stream is
    unchanged, and the tied unembedding adds :math:`w \cdot h` to every logit alike, which
    log-softmax removes. With RoPE (no ``wpe``) only :math:`w` along :math:`\mathbf{1}` is
    invisible at the input (the LayerNorms remove it)."""

    w: torch.Tensor  #: [D]

    def check(self, model):
        """The shape check, and with RoPE (no ``wpe``) ValueError unless ``w`` is constant."""
        super().check(model)
        w = self.w.double()
        if model.wpe is None and (w - w.mean()).abs().max() > 1e-9 * max(w.abs().max(), 1.0):
            raise ValueError("with RoPE (no wpe) EmbeddingShift is a symmetry only for w = c 1, "
                             "a constant vector: pass torch.full((n_embd,), c)")

    def transform(self, params, model):
        r"""Every row of ``wte`` plus :math:`w`, every row of ``wpe`` (if any) minus :math:`w`."""
        w = self.w.to(params["wte.weight"])
        out = {"wte.weight": params["wte.weight"] + w}
        if "wpe.weight" in params:
            out["wpe.weight"] = params["wpe.weight"] - w
        return out

    @classmethod
    def lie_basis(cls, model):
        r"""The algebra's translations of the log-probabilities: every :math:`w` (learned
        positions), or :math:`w = \mathbf{1}` (RoPE)."""
        D = model.config.n_embd
        return torch.ones(1, D, dtype=DTYPE) if model.wpe is None else unit_basis((D,))


def _stream_writers(model: GPT) -> list[str]:
    """Names of the parameters that write to the residual stream: the embeddings and every
    block's writers (``_writers``)."""
    names = ["wte.weight"] + (["wpe.weight"] if model.wpe is not None else [])
    return names + [f"blocks.{i}.{name}" for i, block in enumerate(model.blocks)
                    for name, _ in _writers(block)]


@dataclass(frozen=True, eq=False)
class StreamScaling(ScalingFactor):
    r"""The residual-stream scaling, :math:`s > 0` (shape ``[1]``): every writer to the stream
    (``wte``, ``wpe``, and in every block ``W_O``, ``b_O``, the MLP's ``c_proj`` weight and bias)
    times :math:`s`, ``ln_f``'s gain and bias over :math:`s`.

    Exact only when every LayerNorm has :math:`\epsilon = 0`. With
    :math:`v = \operatorname{var}(x)` of a non-constant row ``x [D]``,
    :math:`n_\epsilon(x) = (x - \operatorname{mean}(x)) / \sqrt{v + \epsilon}` gives
    :math:`n_0(sx) = n_0(x)`: the stream is :math:`sx` after every block, each block reads it
    unchanged and writes :math:`s` times its update, and the tied logits
    :math:`(\gamma_f \odot n + \beta_f)(s W_E)^\top` lose :math:`s` to :math:`\gamma_f / s`,
    :math:`\beta_f / s`. For :math:`\epsilon > 0`,
    :math:`\frac{d}{ds} n_\epsilon(sx) |_{s=1} = \frac{\epsilon}{v + \epsilon}\, n_\epsilon(x)`:
    the output changes at first order by a sum of such terms, one per LayerNorm and position
    (chapter 6, near-symmetries)."""

    s: torch.Tensor  #: [1]
    acts_on: ClassVar = GPT

    @classmethod
    def shape(cls, model):
        """``[1]``: one scale for the whole stream."""
        return (1,)

    def transform(self, params, model):
        """``wte``, ``wpe`` and every block's ``W_O``, ``b_O``, ``c_proj`` weight and bias times
        ``s``; ``ln_f``'s gain and bias over ``s``."""
        s = self.s.to(params["wte.weight"])
        out = {name: params[name] * s for name in _stream_writers(model)}
        out.update({name: params[name] / s for name in ("ln_f.weight", "ln_f.bias")
                    if name in params})
        return out
