r"""Redundant directions of a whole GPT: the attention gauge of every layer, and what LayerNorm, the
MLP and the tied embedding add (chapter 6).

:func:`redundancy_count` is what :func:`gaugebook.redundancy.predicted_redundancy` returns for
a ``Block`` of :mod:`gaugebook.gpt` (the block on its own, output the full residual stream),
:class:`gaugebook.gpt.GPT` (output: logits) and :class:`LogProbabilities` (output: log-softmax of
the logits, on which the loss depends). :func:`redundancy_terms` gives the count term by term from a
:class:`~gaugebook.gpt.GPTConfig` alone, so that GPT-2 small is counted without being built;
:func:`redundant_directions` builds the tangent vectors of every term for a model at hand.

Notation (that of the chapters): ``D`` = n_embd, ``H`` query heads, :math:`n_{kv}` (``n_kv``)
key/value heads in groups of :math:`g = H / n_{kv}`, head width ``d = D / H``, ``b = 1`` with
biases (else 0), ``T`` = block_size, ``L`` layers.
Every read from the residual stream goes through a LayerNorm ``y = gamma * n + beta`` whose
normalised ``n`` has mean zero; so, per layer:

* ``qk_gauge``, ``key_bias``, ``vo_gauge``, ``value_bias``: the attention count of
  :mod:`gaugebook.redundancy`, with ``D - 1`` effective input (and, inside a GPT, output)
  dimensions.
* ``ln_gain``: ``gamma_i, beta_i -> s gamma_i, s beta_i`` with row ``i`` of every weight that reads
  the LayerNorm divided by ``s``: ``D`` per LayerNorm.
* ``ln_bias``: ``beta -> beta + delta`` with the readers' biases ``b -> b - delta W`` (the gates
  of gated RoPE, which have no bias, move their columns along ``1/gamma`` instead): ``b D`` per
  LayerNorm.
* ``ln_centring``: ``W -> W + (1/gamma) u^T`` (with ``b -> b - (beta . 1/gamma) u``) changes nothing
  because ``n . 1 = 0``: one direction per column of the readers, ``H d + 2 n_kv d`` after ``ln_1``,
  ``4D`` after ``ln_2``.
* ``residual_centring`` (inside a GPT only): every LayerNorm removes the mean, so what a layer
  writes along ``1`` is invisible: ``W_O[h] -> W_O[h] + e_j 1^T``, ``b_O -> b_O + c 1``, likewise
  the MLP's output projection: ``H d + b + 4D + b``. (A block on its own has only ``b``:
  ``b_O + c 1`` with the MLP's output bias ``- c 1``, since ``ln_2`` does not see the shift.)
* ``mlp_rescaling``: PReLU is positively homogeneous: hidden unit ``j``'s input weights and bias
  times ``s > 0``, its output weights over ``s``: ``4D`` (GELU: none).

and for the whole model:

* ``position_centring``: ``wpe[t] -> wpe[t] + c_t 1`` (``T`` directions; none with RoPE).
* ``embedding_shift``: ``wte -> wte + 1 w^T``, ``wpe -> wpe - 1 w^T`` leaves the residual stream as
  it was and adds ``w . h`` to every logit alike, which log-softmax removes: ``D`` directions for
  log-probabilities (1 with RoPE, where only ``w ~ 1`` is invisible at the input). For raw logits
  only ``w = c / gamma_f`` without biases survives (1 direction; none with biases or RoPE).

The count holds at generic weights with probe sequences of length ``T`` that use every token, and
needs ``vocab_size > n_embd``. Two caveats are measured in chapter 6: GPT-2's initialisation
(gains 1, biases 0) is not generic, and a PReLU unit whose input never changes sign on the probes
is linear there and adds redundancy.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gaugebook.attention import MultiHeadAttention
from gaugebook.checks import check_bool, check_number
from gaugebook.gpt import (ACTIVATIONS, GPT, Block, GPTConfig, PReLU, activations,
                           check_block_options)
from gaugebook.gauge import ATTENTION_ALGEBRA
from gaugebook.gpt_gauge import (LAYERNORMS, EmbeddingShift, HiddenRescaling, LayerNormScale,
                                 LayerNormShift, PositionCentring, ReaderCentring,
                                 ResidualCentring)
from gaugebook.lie import attention_terms, tangent_map

__all__ = ["TERMS", "OUTPUTS", "COUNTED", "MIN_LAYER_NORM_EPS", "MIN_COUNTED_WIDTH",
           "LogProbabilities", "redundancy_terms", "block_terms", "redundancy_count",
           "parameter_count", "redundant_directions", "make_generic_", "positive_fraction"]

#: The kinds of redundant direction in a GPT, each with what it is (TeX between dollars, which
#: :class:`gaugebook.results.Table` sets), keyed by the terms :func:`redundancy_terms` counts.
#:
#: :meta hide-value:
TERMS = {
    "qk_gauge": r"$\GL(d_k)$ per key/value group on $W_Q, b_Q, W_K, b_K$ (with RoPE: the "
                "commutant)",
    "key_bias": "$b_K$ cancels in the softmax",
    "vo_gauge": r"$\GL(d_v)$ per key/value group on $W_V, b_V, W_O$",
    "value_bias": "$b_V W_O$ is a constant that $b_O$ absorbs",
    "ln_gain": "LayerNorm gain (and bias) per feature against the rows of its readers",
    "ln_bias": "LayerNorm bias against the biases of its readers",
    "ln_centring": r"readers' weights along $1/\gamma$ (LayerNorm output has mean zero)",
    "residual_centring": r"writes along $\mathbf{1}$ into the residual stream ($W_O, b_O$, MLP "
                         "output)",
    "mlp_rescaling": "PReLU hidden-unit rescaling (positive homogeneity)",
    "position_centring": r"position embeddings along $\mathbf{1}$",
    "embedding_shift": "one vector added to all token embeddings, removed from all positions",
}
OUTPUTS = ("log_probs", "logits")
#: The smallest LayerNorm ``eps`` that :func:`redundancy_terms` counts for. The stream scaling
#: (:class:`~gaugebook.gpt_gauge.StreamScaling`) breaks in proportion to ``eps``: on tiny
#: generic GPTs its singular value was ``c eps`` of the largest, ``c`` from ``1e-5``
#: (``n_embd=4``, one head) to ``4e-2`` (``n_embd=6``, two heads), against a rank tolerance of
#: ``2e-13`` to ``5e-13`` (``max(J.shape)`` times float64's epsilon). The Jacobian rank dropped
#: it, and the measured redundancy exceeded the count by one, at ``eps = 1e-8`` for the one-head
#: GPT (116 against 115) and at ``1e-12`` for the two-head one (159 against 158). ``1e-6`` keeps
#: the one-head GPT's singular value 50 times above the tolerance (GPT-2's and PyTorch's
#: ``1e-5``: 500 times).
MIN_LAYER_NORM_EPS = 1e-6
#: The narrowest residual stream :func:`block_terms` counts for (PReLU blocks need more, see
#: there): narrower ones have redundant directions that no symmetry term counts.
MIN_COUNTED_WIDTH = 4


class LogProbabilities(nn.Module):
    """``idx [B, T] -> log_softmax(logits) [B, T, V]``: the part of a GPT's output that the loss
    (and every sampled token) depends on. Its only parameters are the GPT's."""

    def __init__(self, gpt: GPT):
        super().__init__()
        if not isinstance(gpt, GPT):
            raise TypeError(f"LogProbabilities wraps a GPT, got {type(gpt).__name__}")
        self.gpt = gpt

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """``log softmax`` of the GPT's logits, ``[B, T, V]``."""
        logits, _ = self.gpt(idx)  # (B, T, V)
        return F.log_softmax(logits, dim=-1)


