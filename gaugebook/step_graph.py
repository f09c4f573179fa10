"""A whole training step (forward, backward and the optimizer's update) recorded once as a CUDA
graph and replayed: one launch per step instead of hundreds, so that a small model's step is
bound by the device and not by the Python that launches its kernels."""
from __future__ import annotations

import gc
import sys
import warnings
from typing import Callable

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

__all__ = ["CapturedStep"]


class CapturedStep:
    """``step(*inputs) -> tensor`` on CUDA ``device``, replayed as a CUDA graph; ``inputs`` are
    tensors, or tuples and lists of tensors and ``None``, of the same shapes at every call.

    The first ``warmup`` calls run ``step`` on a side stream: they are real steps, and they make
    the lazy initialisations (torch.compile's compilation, an optimizer's state, cuBLAS's
    workspace) that a capture must not see; the last of them runs with synchronisations made
    errors, so that a step which reads a value to the host fails there, with a traceback to the
    read. The next call copies its inputs into static buffers, records the graph and replays it;
    every later call copies its inputs in and replays. So ``step`` must launch the same kernels
    on the same tensors at every call after the warmup and read nothing to the host (an
    optimizer's step counts and checks stay on the device). The returned tensor is the graph's
    own output, overwritten by the next replay: copy what is kept.
    """

    def __init__(self, step: Callable[..., torch.Tensor], device: torch.device | str,
                 warmup: int = 3, label: str = "step"):
        if warmup < 1:
            raise ValueError(f"warmup must be >= 1 (lazy initialisations happen outside the "
                             f"capture), got {warmup}")
        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {self.device}")
        self.step, self.warmup, self.label = step, warmup, label
        self.calls = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self._static: list | None = None  # the input leaves the graph reads
        self._spec, self._absent = None, None  # the inputs' structure, and where None is
        self._output: torch.Tensor | None = None

    def __call__(self, *inputs) -> torch.Tensor:
        self.calls += 1
        leaves, spec = tree_flatten(inputs)
        with torch.cuda.device(self.device):
            if self.graph is not None:
                if spec != self._spec or [t is None for t in leaves] != self._absent:
                    raise ValueError(f"{self.label}: the inputs differ in structure from those "
                                     "the graph was captured with")
                for buffer, value in zip(self._static, leaves):
                    if buffer is not None:
                        if value.shape != buffer.shape or value.dtype != buffer.dtype:
                            raise ValueError(  # (a copy would broadcast or convert silently)
                                f"{self.label}: an input of shape {tuple(value.shape)}, "
                                f"{value.dtype} replaces one captured as "
                                f"{tuple(buffer.shape)}, {buffer.dtype}")
                        buffer.copy_(value, non_blocking=True)
                self.graph.replay()
                return self._output
            if self.calls <= self.warmup:
                return self._warm_up(inputs, last=self.calls == self.warmup)
            return self._capture(leaves, spec)

    def _warm_up(self, inputs, last: bool) -> torch.Tensor:
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream())
        mode = torch.cuda.get_sync_debug_mode()
        with torch.cuda.stream(side), warnings.catch_warnings():
            # (an optimizer built to be captured warns when it steps uncaptured)
            warnings.filterwarnings("ignore", "This instance was constructed with capturable")
            if last:
                torch.cuda.set_sync_debug_mode("error")
            try:
                output = self.step(*inputs)
            except RuntimeError as error:
                if last and "synchronizing" in str(error):
                    raise RuntimeError(f"{self.label} reads a value to the host, which a CUDA "
                                       f"graph cannot replay ({error}): train without "
                                       "cuda_graphs") from error
                raise
            finally:
                torch.cuda.set_sync_debug_mode(mode)
        torch.cuda.current_stream().wait_stream(side)
        return output

    def _capture(self, leaves, spec) -> torch.Tensor:
        self._spec, self._absent = spec, [t is None for t in leaves]
        self._static = [t.clone() if isinstance(t, torch.Tensor) else None for t in leaves]
        static = tree_unflatten([t if b is None else b for t, b in zip(leaves, self._static)], spec)
        graph = torch.cuda.CUDAGraph()
        gc.collect()  # (a graph left in a reference cycle must not be freed during the capture)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            # thread_local: the data loader's pinning thread may call CUDA meanwhile
            try:
                with torch.cuda.graph(graph, stream=torch.cuda.Stream(self.device),
                                      capture_error_mode="thread_local"):
                    self._output = self.step(*static)
            except RuntimeError as error:  # (the cause, if another, is chained below)
                raise RuntimeError(f"{self.label} could not be captured as a CUDA graph "
                                   f"({error}): train without cuda_graphs") from error
        if any("CUDA Graph is empty" in str(w.message) for w in caught):  # kernels elsewhere
            raise RuntimeError(f"{self.label}: the captured CUDA graph is empty (the step ran "
                               f"on a device other than {self.device}?)")
        for w in caught:  # the others, as they were
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        self.graph = graph
        print(f"{self.label}: captured as a CUDA graph at call {self.calls}", file=sys.stderr)
        graph.replay()
        return self._output
