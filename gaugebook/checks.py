"""Validation of scalar hyper-parameters, one wording for every module that takes them."""
from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

__all__ = ["check_number", "check_finite", "check_positive_ints", "check_bool",
           "check_float_dtype", "check_integer_dtype", "check_finite_tensors",
           "dataclass_from_dict"]


def _real(value) -> float:
    """``float(value)`` of a real number (a Python, NumPy or 0-d tensor scalar); NaN for
    anything else, strings and bools included (``float`` takes ``"0.5"`` and ``True``)."""
    if isinstance(value, (str, bytes, bool)):
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def check_number(name: str, value, *, low: float, strict: bool) -> float:
    """``value`` as a finite float ``> low`` (``strict``) or ``>= low``; ValueError otherwise
    (also for a string or a bool)."""
    x = _real(value)
    if not math.isfinite(x) or (x <= low if strict else x < low):
        relation = ">" if strict else ">="
        raise ValueError(f"{name} must be finite and {relation} {low:g}, got {value!r}")
    return x


def check_positive_ints(**sizes) -> None:
    """ValueError naming the first of ``sizes`` (name=value) that is not a positive ``int``;
    ``True``, ``2.0`` or a NumPy integer are not ``int``."""
    for name, value in sizes.items():
        if type(value) is not int or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def check_bool(name: str, value, *, optional: bool = False) -> None:
    """ValueError unless ``value`` is ``True`` or ``False`` (or ``None`` when ``optional``): a
    switch. ``1`` and ``"no"`` are refused, though ``1 == True`` and ``"no"`` is truthy."""
    if not (isinstance(value, bool) or (optional and value is None)):
        allowed = "None, True or False" if optional else "True or False"
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


def check_float_dtype(dtype) -> None:
    """ValueError unless ``dtype`` is ``None`` (the default dtype) or a floating-point dtype: the
    dtype of a layer's parameters, which must carry gradients. TypeError for what is not a
    ``torch.dtype`` (e.g. the string ``"float64"``)."""
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, e.g. torch.float64, got {dtype!r}")
    if dtype is not None and not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point dtype, got {dtype}")


def check_integer_dtype(name: str, t: torch.Tensor, what: str, note: str = "") -> None:
    """ValueError unless the tensor ``t`` holds integers (not floats, complex numbers or bools):
    ``"{name} must hold integer {what}, got dtype ..."`` with ``note`` appended."""
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer {what}, got dtype {t.dtype}{note}")


def check_finite(name: str, value) -> float:
    """``value`` as a finite float; ValueError otherwise (also for a string or a bool)."""
    x = _real(value)
    if not math.isfinite(x):
        raise ValueError(f"{name} must be a finite real number, got {value!r}")
    return x


def check_finite_tensors(module: nn.Module, *inputs) -> None:
    """ValueError naming the first parameter of ``module``, or the first tensor among ``inputs``,
    that holds a NaN or an infinity, or the first buffer that holds a NaN (an infinite buffer
    can be a mask: ``-inf`` above a causal diagonal). A non-finite weight can hide: the fused
    CPU attention kernel turns NaN scores into finite outputs, so a gauge check on such a model
    would measure nothing."""
    for name, t in module.named_parameters():
        if t.is_floating_point() and not torch.isfinite(t).all():
            raise ValueError(f"parameter {name} of {type(module).__name__} is not finite")
    for name, t in module.named_buffers():
        if t.is_floating_point() and torch.isnan(t).any():
            raise ValueError(f"buffer {name} of {type(module).__name__} holds a NaN")
    for i, t in enumerate(inputs):
        if torch.is_tensor(t) and t.is_floating_point() and not torch.isfinite(t).all():
            raise ValueError(f"input {i} (shape {tuple(t.shape)}) is not finite")


def dataclass_from_dict(cls: type, values: dict):
    """``cls(**values)`` for a dataclass ``cls`` (a config read back from JSON), with a
    ValueError naming every unknown key and every missing required one."""
    fields = dataclasses.fields(cls)
    valid = [f.name for f in fields]
    unknown = sorted(set(values) - set(valid))
    if unknown:
        raise ValueError(f"unknown {cls.__name__} keys {unknown}; valid keys are {valid}")
    missing = [f.name for f in fields if f.name not in values and f.init
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ValueError(f"{cls.__name__} is missing required keys {missing}")
    return cls(**values)