def block_terms(*, d_model: int, n_head: int, n_kv_head: int, bias: bool, activation: str,
                rope: bool | str = False, symmetry_breaking: str | None = None, mu_v: float = 0.0,
                in_gpt: bool = True) -> dict[str, int]:
    """Redundant directions of one pre-LN block, term by term (keys of ``TERMS``).

    ``in_gpt=True``: the block inside a GPT, where the mean of what it writes is invisible (every
    later reader is a LayerNorm); ``in_gpt=False``: the block on its own, output ``[B, T, D]``.
    With ``symmetry_breaking`` the count is for eval mode (the biases at their means): a learned
    bias absorbs a fixed shift (no change); without learned biases the means are one fixed draw
    (:func:`gaugebook.lie.drawn_gauge`; the value mean counts when ``mu_v != 0``). The
    arguments obey :class:`~gaugebook.gpt.GPTConfig`'s rules, with ``d_model`` its ``n_embd``.

    Narrow blocks have redundant directions that no term counts, so they are refused: widths
    below ``MIN_COUNTED_WIDTH`` (measured: 22 more than counted for a GPT of width 2, 2 more at
    width 3), and PReLU blocks whose ``4 D`` slopes outnumber the ``(D - 1) x D_out`` linear maps
    through which the slopes act beyond the hidden rescaling (``D_out = D - 1`` inside a GPT,
    ``D`` on its own): a PReLU GPT of width 4 had 7 more per layer, width 5 had 4 more.
    """
    check_bool("in_gpt", in_gpt)
    check_block_options(n_embd=d_model, n_head=n_head, n_kv_head=n_kv_head, bias=bias,
                        activation=activation, rope=rope, symmetry_breaking=symmetry_breaking,
                        mu_v=mu_v, width_name="d_model")
    D, H, Hkv, b = d_model, n_head, n_kv_head, int(bias)
    d, G = D // H, H // Hkv
    D_in = D - 1  # LayerNorm outputs span an affine hyperplane: D - 1 directions vary
    D_out = D - 1 if in_gpt else D
    if D < MIN_COUNTED_WIDTH or (activation == "prelu" and 4 * D > D_in * D_out):
        least = MIN_COUNTED_WIDTH if activation != "prelu" else 6 if in_gpt else 5
        raise ValueError(f"the count covers blocks of width d_model >= {least} ("
                         f"{'inside a GPT' if in_gpt else 'on their own'}, {activation}); at "
                         f"{D} the block has redundant directions that it does not count")
    breaks = symmetry_breaking is not None and not bias
    if breaks and (rope or d > D_in):
        raise ValueError("the count for symmetry-breaking biases without learned biases covers "
                         "attention without RoPE and with d_head < n_embd")
    # with breaking and no learned biases: the means, one query draw and one value draw where
    # its mean is nonzero (learned biases absorb a fixed shift: the symmetric count)
    draws = (1, int(symmetry_breaking == "bqv" and mu_v != 0.0)) if breaks else None
    sectors = attention_terms(d_in=D_in, d_out=D_out, n_kv_heads=Hkv, group_size=G, d_head=d,
                              d_value=d, bias=bias, rope=rope, rotary_dim=d if rope else 0,
                              draws=draws)
    # the other terms: the dimensions of the gpt_gauge factors' algebras, read off a block
    # built on the meta device (shapes only, no memory: GPT-2 small's blocks too)
    with torch.device("meta"):
        block = Block(GPTConfig(2, 2, 1, n_head, d_model, n_kv_head=n_kv_head, bias=bias,
                                activation=activation, rope=rope))

        def dimension(family, module, **options):
            return len(family.lie_basis(module, **options))

        return dict(
            sectors,
            ln_gain=sum(dimension(LayerNormScale, block, which=w) for w in LAYERNORMS),
            ln_bias=sum(dimension(LayerNormShift, block, which=w) for w in LAYERNORMS),
            ln_centring=sum(dimension(ReaderCentring, block, which=w) for w in LAYERNORMS),
            # on its own, only b_O + c 1 with the MLP's output bias - c 1 (ln_2 does not see it)
            residual_centring=dimension(ResidualCentring, block) if in_gpt else b,
            mlp_rescaling=dimension(HiddenRescaling, block.mlp),
        )


