r"""Rotary position embedding (RoPE) in the half-split convention of GPT-NeoX and LLaMA.

The first :math:`r` = ``rotary_dim`` coordinates of a head are paired as planes
:math:`(i, i + r/2)`; plane :math:`i` turns by the angle :math:`t \theta_i` at position :math:`t`,
with :math:`\theta_i = b^{-2i/r}` (:math:`b` the ``base``). Coordinates beyond ``rotary_dim`` pass
through unrotated (partial rotary). With row vectors, :math:`q_t \to q_t R_t` and
:math:`q_t R_t (k_s R_s)^\top = q_t R_{t-s} k_s^\top`: scores depend on the relative position
only.
"""
from __future__ import annotations

import math

import torch

__all__ = ["rope_frequencies", "rotate", "rotation_matrix", "check_rotary_dim"]


def _positive_even_int(value) -> bool:
    """Whether ``value`` is an ``int`` (not a bool, not ``4.0``), positive and even."""
    return type(value) is int and value > 0 and value % 2 == 0


def check_rotary_dim(d_head: int, rotary_dim) -> int:
    r"""``rotary_dim``, checked to be an even integer in :math:`(0, d_\text{head}]`: the rotated
    coordinates pair up as planes, and a head has only ``d_head`` of them. ValueError otherwise."""
    if not (_positive_even_int(rotary_dim) and rotary_dim <= d_head):
        raise ValueError(f"rotary_dim must be a positive even number at most d_head={d_head}, "
                         f"got {rotary_dim!r}")
    return rotary_dim


def rope_frequencies(rotary_dim: int, base: float = 10000.0, *,
                     dtype=torch.float64) -> torch.Tensor:
    r"""Angular frequencies :math:`\theta_i = b^{-2i/r}`, :math:`i < r/2` (:math:`b` = ``base``,
    :math:`r` = ``rotary_dim``): shape ``[rotary_dim/2]``."""
    if not _positive_even_int(rotary_dim):
        raise ValueError(f"rotary_dim must be a positive even integer, got {rotary_dim!r}")
    if not 0 < base < math.inf:  # (NaN fails too)
        raise ValueError(f"RoPE base must be positive and finite, got {base}")
    i = torch.arange(rotary_dim // 2, dtype=torch.float64)
    return (base ** (-2.0 * i / rotary_dim)).to(dtype)


def rotate(x: torch.Tensor, positions: torch.Tensor, frequencies: torch.Tensor) -> torch.Tensor:
    r"""Apply :math:`R_t` to the leading ``2 * len(frequencies)`` coordinates of ``x [..., T, d]``.

    ``positions [T]``, one per token of ``x`` (or ``[1]``, one for all); ``frequencies [r/2]``
    (:func:`rope_frequencies`); returns ``[..., T, d]``. With :math:`\phi = t \theta_i`, plane
    :math:`(i, i + r/2)` maps
    :math:`(a, b) \mapsto (a \cos\phi - b \sin\phi,\ a \sin\phi + b \cos\phi)`.
    """
    if x.ndim < 2 or positions.shape not in (x.shape[-2:-1], (1,)):
        raise ValueError(f"positions must be [T], one per token of x [..., T, d] (or [1]): got "
                         f"positions of shape {tuple(positions.shape)} for x of shape "
                         f"{tuple(x.shape)}")
    half = frequencies.numel()
    if 2 * half > x.shape[-1]:
        raise ValueError(f"{half} frequencies rotate {2 * half} coordinates, more than the "
                         f"{x.shape[-1]} of x (at most d / 2 frequencies)")
    dtype = torch.promote_types(frequencies.dtype, torch.float32)  # bfloat16 rounds 257 to 256
    angles = positions.to(dtype)[:, None] * frequencies.to(dtype)[None, :]  # [T, r/2]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    a, b, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    return torch.cat([a * cos - b * sin, a * sin + b * cos, rest], dim=-1)


def rotation_matrix(position: float, frequencies: torch.Tensor, d_head: int) -> torch.Tensor:
    """The matrix :math:`R_t` ``[d_head, d_head]`` with ``rotate(x) == x @ R_t`` (row-vector
    convention)."""
    half = frequencies.numel()
    if 2 * half > d_head:
        raise ValueError(f"{half} frequencies rotate {2 * half} coordinates, more than "
                         f"d_head={d_head} (at most d_head / 2 frequencies)")
    R = torch.eye(d_head, dtype=frequencies.dtype, device=frequencies.device)
    c, s = torch.cos(position * frequencies), torch.sin(position * frequencies)
    i = torch.arange(half, device=frequencies.device)
    R[i, i], R[i + half, i + half] = c, c
    R[i, i + half], R[i + half, i] = s, -s
    return R
