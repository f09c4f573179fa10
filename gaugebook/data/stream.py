"""What every stream of the data package shares: the seed spaces of its splits, the batch
type, argument checks and the move to a device."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

__all__ = ["SPLITS", "Batch", "stream_rng", "check_stream_args", "to_device"]

# The first word of every stream's seed: disjoint seed spaces, so that no validation, probe or
# text row is a training row.
SPLITS = {"train": 0, "val": 1, "probe": 2, "text": 3}


class Batch(NamedTuple):
    """``inputs`` and next-token ``targets`` ``[B, T]`` (int64); ``categories [B, T]`` (uint8,
    :class:`Category` of each input token; ``None`` for real text)."""

    inputs: torch.Tensor
    targets: torch.Tensor
    categories: torch.Tensor | None


def stream_rng(split: str, seed: int, *key: int) -> np.random.Generator:
    """The generator of one block of ``split``'s stream: a pure function of the split's seed
    space, the seed and ``key`` (rank and index, or task)."""
    return np.random.default_rng(np.random.SeedSequence([SPLITS[split], seed, *key]))


def check_stream_args(*, n, length, seed, index, rank, split) -> None:
    """ValueError unless the sizes, seed, index and rank are integers in range and ``split`` is
    one of :data:`SPLITS`."""
    for name, value, low in (("batch size", n, 1), ("length", length, 2), ("seed", seed, 0),
                             ("start index", index, 0), ("rank", rank, 0)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {tuple(SPLITS)}, got {split!r}")


def to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """``array`` as a tensor on ``device`` (through pinned memory, asynchronously, to a GPU)."""
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)
