r"""ECD's device step as two fused Triton kernels (:class:`FusedStep`, used by
:class:`gaugebook.optim.ECD` with ``fused``).

An ECD step needs, per member :math:`r` and parameter :math:`j`, the partial sums
:math:`v_j\cdot g_j`, :math:`g_j\cdot g_j`, :math:`v_j\cdot v_j`, and then updates every scalar:

.. math::
    v \leftarrow s_{rj}\, v - c_{rj}\, g, \qquad \theta \leftarrow \theta + m_{rj}\, v,

with the per-unit coefficients :math:`s = a/|v'|`, :math:`c = \kappa\Delta t/((F - F_0)|v'|)`
and :math:`m = \Delta t\,|v'|` that ECD computes from the sums (a few operations on
``[R, P]`` tensors, on the device). In PyTorch's operators that is about 24 N floats moved for
N scalars (each product materialised, then summed; the kick, the drift's product and its add
each a pass). Here the three sums are one pass that reads v and g once (2 N), and the kick and
drift one more that reads v, g and theta and writes v and theta (5 N): 7 N, as for fused AdamW,
plus the copy of the gradients into one flat buffer (2 N) that the velocity's layout needs.

Both kernels walk the same *pieces*: each parameter's row of each member, in the flat buffers
``[R, N]`` of one dtype, cut into runs of at most :data:`PIECE` columns (one program each, so
that a long embedding keeps many programs busy). The parameters are written through a table of
their addresses (they are separate tensors; the velocity and the gradients are flat), so a
parameter must keep its storage (checked at every step: a moved one rebuilds the table).

Triton compiles them for GPUs; on CPU tensors they run in its interpreter (slowly: for the tests,
which check them against the unfused step), which ``TRITON_INTERPRET=1`` must switch on before
Triton is imported. Without Triton, :data:`AVAILABLE` is false and ECD takes its unfused device
step.
"""
import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

__all__ = ["AVAILABLE", "PIECE", "FusedStep"]

#: Whether Triton is installed (else ECD takes its unfused device step).
AVAILABLE = triton is not None
#: The most columns one program of the kernels walks.
PIECE = 8192
_BLOCK = 1024  # columns per iteration of a program


if AVAILABLE:  # (comments, not docstrings, in the kernels: Triton compiles their bodies)
    # out[i] = (v.g, g.g, v.v) over piece i, summed in float64, reading v and g once
    def _sums_kernel(v_ptr, g_ptr, start_ptr, length_ptr, out_ptr, PIECE: tl.constexpr,
                     BLOCK: tl.constexpr):
        i = tl.program_id(0)
        start = tl.load(start_ptr + i)
        n = tl.load(length_ptr + i)
        vg = tl.zeros([BLOCK], dtype=tl.float64)
        gg = tl.zeros([BLOCK], dtype=tl.float64)
        vv = tl.zeros([BLOCK], dtype=tl.float64)
        for k in range(0, PIECE, BLOCK):  # (static: masked past n)
            cols = k + tl.arange(0, BLOCK)
            inside = cols < n
            v = tl.load(v_ptr + start + cols, mask=inside, other=0.0).to(tl.float64)
            g = tl.load(g_ptr + start + cols, mask=inside, other=0.0).to(tl.float64)
            vg += v * g
            gg += g * g
            vv += v * v
        tl.store(out_ptr + 3 * i, tl.sum(vg, axis=0))
        tl.store(out_ptr + 3 * i + 1, tl.sum(gg, axis=0))
        tl.store(out_ptr + 3 * i + 2, tl.sum(vv, axis=0))

    # over piece i of unit u: v <- s_u v - c_u g, then theta <- theta + m_u v (in float64, stored
    # in the buffers' dtype); theta is the piece's parameter, read from the address table
    def _update_kernel(v_ptr, g_ptr, table_ptr, start_ptr, length_ptr, unit_ptr, param_ptr,
                       offset_ptr, scale_ptr, coef_ptr, drift_ptr, PIECE: tl.constexpr,
                       BLOCK: tl.constexpr):
        i = tl.program_id(0)
        start = tl.load(start_ptr + i)
        n = tl.load(length_ptr + i)
        u = tl.load(unit_ptr + i)
        s = tl.load(scale_ptr + u)
        c = tl.load(coef_ptr + u)
        m = tl.load(drift_ptr + u)
        address = tl.load(table_ptr + tl.load(param_ptr + i))
        theta_ptr = address.to(tl.pointer_type(v_ptr.dtype.element_ty)) + tl.load(offset_ptr + i)
        for k in range(0, PIECE, BLOCK):  # (static: masked past n)
            cols = k + tl.arange(0, BLOCK)
            inside = cols < n
            v = tl.load(v_ptr + start + cols, mask=inside, other=0.0).to(tl.float64)
            g = tl.load(g_ptr + start + cols, mask=inside, other=0.0).to(tl.float64)
            kicked = s * v - c * g
            tl.store(v_ptr + start + cols, kicked.to(v_ptr.dtype.element_ty), mask=inside)
            theta = tl.load(theta_ptr + cols, mask=inside, other=0.0).to(tl.float64)
            tl.store(theta_ptr + cols, (theta + m * kicked).to(v_ptr.dtype.element_ty),
                     mask=inside)