def redundancy_terms(config: GPTConfig, *, output: str = "log_probs") -> dict[str, int]:
    """The count of redundant directions of ``GPT(config)`` at generic weights, term by term.

    ``output="log_probs"`` (the default) counts for :class:`LogProbabilities`, ``"logits"``
    for the GPT itself. Keys are those of ``TERMS``; the values add up to
    :func:`~gaugebook.redundancy.predicted_redundancy` of the model of that output:
    ``predicted_redundancy(LogProbabilities(GPT(config)))`` for the default, which counts
    ``embedding_shift`` :math:`= D` (:math:`1` with RoPE) where the logits have at most
    :math:`1`; ``predicted_redundancy(GPT(config))`` for ``output="logits"``. The LayerNorms need
    ``eps >= MIN_LAYER_NORM_EPS`` (the default ``1e-5`` is): at ``eps = 0`` the stream scaling is
    exact too, and for a smaller ``eps > 0`` its singular value, proportional to ``eps``, can fall
    below the rank tolerance of :func:`~gaugebook.redundancy.redundancy` (chapter 6,
    near-symmetries).
    """
    if not isinstance(config, GPTConfig):
        raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
    if config.vocab_size <= config.n_embd:
        raise ValueError(f"the count assumes vocab_size > n_embd (got {config.vocab_size} <= "
                         f"{config.n_embd}): otherwise the embedding has a null space of its own")
    if config.layer_norm_eps == 0:
        raise ValueError("the count assumes layer_norm_eps > 0: at eps = 0 the residual-stream "
                         "scaling (gaugebook.gpt_gauge.StreamScaling) is one more exact direction")
    if config.layer_norm_eps < MIN_LAYER_NORM_EPS:
        raise ValueError(f"the count assumes layer_norm_eps >= {MIN_LAYER_NORM_EPS:g}, got "
                         f"{config.layer_norm_eps:g}: the residual-stream scaling "
                         "(gaugebook.gpt_gauge.StreamScaling) breaks in proportion to eps, and "
                         "below that the Jacobian rank can count it as redundant; use a larger "
                         "eps (GPT-2's is 1e-5)")
    per_layer = block_terms(d_model=config.n_embd, n_head=config.n_head,
                            n_kv_head=config.kv_heads, bias=config.bias,
                            activation=config.activation, rope=config.rope,
                            symmetry_breaking=config.symmetry_breaking, mu_v=config.mu_v)
    terms = {name: config.n_layer * count for name, count in per_layer.items()}
    terms["position_centring"] = 0 if config.rope else config.block_size
    if output == "log_probs":
        terms["embedding_shift"] = 1 if config.rope else config.n_embd
    else:
        terms["embedding_shift"] = int(not config.rope and not config.bias)
    return terms


