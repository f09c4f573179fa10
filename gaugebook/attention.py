r"""Multi-head attention with per-head weights: MHA, GQA, MQA, RoPE and gated RoPE.

Weights use the per-head layout of TransformerLens, activations multiply from the right::

    q_h = x W_Q[h] + b_Q[h]                 # [B, T, d_head]
    k_g = x W_K[g] + b_K[g],  v_g = x W_V[g] + b_V[g]   # g = kv_group(h) = h // (n_heads / n_kv_heads)
    A_h = softmax(q_h k_g^T / sqrt(d_head) + causal mask)
    out = sum_h A_h v_g W_O[h] + b_O         # [B, T, d_model]

With ``rope=True`` queries and keys are rotated (see :mod:`gaugebook.rope`). With
``rope="gated"`` the rotated queries and keys are also multiplied coordinate-wise by learned,
input-dependent gates :math:`2 \operatorname{sigmoid}(x W_G)`: the book's concrete instance of
the source's gated RoPE :math:`q' = G_t R_t q`. Because a coordinate-wise gate does not commute
with the rotation inside a plane, it shrinks the QK gauge group (chapter 5).
"""
from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from gaugebook.checks import check_bool, check_float_dtype, check_positive_ints
from gaugebook.rope import check_rotary_dim, rope_frequencies, rotate

__all__ = ["MultiHeadAttention", "math_attention", "check_rope_mode", "ROPE_MODES"]

ROPE_MODES = (False, True, "gated")


def check_rope_mode(rope) -> None:
    """ValueError unless ``rope`` is one of ``ROPE_MODES`` itself (``1`` or ``0`` is not)."""
    if type(rope) not in (bool, str) or rope not in ROPE_MODES:
        raise ValueError(f"rope must be one of {ROPE_MODES}, got {rope!r}")


def math_attention():
    """A context in which :func:`~torch.nn.functional.scaled_dot_product_attention` takes the
    math kernel, the one whose ``torch.func`` rules (vmap, forward mode, double backward) hold
    on every device. Every function transform of attention in the library runs inside it. The
    fused CPU kernels lack these rules; on an H200 (torch 2.11) the fused kernels' vmap rules
    failed: cuDNN's raised a TypeError under ``torch.compile``, the memory-efficient kernel's
    backward pass a misaligned log-sum-exp, and uncompiled the gradients were not finite."""
    return sdpa_kernel(SDPBackend.MATH)


