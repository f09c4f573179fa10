"""A GPT-2 whose attention is :class:`gaugebook.attention.MultiHeadAttention`.

The architecture of Radford et al. (2019) as nanoGPT writes it: token and learned position
embeddings, ``n_layer`` pre-LayerNorm blocks ``x + attn(ln_1(x))``, ``x + mlp(ln_2(x))``, a final
LayerNorm and a language-model head tied to the token embedding. Two options come from the
symmetry-breaking paper (Silverstein, Kunin, Shyam 2026): a PReLU MLP and unlearned query/value
biases (:mod:`gaugebook.breaking`). RoPE (instead of learned positions) and grouped key/value heads
are available for the book's ablations.

Because attention keeps per-head weights ``W_Q [H, D, dk]`` etc., every tool of
:mod:`gaugebook.gauge` and :mod:`gaugebook.mechanics` applies to ``model.blocks[i].attn``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import KW_ONLY, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from gaugebook.attention import MultiHeadAttention, check_rope_mode
from gaugebook.breaking import SymmetryBreakingBias, check_breaking
from gaugebook.checks import (check_bool, check_integer_dtype, check_number,
                              check_positive_ints, dataclass_from_dict)

__all__ = ["GPTConfig", "GPT", "Block", "MLP", "PReLU", "ACTIVATIONS", "PRELU_INITS",
           "check_block_options", "eval_mode", "activations"]

ACTIVATIONS = ("gelu", "prelu")
INIT_STD = 0.02  # GPT-2's initializer_range
# PReLU slopes at initialisation: nn.PReLU's constant 0.25, or the symmetry-breaking paper's
# code, which draws one slope per hidden unit from N(0.2, 1.0^2).
PRELU_INITS = ("constant", "paper")
PRELU_CONSTANT, PRELU_PAPER_MEAN, PRELU_PAPER_STD = 0.25, 0.2, 1.0


@contextlib.contextmanager
def eval_mode(model: nn.Module):
    """``with eval_mode(model):`` runs ``model`` in eval mode (symmetry-breaking biases at their
    means, no dropout), then gives every submodule back the mode it had."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, training in modes:
            module.training = training