def parameter_count(config: GPTConfig) -> int:
    """Trainable parameters of ``GPT(config)`` (tied embedding once), without building it."""
    D, H, Hkv, b = config.n_embd, config.n_head, config.kv_heads, int(config.bias)
    d = config.head_size
    attention = (H + Hkv) * D * d + Hkv * D * d + H * d * D + b * ((H + 2 * Hkv) * d + D)
    if config.rope == "gated":
        attention += (H + Hkv) * D * d
    mlp = 2 * 4 * D * D + b * (4 * D + D) + (4 * D if config.activation == "prelu" else 0)
    layernorms = 2 * (1 + b) * D
    embeddings = config.vocab_size * D + (0 if config.rope else config.block_size * D)
    return embeddings + config.n_layer * (attention + mlp + layernorms) + (1 + b) * D


def _activation_name(act: nn.Module) -> str:
    """The :class:`~gaugebook.gpt.GPTConfig` name of an MLP's activation module; TypeError for
    one that the counts do not cover (a module swapped in by hand), rather than a wrong count."""
    if isinstance(act, PReLU):
        return "prelu"
    if isinstance(act, nn.GELU):
        return "gelu"
    raise TypeError(f"no count for a block whose MLP activation is {type(act).__name__}: the "
                    f"counts cover the activations {ACTIVATIONS} (gaugebook.gpt.PReLU, nn.GELU)")


def _block_shape(block: Block) -> dict:
    a = block.attn
    return dict(d_model=a.d_model, n_head=a.n_heads, n_kv_head=a.n_kv_heads, bias=a.has_bias,
                activation=_activation_name(block.mlp.act), rope=a.rope,
                symmetry_breaking=None if block.breaking is None else block.breaking.mode,
                mu_v=0.0 if block.breaking is None else block.breaking.mu_v)


COUNTED = (Block, GPT, LogProbabilities)
"""The model types that :func:`redundancy_count` covers (:class:`~gaugebook.gpt.Block`,
:class:`~gaugebook.gpt.GPT` and :class:`LogProbabilities`).

:meta hide-value:
"""


