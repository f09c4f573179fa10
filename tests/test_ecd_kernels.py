"""ECD's fused kernels (gaugebook.ecd_kernels) on their own: the sums and the update against
PyTorch, in Triton's interpreter (on a CPU) or compiled (on a GPU), and compiled for a Hopper GPU
(the H100 and H200 of the GPU calls) on any machine. The optimizer's trajectories through them
are tested in test_optim.py (``fused``)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gaugebook import ecd_kernels

pytestmark = pytest.mark.skipif(not ecd_kernels.AVAILABLE, reason="Triton is not installed")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ROOT = Path(__file__).resolve().parents[1]


def buffers(dtype, R=2, sizes=(15, 20000, 0, 7)):
    """Parameters ``[R, n_j]`` (one empty, one of several pieces), a flat velocity and gradient
    ``[R, N]``, and the fused step over them."""
    torch.manual_seed(0)
    params = [torch.randn(R, n, dtype=dtype, device=DEVICE) for n in sizes]
    v = torch.randn(R, sum(sizes), dtype=dtype, device=DEVICE)
    g = torch.randn(R, sum(sizes), dtype=dtype, device=DEVICE)
    step = ecd_kernels.FusedStep(params, {dtype: list(range(len(sizes)))}, R)
    return params, v, g, step, list(sizes)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
def test_the_sums_are_the_dot_products_per_member_and_parameter(dtype):
    params, v, g, step, sizes = buffers(dtype)
    vg, gg, vv = step.sums({dtype: v}, {dtype: g})
    pairs = list(zip(v.double().split(sizes, 1), g.double().split(sizes, 1)))
    for got, expected in ((vg, [(a * b).sum(1) for a, b in pairs]),
                          (gg, [(b * b).sum(1) for a, b in pairs]),
                          (vv, [(a * a).sum(1) for a, b in pairs])):
        expected = torch.stack(expected, dim=1)
        assert got.dtype == torch.float64 and got.shape == (2, len(sizes))
        assert (got - expected).abs().max() <= 1e-12 * expected.abs().max()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_the_update_kicks_the_velocity_and_moves_the_parameters(dtype):
    params, v, g, step, sizes = buffers(dtype)
    scale, coef, drift = (torch.rand(2, len(sizes), dtype=torch.float64, device=DEVICE)
                          for _ in range(3))
    before, v0 = [p.clone() for p in params], v.clone()
    step.update({dtype: v}, {dtype: g}, scale, coef, drift)
    tol = 1e-14 if dtype == torch.float64 else 1e-6
    for j, (a, b, new) in enumerate(zip(v0.split(sizes, 1), g.split(sizes, 1),
                                        v.split(sizes, 1))):
        if not a.numel():
            continue
        kicked = scale[:, j:j + 1] * a.double() - coef[:, j:j + 1] * b.double()
        assert (new.double() - kicked).abs().max() <= tol * kicked.abs().max()
        moved = before[j].double() + drift[:, j:j + 1] * kicked
        assert (params[j].double() - moved).abs().max() <= tol * moved.abs().max()


def test_a_moved_parameter_is_written_where_it_now_is():
    """The kernels write the parameters through their addresses; a parameter given new storage
    (``p.data = ...``) is found there at the next step."""
    params, v, g, step, sizes = buffers(torch.float64)
    params[1].data = params[1].data.clone()
    before = params[1].clone()
    ones = torch.ones(2, len(sizes), dtype=torch.float64, device=DEVICE)
    step.update({torch.float64: v}, {torch.float64: g}, ones, 0 * ones, ones)
    assert (params[1] - before - v.split(sizes, 1)[1]).abs().max() < 1e-12


# Compiled in a fresh process: in Triton's interpreter (which this one may have switched on
# before Triton's import) its language's own functions are Python, which the compiler refuses.
COMPILE = """
import sys
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from triton.runtime.jit import JITFunction
from gaugebook import ecd_kernels

dtype = sys.argv[1]
tables = {name: "*i64" for name in ("start_ptr", "length_ptr")}
kernels = {
    ecd_kernels._sums_kernel: {"v_ptr": f"*{dtype}", "g_ptr": f"*{dtype}", **tables,
                               "out_ptr": "*fp64"},
    ecd_kernels._update_kernel: {
        "v_ptr": f"*{dtype}", "g_ptr": f"*{dtype}", "table_ptr": "*i64", **tables,
        **{name: "*i64" for name in ("unit_ptr", "param_ptr", "offset_ptr")},
        **{name: "*fp64" for name in ("scale_ptr", "coef_ptr", "drift_ptr")}},
}
constants = {"PIECE": ecd_kernels.PIECE, "BLOCK": ecd_kernels._BLOCK}
for kernel, signature in kernels.items():
    signature |= {name: "constexpr" for name in constants}
    source = ASTSource(JITFunction(kernel), signature, constexprs=constants)
    compiled = compile(source, target=GPUTarget("cuda", 90, 32))
    assert compiled.asm["cubin"] and ".target sm_90" in compiled.asm["ptx"], kernel
print("compiled")
"""


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp64"])
def test_the_kernels_compile_for_a_hopper_gpu(dtype, tmp_path):
    """Triton's interpreter runs Python, not the compiler: both kernels also go through Triton's
    compiler down to a cubin for sm_90 (no GPU needed), so that a GPU call does not meet a
    compilation error first."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # compiled here, not taken from a cache
    done = subprocess.run([sys.executable, "-c", COMPILE, dtype], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "compiled", done.stderr[-3000:]
