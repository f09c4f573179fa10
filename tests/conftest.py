"""Shared fixtures.

``dtype`` runs a test in float32 and float64 (as e3nn's suite does). The group-axiom and
invariance tests of every symmetry (``test_symmetries.py``), the invariance tests of the
attention gauge (``test_gauge.py``) and the layer tests of attention and the mixture of experts
take it, with the round-off allowed by :func:`tolerance`. Tests of quantities the library
defines in float64 only (Jacobian ranks, orbit dimensions, Noether charges, commutants: they cast
to float64 themselves) and tests of training, data and results do not: for those a float32 twin
would test the cast, not the mathematics.

Without CUDA, Triton (where installed) runs in its interpreter: ECD's fused kernels
(:mod:`gaugebook.ecd_kernels`) are then tested on the CPU. The switch must precede Triton's
import, so it is made here, before any test module imports the library.
"""
import importlib
import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """One intra-op thread per test process: the suite runs under ``pytest -n 2`` on two cores,
    and the tiny matrices of these tests only lose from extra threads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(params=[torch.float32, torch.float64], ids=["float32", "float64"])
def dtype(request):
    return request.param


@pytest.fixture
def generator():
    return torch.Generator().manual_seed(1234)


def tolerance(dtype: torch.dtype, cond: float = 10.0) -> float:
    """Relative round-off allowed for a gauge action of condition number ``cond``:
    ``100 * cond * eps`` (chapter 4 measures the constant, which is far below 100)."""
    return 100 * cond * torch.finfo(dtype).eps


def _benchmark(monkeypatch, name: str, *imports: str):
    """``benchmarks/<name>.py`` as a module; it and the benchmark modules it ``imports`` are not
    the library's, so they leave ``sys.modules`` afterwards, pass or fail."""
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "benchmarks"))
    try:
        yield importlib.import_module(name)
    finally:
        for module in (name, *imports):
            sys.modules.pop(module, None)


@pytest.fixture
def bench_grid(monkeypatch):
    """``benchmarks/bench_grid.py`` (which imports ``bench_training``)."""
    yield from _benchmark(monkeypatch, "bench_grid", "bench_training")


@pytest.fixture
def collect_gpu_call(monkeypatch):
    """``benchmarks/collect_gpu_call.py``."""
    yield from _benchmark(monkeypatch, "collect_gpu_call")


def public_names_are_exported(module) -> None:
    """``module.__all__`` lists every class and function the module defines, its constants, and
    nothing imported from elsewhere."""
    defined = {n for n, v in vars(module).items()
               if not n.startswith("_") and getattr(v, "__module__", None) == module.__name__}
    assert defined <= set(module.__all__)
    for name in module.__all__:
        value = getattr(module, name)
        assert not callable(value) or value.__module__ == module.__name__, name
