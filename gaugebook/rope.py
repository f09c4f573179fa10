"""Rotary position embedding (RoPE) in the half-split convention of GPT-NeoX and LLaMA.

The first ``rotary_dim`` coordinates of a head are paired as planes ``(i, i + rotary_dim/2)``;
plane ``i`` turns by the angle ``t * theta_i`` at position ``t``, with
``theta_i = base^{-2i / rotary_dim}``. Coordinates beyond ``rotary_dim`` pass through unrotated
(partial rotary). With row vectors, ``q_t -> q_t R_t`` and ``q_t R_t (k_s R_s)^T = q_t R_{t-s} k_s^T``:
scores depend on the relative position only.
"""
from __future__ import annotations

import math

import torch


def check_rotary_dim(d_head: int, rotary_dim) -> int:
    """``rotary_dim``, checked to be an even integer in ``(0, d_head]``: the rotated coordinates
    pair up as planes, and a head has only ``d_head`` of them. ValueError otherwise."""
    if not (isinstance(rotary_dim, int) and not isinstance(rotary_dim, bool)
            and 0 < rotary_dim <= d_head and rotary_dim % 2 == 0):
        raise ValueError(f"rotary_dim must be a positive even number at most d_head={d_head}, "
                         f"got {rotary_dim!r}")
    return rotary_dim


def rope_frequencies(rotary_dim: int, base: float = 10000.0, *,
                     dtype=torch.float64) -> torch.Tensor:
    """Angular frequencies ``theta_i = base^{-2i/rotary_dim}``, ``i < rotary_dim/2``: shape
    ``[rotary_dim/2]``."""
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be a positive even number, got {rotary_dim}")
    if not 0 < base < math.inf:  # (NaN fails too)
        raise ValueError(f"RoPE base must be positive and finite, got {base}")
    i = torch.arange(rotary_dim // 2, dtype=torch.float64)
    return (base ** (-2.0 * i / rotary_dim)).to(dtype)


def rotate(x: torch.Tensor, positions: torch.Tensor, frequencies: torch.Tensor) -> torch.Tensor:
    """Apply ``R_t`` to the leading ``2 * len(frequencies)`` coordinates of ``x [..., T, d]``.

    ``positions [T]``; plane ``(i, i + r/2)`` maps ``(a, b) -> (a cos - b sin, a sin + b cos)``.
    """
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
    """The matrix ``R_t [d_head, d_head]`` with ``rotate(x) == x @ R_t`` (row-vector convention)."""
    half = frequencies.numel()
    R = torch.eye(d_head, dtype=frequencies.dtype)
    c, s = torch.cos(position * frequencies), torch.sin(position * frequencies)
    i = torch.arange(half)
    R[i, i], R[i + half, i + half] = c, c
    R[i, i + half], R[i + half, i] = s, -s
    return R