class _Pieces:
    """The pieces of one dtype's flat buffers ``[R, N]``, as int64 device tables (one entry per
    piece): ``start`` (in the flattened buffer), ``length``, ``unit`` (``r P + j``, the index of
    its coefficients in ``[R, P]``), ``param`` (``j``) and ``offset`` (its first scalar within
    the parameter, ``r n_j + column``); ``counts`` pieces per unit, in the pieces' order, whose
    units are ``units``."""

    def __init__(self, idx: list[int], sizes: list[int], R: int, P: int, piece: int, device):
        columns = sum(sizes[j] for j in idx)
        table = {key: [] for key in ("start", "length", "unit", "param", "offset")}
        counts, units = [], []
        for r in range(R):
            column = 0
            for j in idx:
                n = sizes[j]
                cuts = range(0, max(n, 1), piece)  # an empty parameter: one empty piece
                for first in cuts:
                    table["start"].append(r * columns + column + first)
                    table["length"].append(min(piece, n - first))
                    table["unit"].append(r * P + j)
                    table["param"].append(j)
                    table["offset"].append(r * n + first)
                counts.append(len(cuts))
                units.append(r * P + j)
                column += n
        for key, values in table.items():
            setattr(self, key, torch.tensor(values, dtype=torch.int64, device=device))
        self.counts = torch.tensor(counts, dtype=torch.int64, device=device)
        self.units = torch.tensor(units, dtype=torch.int64, device=device)
        self.n = len(table["start"])


class FusedStep:
    """The two kernels over ECD's flat velocity and gradient buffers (one ``[R, N]`` per dtype,
    the parameters ``params`` in the order of their columns within each dtype's buffer,
    ``buckets``: each dtype's parameter indices), for ``R`` members."""

    def __init__(self, params: list[torch.Tensor], buckets: dict[torch.dtype, list[int]],
                 R: int):
        if not AVAILABLE:
            raise RuntimeError("ECD's fused step needs Triton (pip install triton), or take "
                               "the unfused step: ECD(..., fused=False)")
        if not all(p.is_contiguous() for p in params):
            raise ValueError("ECD's fused step writes the parameters in place through their "
                             "addresses: they must be contiguous")
        device = params[0].device
        if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError("on a CPU, ECD's fused kernels run only in Triton's interpreter: "
                               "set TRITON_INTERPRET=1 before importing triton, or take the "
                               "unfused step: ECD(..., fused=False)")
        self.params, self.R, self.device = params, R, device
        self.piece, self.block = PIECE, _BLOCK  # (the tables are cut for these)
        sizes = [p.numel() // R for p in params]
        self.pieces = {dtype: _Pieces(idx, sizes, R, len(params), self.piece, device)
                       for dtype, idx in buckets.items()}
        self._sums, self._update = triton.jit(_sums_kernel), triton.jit(_update_kernel)
        self._addresses: list[int] = []
        self._table = self._parameter_table()  # (here: a copy to the device waits for it)

    def _parameter_table(self) -> torch.Tensor:
        """The parameters' addresses on the device (rebuilt only if one has moved)."""
        addresses = [p.data_ptr() for p in self.params]
        if addresses != self._addresses:
            self._table = torch.tensor(addresses, dtype=torch.int64, device=self.device)
            self._addresses = addresses
        return self._table

    def sums(self, velocity: dict, grads: dict) -> torch.Tensor:
        """``[3, R, P]`` float64: v.g, g.g and v.v per member and parameter, from the flat
        buffers ``{dtype: [R, N]}``."""
        out = torch.zeros(self.R * len(self.params), 3, dtype=torch.float64,
                          device=self.device)
        for dtype, pieces in self.pieces.items():
            partial = torch.empty(pieces.n, 3, dtype=torch.float64, device=self.device)
            self._sums[(pieces.n,)](velocity[dtype], grads[dtype], pieces.start,
                                    pieces.length, partial, PIECE=self.piece,
                                    BLOCK=self.block)
            per_unit = torch.segment_reduce(partial, "sum", lengths=pieces.counts, axis=0,
                                            unsafe=True)  # (unchecked: no read to the host)
            out.index_copy_(0, pieces.units, per_unit)
        return out.T.reshape(3, self.R, len(self.params))

    def update(self, velocity: dict, grads: dict, scale: torch.Tensor, coef: torch.Tensor,
               drift: torch.Tensor) -> None:
        """``v <- scale v - coef g`` and ``theta <- theta + drift v``, with the coefficients
        ``[R, P]`` (float64) per member and parameter."""
        table = self._parameter_table()
        scale, coef, drift = (t.contiguous() for t in (scale, coef, drift))
        for dtype, pieces in self.pieces.items():
            self._update[(pieces.n,)](velocity[dtype], grads[dtype], table, pieces.start,
                                      pieces.length, pieces.unit, pieces.param, pieces.offset,
                                      scale, coef, drift, PIECE=self.piece,
                                      BLOCK=self.block)