def redundancy_count(model: Block | GPT | LogProbabilities) -> int:
    """The count :func:`gaugebook.redundancy.predicted_redundancy` gives: a block on its own
    (output: the residual stream after the block, mean included), a GPT (its own output, the
    logits) or :class:`LogProbabilities` (its ``embedding_shift`` term differs, by ``D`` with
    learned biases and no RoPE: :func:`redundancy_terms`). With
    symmetry-breaking biases it counts the eval-mode function (the biases at their means), in
    either mode, as :func:`~gaugebook.redundancy.redundancy` measures it."""
    if not isinstance(model, COUNTED):
        raise TypeError(f"expected a Block, GPT or LogProbabilities, got {type(model).__name__}")
    if isinstance(model, Block):
        return sum(block_terms(**_block_shape(model), in_gpt=False).values())
    gpt = model if isinstance(model, GPT) else model.gpt
    swapped = [i for i, block in enumerate(gpt.blocks)
               if _activation_name(block.mlp.act) != gpt.config.activation]
    if swapped:  # the count reads the config, which no longer describes these blocks
        raise ValueError(f"blocks {swapped} do not use the config's activation "
                         f"{gpt.config.activation!r}: no count for a model changed by hand")
    output = "logits" if isinstance(model, GPT) else "log_probs"
    return sum(redundancy_terms(gpt.config, output=output).values())


def redundant_directions(model: GPT | LogProbabilities, *,
                         trainable_only: bool = True) -> dict[str, torch.Tensor]:
    """Tangent vectors of every term of :func:`redundancy_terms`, as ``{term: [n_params, k]}``.

    Rows follow the flat order of the trainable parameters of ``model.named_parameters()``
    (that of :func:`gaugebook.redundancy.jacobian`; all parameters with
    ``trainable_only=False``), so ``jacobian(model, idx) @ V`` should vanish for every
    term, and all columns together should span the Jacobian's null space. Each column is the
    derivative of a one-parameter family of symmetries at the identity
    (:func:`gaugebook.lie.tangent_map` of the factors of :mod:`gaugebook.gauge` and
    :mod:`gaugebook.gpt_gauge`). Covers learned positions, RoPE and gated RoPE, not
    symmetry-breaking biases, nor LayerNorm ``eps = 0``, where the residual-stream scaling
    (:class:`~gaugebook.gpt_gauge.StreamScaling`, no term) is exact too.
    """
    gpt = model.gpt if isinstance(model, LogProbabilities) else model
    if not isinstance(gpt, GPT):
        raise TypeError(f"expected a GPT or LogProbabilities, got {type(model).__name__}")
    c = gpt.config
    if c.symmetry_breaking is not None:
        raise ValueError("redundant_directions covers learned positions, RoPE and gated RoPE, "
                         "without symmetry-breaking biases")
    if c.layer_norm_eps == 0:
        raise ValueError("redundant_directions covers layer_norm_eps > 0: at eps = 0 the "
                         "residual-stream scaling (StreamScaling) is a symmetry too")
    root = ["gpt"] if isinstance(model, LogProbabilities) else []
    cols = {name: [] for name in TERMS}

    def add(term, family, target, basis=None, **options):  # columns of one factor family
        path = ".".join(root + ([target] if target else []))
        cols[term].append(tangent_map(model, family, path, basis,
                                      trainable_only=trainable_only, **options))

    for i in range(c.n_layer):
        p = f"blocks.{i}"
        for term, family in zip(("qk_gauge", "vo_gauge", "key_bias", "value_bias"),
                                ATTENTION_ALGEBRA):
            add(term, family, f"{p}.attn")
        for which in LAYERNORMS:
            add("ln_gain", LayerNormScale, p, which=which)
            add("ln_bias", LayerNormShift, p, which=which)
            add("ln_centring", ReaderCentring, p, which=which)
        add("residual_centring", ResidualCentring, p)
        add("mlp_rescaling", HiddenRescaling, f"{p}.mlp")
    add("position_centring", PositionCentring, "")
    if isinstance(model, LogProbabilities):
        add("embedding_shift", EmbeddingShift, "")
    else:  # raw logits: only w = c / gamma_f, and only without biases or RoPE
        w = [] if c.rope or c.bias else [1.0 / gpt.ln_f.weight.detach().double()]
        add("embedding_shift", EmbeddingShift, "",
            torch.stack(w) if w else torch.zeros(0, c.n_embd, dtype=torch.float64))
    directions = {name: torch.cat(vs, dim=1) for name, vs in cols.items()}
    bad = [name for name, V in directions.items() if not bool(torch.isfinite(V).all())]
    if bad:  # e.g. gated RoPE's gates at beta = 0, GPT-2's initialisation (LayerNormShift)
        raise ValueError(f"the directions of {bad} are not finite at these weights, which are "
                         "not generic (a LayerNorm bias of zero, say); call make_generic_(gpt) "
                         "first")
    return directions