class MultiHeadAttention(nn.Module):
    r"""Causal (or bidirectional) multi-head attention with grouped key/value heads.

    The forward pass uses ``torch.nn.functional.scaled_dot_product_attention``. Its fused CPU
    kernel does not propagate a NaN score: a NaN or infinity in ``W_Q`` or ``W_K`` can leave the
    output finite (and wrong). The library's analyses refuse non-finite weights
    (:func:`gaugebook.checks.check_finite_tensors`); the trainer checks every parameter at each
    evaluation.

    Args:
        d_model: width of the residual stream.
        n_heads: number of query heads.
        d_head: width of a query/key head (:math:`d_k`).
        n_kv_heads: number of key/value heads; ``n_heads`` (default) is MHA, ``1`` is MQA.
        d_value: width of a value head (:math:`d_v`); defaults to ``d_head``.
        bias: add learned biases ``b_Q, b_K, b_V, b_O``.
        rope: ``False``, ``True`` or ``"gated"``.
        rope_base: RoPE base (10000 as in Su et al. 2021), finite and greater than 1 so that the
            frequencies :math:`\theta_i \in (0, 1]` are distinct (the gauge counts assume it).
        rotary_dim: number of rotated coordinates per head (partial rotary); defaults to ``d_head``;
            only with ``rope``.
        causal: mask future positions.
        dtype, device: of the parameters, as for ``torch.nn`` layers.
        generator: draws the initial parameters (on the CPU, then copied to ``device``).
    """

    def __init__(self, d_model: int, n_heads: int, d_head: int, *, n_kv_heads: int | None = None,
                 d_value: int | None = None, bias: bool = False, rope: bool | str = False,
                 rope_base: float = 10000.0, rotary_dim: int | None = None, causal: bool = True,
                 dtype: torch.dtype | None = None, device: torch.device | str | None = None,
                 generator: torch.Generator | None = None):
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        d_value = d_head if d_value is None else d_value
        check_positive_ints(d_model=d_model, n_heads=n_heads, d_head=d_head,
                            n_kv_heads=n_kv_heads, d_value=d_value)
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads={n_heads} is not divisible by n_kv_heads={n_kv_heads}")
        check_rope_mode(rope)
        check_float_dtype(dtype)
        check_bool("causal", causal)
        if rotary_dim is not None and not rope:
            raise ValueError(f"rotary_dim={rotary_dim} needs rope=True or \"gated\", "
                             f"got rope={rope!r}")
        # then theta_i in (0, 1] are distinct, as the counts assume (inf gives 1, 0, 0, ...)
        if rope and not (isinstance(rope_base, numbers.Real) and 1 < rope_base < math.inf):
            raise ValueError(f"rope_base must be greater than 1 and finite, got {rope_base!r}")
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_head
        self.n_kv_heads, self.d_value, self.causal = n_kv_heads, d_value, causal
        self.rope, self.rope_base = rope, rope_base
        self.rotary_dim = (check_rotary_dim(d_head, d_head if rotary_dim is None else rotary_dim)
                           if rope else 0)

        def weight(*shape):
            return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device))

        self.W_Q = weight(n_heads, d_model, d_head)
        self.W_K = weight(n_kv_heads, d_model, d_head)
        self.W_V = weight(n_kv_heads, d_model, d_value)
        self.W_O = weight(n_heads, d_value, d_model)
        if bias:
            self.b_Q, self.b_K = weight(n_heads, d_head), weight(n_kv_heads, d_head)
            self.b_V, self.b_O = weight(n_kv_heads, d_value), weight(d_model)
        else:
            self.register_parameter("b_Q", None), self.register_parameter("b_K", None)
            self.register_parameter("b_V", None), self.register_parameter("b_O", None)
        if rope == "gated":
            self.W_GQ = weight(n_heads, d_model, d_head)
            self.W_GK = weight(n_kv_heads, d_model, d_head)
        if rope:
            freqs = rope_frequencies(self.rotary_dim, rope_base, dtype=torch.float64)
            self.register_buffer("rope_freqs", freqs.to(device), persistent=False)
        self.reset_parameters(generator)

    @classmethod
    def from_torch(cls, mha: nn.MultiheadAttention, *,
                   causal: bool = True) -> "MultiHeadAttention":
        r"""The layer of a ``torch.nn.MultiheadAttention`` with its weights stored per head.

        Torch fuses the heads: ``in_proj_weight [3E, E]`` holds the query, key and value rows,
        head ``h`` at rows :math:`h d_k` to :math:`(h + 1) d_k` of each, and ``out_proj.weight
        [E, E]`` reads head ``h`` from those columns. Here ``W_Q[h]`` is the transpose of
        head ``h``'s query rows, ``W_O[h]`` of its output columns, and so on; the biases follow.
        For ``x [B, T, E]``, ``layer(x)`` equals ``mha(x, x, x, need_weights=False)[0]``
        (batch-first; sequence-first transposed) with a causal ``attn_mask`` when ``causal``,
        in eval mode (torch's attention dropout is not carried over). Layers with ``kdim`` or
        ``vdim`` other than ``E``, ``add_bias_kv`` or ``add_zero_attn`` have no per-head form here
        and are refused.
        """
        if not isinstance(mha, nn.MultiheadAttention):
            raise TypeError(f"expected a torch.nn.MultiheadAttention, got {type(mha).__name__}")
        if mha.in_proj_weight is None or mha.bias_k is not None or mha.add_zero_attn:
            raise ValueError("from_torch needs kdim = vdim = embed_dim, no add_bias_kv and no "
                             "add_zero_attn")
        E, H, dk = mha.embed_dim, mha.num_heads, mha.head_dim
        bias = mha.in_proj_bias is not None
        w = mha.in_proj_weight.detach()
        layer = cls(E, H, dk, bias=bias, causal=causal, dtype=w.dtype, device=w.device)
        with torch.no_grad():
            W_Q, W_K, W_V = w.view(3, H, dk, E).transpose(-1, -2)  # each (H, E, dk)
            layer.W_Q.copy_(W_Q), layer.W_K.copy_(W_K), layer.W_V.copy_(W_V)
            layer.W_O.copy_(mha.out_proj.weight.detach().view(E, H, dk).permute(1, 2, 0))
            if bias:
                b_Q, b_K, b_V = mha.in_proj_bias.detach().view(3, H, dk)
                layer.b_Q.copy_(b_Q), layer.b_K.copy_(b_K), layer.b_V.copy_(b_V)
                layer.b_O.copy_(mha.out_proj.bias.detach())
        return layer

    def _apply(self, fn, recurse=True):
        r"""Casts and moves (``.to``, ``.half()``, ``.to_empty()``, ...) move ``rope_freqs`` but
        keep its dtype (float64): in bfloat16 the angles :math:`t \theta_i` would be wrong
        already at :math:`t = 257`. A layer made on ``meta`` has no values to move: its
        frequencies are computed again from ``rope_base`` (set frequencies are kept otherwise)."""
        freqs = self.rope_freqs if self.rope else None
        super()._apply(fn, recurse)
        if freqs is not None:
            if freqs.is_meta:
                freqs = rope_frequencies(self.rotary_dim, self.rope_base, dtype=torch.float64)
            self.rope_freqs = freqs.to(self.rope_freqs.device)
        return self

    @property
    def has_bias(self) -> bool:
        """Whether the layer has the biases ``b_Q, b_K, b_V, b_O``."""
        return self.b_Q is not None

    @property
    def group_size(self) -> int:
        """Query heads per key/value head, :math:`G` = ``n_heads // n_kv_heads``."""
        return self.n_heads // self.n_kv_heads

    def kv_group(self, head: int | torch.Tensor):
        """Index of the key/value head that query head ``head`` reads."""
        return head // self.group_size

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        r"""Gaussian weights with variance :math:`1/\mathrm{fan}_\text{in}`; biases uniform in
        :math:`\pm 1/\sqrt{\mathrm{fan}_\text{in}}`, so every parameter is generic (no accidental
        zeros). :math:`\mathrm{fan}_\text{in} = n_\text{heads} d_\text{value}` for ``W_O`` and
        :math:`d_\text{model}` for every other parameter, ``b_O`` included (``nn.Linear`` would
        use :math:`n_\text{heads} d_\text{value}` there)."""
        for name, param in self.named_parameters():
            fan_in = self.d_model if name != "W_O" else self.n_heads * self.d_value
            if name.startswith("W_"):
                param.copy_(torch.randn(param.shape, generator=generator, dtype=torch.float64)
                            / math.sqrt(fan_in))
            else:
                u = torch.rand(param.shape, generator=generator, dtype=torch.float64)
                param.copy_((2 * u - 1) / math.sqrt(fan_in))

    def extra_repr(self) -> str:
        """The sizes and options, for ``repr``."""
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, "
                f"d_head={self.d_head}, d_value={self.d_value}, bias={self.has_bias}, "
                f"rope={self.rope!r}, causal={self.causal}")

    def _check_input(self, x: torch.Tensor) -> None:
        """``x [B, T, d_model]`` of the weights' dtype (any float dtype under autocast)."""
        if x.ndim != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"expected input of shape [B, T, d_model={self.d_model}], "
                             f"got {tuple(x.shape)}")
        if x.dtype != self.W_Q.dtype and not (x.is_floating_point()
                                              and torch.is_autocast_enabled(x.device.type)):
            raise ValueError(f"input of dtype {x.dtype} for weights of dtype {self.W_Q.dtype}: "
                             f"cast one to the other (x.to({self.W_Q.dtype}) or layer.to(...))")

    def _check_shift(self, name: str, shift, heads: str, width: str) -> None:
        """ValueError unless ``shift`` is ``None`` or a tensor ``[width]`` (shared by the heads),
        ``[1, width]`` or ``[heads, width]``; ``heads``, ``width`` name attributes of ``self``."""
        if shift is None:
            return
        n, d = getattr(self, heads), getattr(self, width)
        if not torch.is_tensor(shift) or shift.ndim not in (1, 2) or shift.shape[-1] != d \
                or (shift.ndim == 2 and shift.shape[0] not in (1, n)):
            got = tuple(shift.shape) if torch.is_tensor(shift) else type(shift).__name__
            raise ValueError(f"{name} must be a tensor [{width}={d}] (shared by the heads) or "
                             f"[{heads}={n}, {width}={d}], got {got}")

    def project(self, x: torch.Tensor, query_shift=None, value_shift=None):
        """Queries, keys and values (rotated and gated where configured).

        ``query_shift`` and ``value_shift`` are unlearned additive biases, used by
        :mod:`gaugebook.breaking`: ``query_shift [d_head]`` (shared by the heads) or
        ``[n_heads, d_head]``, ``value_shift [d_value]`` or ``[n_kv_heads, d_value]`` (one per
        key/value head; a head dimension of 1 broadcasts). Returns ``q [B, H, T, d_head]``,
        ``k [B, H_kv, T, d_head]``, ``v [B, H_kv, T, d_value]``.
        """
        self._check_input(x)
        self._check_shift("query_shift", query_shift, "n_heads", "d_head")
        self._check_shift("value_shift", value_shift, "n_kv_heads", "d_value")
        q = torch.einsum("btd,hde->bhte", x, self.W_Q)  # (B, H, T, dk)
        k = torch.einsum("btd,gde->bgte", x, self.W_K)  # (B, Hkv, T, dk)
        v = torch.einsum("btd,gde->bgte", x, self.W_V)  # (B, Hkv, T, dv)
        if self.has_bias:  # cast: under bf16 autocast a float32 bias would promote q, k, v to
            # float32 and rule out the fused bf16 attention kernels
            q = q + self.b_Q[:, None].to(q.dtype)
            k = k + self.b_K[:, None].to(k.dtype)
            v = v + self.b_V[:, None].to(v.dtype)
        if query_shift is not None:
            q = q + query_shift.to(q.dtype)[..., None, :]
        if value_shift is not None:
            v = v + value_shift.to(v.dtype)[..., None, :]
        if self.rope:
            positions = torch.arange(x.shape[1], device=x.device)
            freqs = self.rope_freqs.to(x.device)
            q, k = rotate(q, positions, freqs), rotate(k, positions, freqs)
        if self.rope == "gated":
            q = q * 2 * torch.sigmoid(torch.einsum("btd,hde->bhte", x, self.W_GQ))
            k = k * 2 * torch.sigmoid(torch.einsum("btd,gde->bgte", x, self.W_GK))
        return q, k, v

    def attention_pattern(self, x: torch.Tensor, query_shift=None) -> torch.Tensor:
        """Attention probabilities ``A [B, H, T, T]`` (rows sum to one)."""
        q, k, _ = self.project(x, query_shift)
        k = k.repeat_interleave(self.group_size, dim=1)  # (B, H, T, dk)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.d_head)  # (B, H, T, T)
        if self.causal:
            T = x.shape[1]
            future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        return scores.softmax(dim=-1)

    def forward(self, x: torch.Tensor, *, query_shift=None, value_shift=None) -> torch.Tensor:
        """``x [B, T, d_model] -> [B, T, d_model]``."""
        q, k, v = self.project(x, query_shift, value_shift)
        z = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal,
                                           enable_gqa=self.n_kv_heads != self.n_heads)  # (B, H, T, dv)
        out = torch.einsum("bhte,hed->btd", z, self.W_O)  # (B, T, d_model)
        return out + self.b_O.to(out.dtype) if self.has_bias else out
