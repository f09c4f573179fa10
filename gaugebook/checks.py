"""Validation of scalar hyper-parameters, one wording for every module that takes them."""
from __future__ import annotations

import math

__all__ = ["check_number", "check_finite"]


def check_number(name: str, value, *, low: float, strict: bool) -> float:
    """``value`` as a finite float ``> low`` (``strict``) or ``>= low``; ValueError otherwise."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number, got {value!r}") from None
    if not math.isfinite(x) or (x <= low if strict else x < low):
        relation = ">" if strict else ">="
        raise ValueError(f"{name} must be finite and {relation} {low:g}, got {value!r}")
    return x


def check_finite(name: str, value) -> float:
    """``value`` as a finite float; ValueError otherwise."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        x = math.nan
    if not math.isfinite(x):
        raise ValueError(f"{name} must be a finite real number, got {value!r}")
    return x