@torch.no_grad()
def make_generic_(model: nn.Module, *, generator: torch.Generator | None = None,
                  bias_std: float = 0.1) -> nn.Module:
    """Overwrite every parameter of a GPT (or block) with a generic value, in place; returns it.

    GPT-2's initialisation is a special point: LayerNorm gains all 1 and all biases 0 give the
    network extra symmetries (chapter 6). Here weights are ``N(0, 1/fan_in)``, with ``fan_in``
    the input width of the matrix drawn (of each head's own block for attention: ``D`` for
    ``W_Q[h]``, ``d_value`` for ``W_O[h]``), LayerNorm gains uniform in ``[0.5, 1.5]``, PReLU
    slopes uniform in ``[0.1, 0.4]``, biases ``N(0, bias_std^2)`` (small, so that every PReLU
    unit's input takes both signs on typical data; ``bias_std >= 0``).
    """
    check_number("bias_std", bias_std, low=0.0, strict=False)

    def draw(shape, scale=1.0):
        return scale * torch.randn(shape, generator=generator, dtype=torch.float64)

    def uniform(shape, low, high):
        return low + (high - low) * torch.rand(shape, generator=generator, dtype=torch.float64)

    for module in model.modules():
        if isinstance(module, nn.LayerNorm):
            module.weight.copy_(uniform(module.weight.shape, 0.5, 1.5))
            if module.bias is not None:
                module.bias.copy_(draw(module.bias.shape, bias_std))
        elif isinstance(module, PReLU):
            module.weight.copy_(uniform(module.weight.shape, 0.1, 0.4))
        elif isinstance(module, (nn.Linear, nn.Embedding)):
            fan_in = module.weight.shape[-1]
            module.weight.copy_(draw(module.weight.shape, fan_in ** -0.5))
            if getattr(module, "bias", None) is not None:
                module.bias.copy_(draw(module.bias.shape, bias_std))
        elif isinstance(module, MultiHeadAttention):
            for name, p in module.named_parameters():
                if name.startswith("b_"):
                    p.copy_(draw(p.shape, bias_std))
                else:
                    fan_in = p.shape[-2]
                    p.copy_(draw(p.shape, fan_in ** -0.5))
    return model


@torch.no_grad()
def positive_fraction(model: GPT | LogProbabilities, idx: torch.Tensor) -> torch.Tensor:
    """``[n_layer, 4 n_embd]``: for each MLP hidden unit, the fraction of the probe positions
    ``idx [B, T]`` at which its input is positive.

    The count of :func:`redundancy_terms` assumes every PReLU unit is nonlinear on the probes,
    i.e. its input takes both signs there (a fraction strictly between 0 and 1, and not at a
    handful of positions only); a unit that never switches is linear on the probes and adds
    redundant directions. Like the count, it is for eval mode (symmetry-breaking biases at their
    means): the model runs in eval mode and gets its training mode back afterwards.
    """
    gpt = model.gpt if isinstance(model, LogProbabilities) else model
    if not isinstance(gpt, GPT):
        raise TypeError(f"expected a GPT or LogProbabilities, got {type(model).__name__}")
    inputs = activations(gpt, idx, [block.mlp.c_fc for block in gpt.blocks], output=True)
    return torch.stack([(z > 0).flatten(0, 1).double().mean(0) for z in inputs])  # (L, 4D)