def activations(model: nn.Module, idx: torch.Tensor, modules: list[nn.Module], *,
                output: bool = False) -> list[torch.Tensor]:
    """What each of ``modules`` (submodules of ``model``) receives as its first input, or with
    ``output`` returns, when ``model`` reads ``idx`` in eval mode (:func:`eval_mode`): one tensor
    per module, in the order given (a module called twice: its last call)."""
    seen: list[torch.Tensor | None] = [None] * len(modules)

    def keep(i):
        if output:
            return lambda _module, _args, out: seen.__setitem__(i, out)
        return lambda _module, args: seen.__setitem__(i, args[0])

    hooks = [m.register_forward_hook(keep(i)) if output else m.register_forward_pre_hook(keep(i))
             for i, m in enumerate(modules)]
    try:
        with eval_mode(model):
            model(idx)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def check_block_options(*, n_embd: int, n_head: int, n_kv_head: int, bias: bool, activation: str,
                        rope: bool | str, symmetry_breaking: str | None, mu_v: float,
                        width_name: str = "n_embd") -> None:
    """ValueError for a block that :class:`GPTConfig` refuses: sizes that are not positive
    integers, ``n_embd`` not divisible by ``n_head`` or ``n_head`` by ``n_kv_head``, an unknown
    activation, RoPE mode or symmetry-breaking mode, RoPE with an odd head size, a non-finite
    ``mu_v`` or one without ``"bqv"``. ``width_name``: what the caller calls ``n_embd``."""
    check_positive_ints(**{width_name: n_embd}, n_head=n_head, n_kv_head=n_kv_head)
    if n_embd % n_head:
        raise ValueError(f"{width_name}={n_embd} is not divisible by n_head={n_head}")
    if n_head % n_kv_head:
        raise ValueError(f"n_head={n_head} is not divisible by n_kv_head={n_kv_head}")
    check_bool("bias", bias)
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    check_rope_mode(rope)
    if rope and (n_embd // n_head) % 2:
        raise ValueError(f"RoPE rotates planes of two coordinates: the head size "
                         f"{width_name}/n_head={n_embd // n_head} must be even")
    check_breaking(symmetry_breaking, mu_v, name="symmetry_breaking")


@dataclass(frozen=True)
class GPTConfig:
    """Shape and options of a :class:`GPT`.

    ``n_kv_head`` (default ``n_head``) gives grouped-query attention; ``symmetry_breaking`` is
    ``None``, ``"bq"`` (unlearned query bias) or ``"bqv"`` (query and value biases, the value
    bias with mean ``mu_v``); ``prelu_init`` is ``"constant"`` (every slope 0.25) or
    ``"paper"`` (one slope per hidden unit from N(0.2, 1.0^2)); ``layer_norm_eps >= 0`` is the
    ``epsilon`` of every LayerNorm, ``(x - mean) / sqrt(var + epsilon)`` (GPT-2 and PyTorch:
    ``1e-5``; ``0`` makes the residual-stream scaling of
    :class:`~gaugebook.gpt_gauge.StreamScaling` exact). Frozen: a changed copy is
    ``dataclasses.replace(config, ...)``, validated again.

    Attributes:
        vocab_size: the token ids ``0 .. vocab_size - 1``; the output layer is the token
            embedding (tied).
        block_size: the longest sequence; without RoPE, the rows of the position embedding.
        n_layer: the number of blocks.
        n_head: query heads per attention layer, each of width ``n_embd // n_head``.
        n_embd: the width ``D`` of the residual stream.
        bias: biases in every linear layer but the output layer, and in every LayerNorm.
        activation: the MLP's, ``"gelu"`` or ``"prelu"``.
        rope: ``False`` (learned positions), ``True`` (rotary) or ``"gated"`` (rotary with
            content gates on queries and keys).
    """

    vocab_size: int
    block_size: int
    n_layer: int
    n_head: int
    n_embd: int
    _: KW_ONLY
    n_kv_head: int | None = None
    bias: bool = True
    activation: str = "gelu"
    rope: bool | str = False
    symmetry_breaking: str | None = None
    mu_v: float = 0.0
    prelu_init: str = "constant"
    layer_norm_eps: float = 1e-5

    def __post_init__(self):
        check_positive_ints(vocab_size=self.vocab_size, block_size=self.block_size,
                            n_layer=self.n_layer)
        check_block_options(n_embd=self.n_embd, n_head=self.n_head, n_kv_head=self.kv_heads,
                            bias=self.bias, activation=self.activation, rope=self.rope,
                            symmetry_breaking=self.symmetry_breaking, mu_v=self.mu_v)
        if self.prelu_init not in PRELU_INITS:
            raise ValueError(f"prelu_init must be one of {PRELU_INITS}, got {self.prelu_init!r}")
        eps = self.layer_norm_eps
        if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not 0 <= eps < math.inf:
            raise ValueError(f"layer_norm_eps must be a finite number >= 0 (LayerNorm divides by "
                             f"sqrt(var + eps)), got {eps!r}")

    @property
    def head_size(self) -> int:
        """The width of a query, key or value head, ``n_embd / n_head``."""
        return self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        """The number of key/value heads, ``n_kv_head``, or ``n_head`` (MHA) when that is
        ``None``."""
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @classmethod
    def from_dict(cls, d: dict) -> "GPTConfig":
        """Build a config from a dict (e.g. parsed JSON); unknown or missing keys are errors."""
        return dataclass_from_dict(cls, d)

    def to_dict(self) -> dict:
        """The fields as a plain dict (JSON-ready; :meth:`from_dict` reads it back)."""
        return dataclasses.asdict(self)


class PReLU(nn.PReLU):
    """``nn.PReLU`` with one learned slope per hidden unit of the *last* dimension.

    ``nn.PReLU`` treats dimension 1 as channels, which for ``[B, T, C]`` would be time; flattening
    ``(B, T)`` makes the hidden units the channels.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """PReLU over the last axis of ``x [..., C]`` (one slope per channel ``C``)."""
        return super().forward(x.flatten(0, -2)).view_as(x)


class MLP(nn.Module):
    """``c_proj(act(c_fc(x)))`` with hidden width ``4 n_embd``: GELU (tanh approximation, as in
    GPT-2) or PReLU."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        hidden = 4 * config.n_embd
        self.c_fc = nn.Linear(config.n_embd, hidden, bias=config.bias)
        self.act = nn.GELU(approximate="tanh") if config.activation == "gelu" else PReLU(hidden)
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``c_proj(act(c_fc(x)))``: ``[B, T, D] -> [B, T, 4D] -> [B, T, D]``."""
        return self.c_proj(self.act(self.c_fc(x)))  # (B, T, D) -> (B, T, 4D) -> (B, T, D)


class Block(nn.Module):
    """Pre-LN block; the symmetry-breaking biases (if any) enter the attention's projections."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        D, dk = config.n_embd, config.head_size
        self.ln_1 = nn.LayerNorm(D, eps=config.layer_norm_eps, bias=config.bias)
        self.attn = MultiHeadAttention(D, config.n_head, dk, n_kv_heads=config.n_kv_head,
                                       bias=config.bias, rope=config.rope)
        self.breaking = (None if config.symmetry_breaking is None else
                         SymmetryBreakingBias(dk, dk, config.symmetry_breaking, mu_v=config.mu_v))
        self.ln_2 = nn.LayerNorm(D, eps=config.layer_norm_eps, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, draw=None) -> torch.Tensor:
        """``draw``: this layer's ``(b_Q, b_V)`` to use instead of the module's own draw (or
        mean, in eval mode)."""
        # one draw per layer and forward pass, shared by the heads (broadcast inside attn)
        if draw is None:
            draw = (None, None) if self.breaking is None else self.breaking()
        query_shift, value_shift = draw
        x = x + self.attn(self.ln_1(x), query_shift=query_shift, value_shift=value_shift)
        return x + self.mlp(self.ln_2(x))  # (B, T, D)


def _host_reads_allowed(t: torch.Tensor) -> bool:
    """Whether a check may read ``t``'s values to the host: not while compiling, under vmap,
    while a CUDA graph is captured, or where synchronisations are errors
    (``torch.cuda.set_sync_debug_mode("error")``, as in the last warm-up step of a
    :class:`~gaugebook.step_graph.CapturedStep`)."""
    if torch.compiler.is_compiling() or torch._C._functorch.is_functorch_wrapped_tensor(t):
        return False
    return not t.is_cuda or not (torch.cuda.is_current_stream_capturing()
                                 or torch.cuda.get_sync_debug_mode() == 2)


class GPT(nn.Module):
    """GPT-2 language model: ``forward(idx [B, T], targets=None) -> (logits [B, T, V], loss)``.
    ``generator``: draws the initial parameters (:meth:`reset_parameters`); ``None`` draws from
    torch's global generator."""

    def __init__(self, config: GPTConfig, generator: torch.Generator | None = None):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        # with RoPE, positions enter through the rotation of queries and keys
        self.wpe = None if config.rope else nn.Embedding(config.block_size, config.n_embd)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: logits are scores against the embeddings
        self.reset_parameters(generator)

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """GPT-2 initialisation: weights ``N(0, 0.02^2)``, biases zero, LayerNorm ``(1, 0)``; the
        projections that write into the residual stream (``W_O``, ``mlp.c_proj``) get std
        ``0.02 / sqrt(2 n_layer)`` so that the stream's variance does not grow with depth. Draws
        from ``generator`` (on the parameters' device), or from torch's global generator
        (seed it with ``torch.manual_seed``) when that is ``None``."""
        residual_std = INIT_STD / math.sqrt(2 * self.config.n_layer)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, INIT_STD, generator=generator)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                module.reset_parameters()
            elif isinstance(module, PReLU) and self.config.prelu_init == "constant":
                nn.init.constant_(module.weight, PRELU_CONSTANT)  # nn.PReLU's default slope
            elif isinstance(module, PReLU):
                nn.init.normal_(module.weight, PRELU_PAPER_MEAN, PRELU_PAPER_STD,
                                generator=generator)
            elif isinstance(module, MultiHeadAttention):
                for name, p in module.named_parameters():
                    if name.startswith("b_"):
                        nn.init.zeros_(p)
                    else:
                        nn.init.normal_(p, 0.0, residual_std if name == "W_O" else INIT_STD,
                                        generator=generator)
        for block in self.blocks:
            nn.init.normal_(block.mlp.c_proj.weight, 0.0, residual_std, generator=generator)

    def num_params(self) -> int:
        """Number of scalars in the parameters, trainable or not (the tied embedding counted
        once)."""
        return sum(p.numel() for p in self.parameters())

    def draw_biases(self, generator: torch.Generator | None = None):
        """One training draw of every layer's symmetry-breaking biases, ``(b_Q [L, d_head],
        b_V [L, d_value] or None)``, from ``generator``; ``None`` for a symmetric model. Passed
        as ``forward(..., bias_draws=...)``, it replaces the draws the layers would make."""
        layers = [block.breaking for block in self.blocks]
        if layers[0] is None:
            return None
        draws = [layer.sample(generator) for layer in layers]
        values = None if draws[0][1] is None else torch.stack([v for _, v in draws])
        return torch.stack([q for q, _ in draws]), values

    def gpt2_tensors(self) -> list[list[str]]:
        """Names of this model's parameters grouped as GPT-2's own tensors: in each layer the
        query, key and value weights of all heads are one fused ``c_attn.weight``, their biases
        one ``c_attn.bias``; every other parameter is a tensor of its own (the tied embedding
        once). The partition of ECD's per-tensor projection in the paper's code."""
        fused = {f"blocks.{i}.attn.{kind}_{x}": (i, kind) for i in range(self.config.n_layer)
                 for kind in ("W", "b") for x in "QKV"}
        groups: dict = {}
        for name, _ in self.named_parameters():
            groups.setdefault(fused.get(name, name), []).append(name)
        return list(groups.values())

    def _check_tokens(self, idx: torch.Tensor, targets: torch.Tensor | None) -> None:
        """Token ids in ``[0, vocab_size)``, a non-empty batch; targets in the same range or
        ``-100`` (ignored), some target not ignored. The value checks are skipped where
        :func:`_host_reads_allowed` says no."""
        if idx.numel() == 0:
            raise ValueError(f"empty batch: idx has shape {tuple(idx.shape)}")
        for name, ids in (("idx", idx), ("targets", targets)):
            if ids is not None:
                check_integer_dtype(name, ids, "token ids")
        if targets is not None and targets.dtype != torch.long:
            raise ValueError(f"targets must be torch.long (the cross-entropy's index type), got "
                             f"{targets.dtype}: pass targets.long()")
        if not _host_reads_allowed(idx):
            return
        V = self.config.vocab_size
        low, high = int(idx.min()), int(idx.max())
        if low < 0 or high >= V:
            raise ValueError(f"token ids must lie in [0, {V}), got [{low}, {high}]")
        if targets is None:
            return
        counted = targets != -100
        if not bool(counted.any()):
            raise ValueError("every target is -100 (ignored): the mean loss has no terms")
        if bool((counted & ((targets < 0) | (targets >= V))).any()):
            kept = targets[counted]
            raise ValueError(f"targets must lie in [0, {V}) or be -100 (ignored), got "
                             f"[{int(kept.min())}, {int(kept.max())}] among the others")

    def _check_bias_draws(self, bias_draws) -> None:
        """ValueError unless ``bias_draws`` is ``(b_Q [n_layer, head_size], b_V)`` with ``b_V``
        of the same shape exactly when ``symmetry_breaking`` is ``"bqv"``, else ``None``: what
        :meth:`draw_biases` returns."""
        mode = self.config.symmetry_breaking
        if mode is None:
            raise ValueError("bias_draws given to a symmetric model (symmetry_breaking=None)")
        if not isinstance(bias_draws, (tuple, list)) or len(bias_draws) != 2:
            raise ValueError(f"bias_draws must be a pair (query draw, value draw or None), as "
                             f"draw_biases returns, got {type(bias_draws).__name__}")
        shape = (self.config.n_layer, self.config.head_size)
        for name, draw, needed in zip(("query", "value"), bias_draws, (True, mode == "bqv")):
            if not needed:
                if draw is not None:
                    raise ValueError(f"a {mode!r} model has no value bias: its value draw must "
                                     f"be None, got {type(draw).__name__}")
            elif not torch.is_tensor(draw) or tuple(draw.shape) != shape:
                got = tuple(draw.shape) if torch.is_tensor(draw) else draw
                raise ValueError(f"a {mode!r} model needs a {name} draw of shape [n_layer, "
                                 f"head_size] = [{shape[0]}, {shape[1]}], one row per layer "
                                 f"(from draw_biases), got {got!r}")

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, *,
                bias_draws=None):
        """Logits for every position and, with ``targets [B, T]``, the mean cross-entropy.
        ``bias_draws`` (from :meth:`draw_biases`: ``(b_Q [n_layer, head_size], b_V [n_layer,
        head_size])`` for ``"bqv"``, ``(b_Q, None)`` for ``"bq"``) fixes the symmetry-breaking
        biases of this pass."""
        if idx.ndim != 2:
            raise ValueError(f"idx must have shape [B, T], got {tuple(idx.shape)}")
        self._check_tokens(idx, targets)
        T = idx.shape[1]
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size={self.config.block_size}")
        x = self.wte(idx)  # (B, T, D)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(T, device=idx.device))  # (T, D) broadcast over B
        if bias_draws is not None:
            self._check_bias_draws(bias_draws)
        for i, block in enumerate(self.blocks):
            if bias_draws is None:
                x = block(x)
            else:
                query, value = bias_draws
                x = block(x, (query[i], None if value is None else value[i]))
        logits = self.lm_head(self.ln_f(x))  # (B, T, V)
        if targets is None:
            return logits, None
        if targets.shape != idx.shape:
            raise ValueError(f"targets must have the shape of idx {tuple(idx.shape)}, "
                             f"got {tuple(targets.shape)}")
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # (B*T, V) vs (B*T,)
        return logits, loss

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None) -> torch.Tensor:
        """Sample ``max_new_tokens`` tokens after ``idx [B, T]`` (the last ``block_size`` tokens
        are the context); ``top_k >= 1`` keeps only the k most likely tokens. Returns
        ``[B, T + new]``. The model runs in eval mode (mean symmetry-breaking biases, no fresh
        draws per token) and gets its training mode back afterwards."""
        temperature = check_number("temperature", temperature, low=0.0, strict=True)
        if top_k is not None and (type(top_k) is not int or top_k < 1):
            raise ValueError(f"top_k must be None or a positive integer, got {top_k!r}")
        if type(max_new_tokens) is not int or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        with eval_mode(self):
            for _ in range(max_new_tokens):
                logits, _ = self(idx[:, -self.config.block_size:])
                logits = logits[:, -1, :].float() / temperature  # (B, V)
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]  # (B, 1)
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                next_token = torch.multinomial(logits.softmax(-1), num_samples=1)  # (B, 1)
                idx = torch.cat([idx, next_token], dim=1)
        return idx

    @classmethod
    def from_huggingface(cls, hf_model) -> "GPT":
        """Convert a ``transformers`` ``GPT2LMHeadModel`` (weights copied, same dtype).

        ``hf_model`` is the model itself, or what ``GPT2LMHeadModel.from_pretrained`` takes: a
        name on the Hugging Face Hub (``"gpt2"``: downloaded once, then read from the local cache)
        or a directory written by ``save_pretrained``. Offline, a name that is not in the cache
        raises ``OSError`` saying how to get the weights.

        Hugging Face's ``Conv1D`` computes ``x @ weight + bias`` with ``c_attn.weight [D, 3D]``
        holding ``[W_q | W_k | W_v]``, heads contiguous within each; ``c_proj.weight [D, D]`` maps
        the concatenated heads back. Splitting them gives the per-head layout.
        """
        if not isinstance(hf_model, nn.Module):  # a Hub name or a save_pretrained directory
            hf_model = _load_gpt2(hf_model)
        hc = hf_model.config
        expected = dict(activation_function=("gelu_new", "gelu_pytorch_tanh"),
                        n_inner=(None, 4 * hc.n_embd),
                        scale_attn_weights=(True,), scale_attn_by_inverse_layer_idx=(False,),
                        add_cross_attention=(False,), tie_word_embeddings=(True,))
        wrong = [f"{k}={getattr(hc, k)!r} (supported: {v})" for k, v in expected.items()
                 if getattr(hc, k) not in v]
        if wrong:
            raise ValueError("cannot convert this GPT-2: " + "; ".join(wrong))
        config = GPTConfig(hc.vocab_size, hc.n_positions, hc.n_layer, hc.n_head, hc.n_embd,
                           layer_norm_eps=hc.layer_norm_epsilon)
        dtype = hf_model.transformer.wte.weight.dtype
        model = cls(config).to(dtype)
        H, D = config.n_head, config.n_embd
        dk = D // H
        src = hf_model.transformer
        with torch.no_grad():
            model.wte.weight.copy_(src.wte.weight)
            model.wpe.weight.copy_(src.wpe.weight)
            model.ln_f.load_state_dict(src.ln_f.state_dict())
            for block, hf in zip(model.blocks, src.h):
                block.ln_1.load_state_dict(hf.ln_1.state_dict())
                block.ln_2.load_state_dict(hf.ln_2.state_dict())
                W = hf.attn.c_attn.weight.view(D, 3, H, dk).permute(1, 2, 0, 3)  # (3, H, D, dk)
                b = hf.attn.c_attn.bias.view(3, H, dk)  # (3, H, dk)
                a = block.attn
                for i, name in enumerate("QKV"):
                    getattr(a, f"W_{name}").copy_(W[i])
                    getattr(a, f"b_{name}").copy_(b[i])
                a.W_O.copy_(hf.attn.c_proj.weight.view(H, dk, D))  # rows of head h: h*dk..
                a.b_O.copy_(hf.attn.c_proj.bias)
                for name in ("c_fc", "c_proj"):  # Conv1D stores the transpose of nn.Linear
                    getattr(block.mlp, name).weight.copy_(getattr(hf.mlp, name).weight.T)
                    getattr(block.mlp, name).bias.copy_(getattr(hf.mlp, name).bias)
        return model


def _load_gpt2(name_or_path):
    """``GPT2LMHeadModel.from_pretrained(name_or_path)``, with an error that says how to get it."""
    try:
        from transformers import GPT2LMHeadModel
    except ImportError as error:
        raise ImportError("loading GPT-2 weights needs `transformers` (pip install transformers)"
                          ) from error
    try:
        return GPT2LMHeadModel.from_pretrained(name_or_path)
    except OSError as error:  # offline and not cached, no such name, or no such directory
        name = str(name_or_path)
        raise OSError(
            f"cannot load GPT-2 weights {name!r}: {error}\n"
            "To get them, either (1) run once with internet access, e.g. "
            f"`GPT.from_huggingface({name!r})`: the weights stay in the Hugging Face cache "
            "(~/.cache/huggingface, or $HF_HOME) and later runs, offline ones included "
            "(HF_HUB_OFFLINE=1), read them from there; or (2) on a machine with internet access "
            f"run `hf download {name} --local-dir DIR` (or `save_pretrained(DIR)` on a loaded "
            "model), copy DIR here and pass its path: `GPT.from_huggingface(\"DIR\")`."
        ) from error
