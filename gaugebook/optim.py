r"""Energy Conserving Descent (ECD), and the optimizers of the experiment by name (chapters 15-17).

ECD (De Luca & Silverstein 2022; De Luca, Gatti & Silverstein 2023) moves the parameters like a
light ray in a medium whose refractive index grows as the loss falls. In arc length :math:`s`
the continuum equations of the :math:`q = 1` form are

.. math::
    \frac{d\theta}{ds} = v, \qquad
    \frac{dv}{ds} = -\kappa\, \frac{g - v\,(v\cdot g)}{F - F_0}, \qquad
    |v| = 1, \quad \kappa = \frac{\eta}{2}\,\frac{d}{d-1},

with :math:`g = \nabla F`: the geodesics of the metric :math:`(F - F_0)^{-2\kappa}|d\theta|^2`.
The energy :math:`E = |\pi|\,(F - F_0)^{\kappa}` of the ray's momentum :math:`\pi = |\pi|\,v`
is conserved, so the ray never stops at a local minimum above :math:`F_0`. :class:`ECD` is the
discretisation of the paper, with one buffer per parameter (the unit velocity ``v``): half the
optimizer state of AdamW (state: what :meth:`~torch.optim.Optimizer.state_dict` saves; on a
CPU the fast path also keeps a gradient workspace of the parameters' size between steps).

:func:`make_optimizer` builds ECD and the baselines of :mod:`gaugebook.baselines` (AdamW, SGD
with Nesterov momentum, Muon, SOAP) by name, for the experiment runner.
"""
from __future__ import annotations

import math
import warnings
from typing import Callable, Iterable, NamedTuple

import torch
import torch.distributed as dist
from torch.optim import Optimizer

from gaugebook import ecd_kernels
from gaugebook.baselines import adamw, muon, sgdm, soap
from gaugebook.checks import check_bool, check_finite, check_number

__all__ = ["ECD", "ecd_kappa", "ecd_dt", "make_optimizer", "OPTIMIZERS",
           "PROJECTIONS"]

PROJECTIONS = ("global", "per_tensor")


def _mean_over_ranks(value: torch.Tensor) -> torch.Tensor:
    """Average a scalar over the ranks of an initialised process group (DDP); identity otherwise."""
    if dist.is_available() and dist.is_initialized():
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)  # AVG is NCCL-only; SUM works on every backend
        value /= dist.get_world_size()
    return value


def ecd_kappa(eta: float, d: int) -> float:
    """``kappa = (eta/2) d/(d-1)``: the coefficient of ECD's kick in ``d`` dimensions."""
    if d < 2:
        raise ValueError(f"ECD needs d >= 2 (kappa has d - 1 in the denominator), got d = {d}")
    return eta / 2 * d / (d - 1)


def ecd_dt(lr: float, eta: float) -> float:
    """``dt = lr / sqrt(eta)``: the arc-length step of ECD's map for the learning rate ``lr``.
    A step moves ``dt v - (lr^2/2) d/(d-1) g_perp/(F - F0)`` (the kicked velocity times
    ``dt``), so at least ``dt`` under the global projection, where ``g_perp`` is orthogonal to
    the unit ``v`` (the per-tensor kick can shorten it); ``steps x dt`` is the nominal path, not
    a bound on the distance travelled."""
    return lr / math.sqrt(eta)


class ECD(Optimizer):
    r"""Energy Conserving Descent, the :math:`q = 1` form used by Silverstein, Kunin & Shyam (2026).

    .. math::
       \begin{aligned}
            &\rule{110mm}{0.4pt} \\
            &\textbf{input}: \gamma \text{ (lr)},\ \eta,\ F_0,\ \nu,
                \ \lambda \text{ (weight decay)},\ \theta_0 \in \mathbb{R}^d,
                \ f(\theta) \text{ (objective)} \\
            &\Delta t = \gamma / \sqrt{\eta}, \qquad
                \kappa = \tfrac{\eta}{2}\,\tfrac{d}{d-1} \\[-1.ex]
            &\rule{110mm}{0.4pt} \\
            &\textbf{for}\ t = 1, 2, \ldots\ \textbf{do} \\
            &\hspace{5mm} F \leftarrow f(\theta) + \tfrac{\lambda}{2}|\theta|^2, \qquad
                g \leftarrow \nabla f(\theta) + \lambda\theta \\
            &\hspace{5mm} \textbf{if}\ F \le F_0:\ \text{skip the step (warn once, count it)} \\
            &\hspace{5mm} \textbf{if}\ t = 1:\ v \leftarrow -g / |g| \\
            &\hspace{5mm} v \leftarrow v - \kappa\,\Delta t\,\frac{g - v\,(v \cdot g)}{F - F_0}
                \hspace{10mm} \text{(kick)} \\
            &\hspace{5mm} \theta \leftarrow \theta + \Delta t\, v
                \hspace{39mm} \text{(drift)} \\
            &\hspace{5mm} v \leftarrow v / |v| \\
            &\hspace{5mm} \textbf{if}\ \nu > 0:\ z \sim \mathcal{N}(0, I_d),\quad
                v \leftarrow \frac{v + (\nu/\sqrt{d})\, z}{|v + (\nu/\sqrt{d})\, z|}
                \hspace{5mm} \text{(chaos)} \\
            &\rule{110mm}{0.4pt} \\[-1.ex]
            &\bf{return}\ \theta \\[-1.ex]
            &\rule{110mm}{0.4pt}
       \end{aligned}

    Norms and the dot product :math:`v \cdot g` run over all parameters of all groups together:
    :math:`v` is one unit vector in :math:`\mathbb{R}^d`, ``d`` the number of scalars optimised.
    The reference implementation rescales :math:`v` to unit length at the start of each step;
    here that rescaling closes the previous step, so the stored ``velocity`` always has
    :math:`|v| = 1` and the trajectory is the same.

    **Members.** With ``members=R`` every parameter holds ``R`` independent models stacked along
    its first dimension (``[R, ...]``, as :func:`torch.func.stack_module_state` makes them) and
    the closure returns their ``R`` losses: each member follows its own ECD trajectory (its own
    :math:`F`, :math:`d`, dot products, norms, skipped steps and chaos generator), computed by
    the same kernels for all. ``members=None`` (one model) is the case ``R = 1``.

    Args:
        params: parameters or parameter groups. ``lr`` and ``weight_decay`` may differ between
            groups (the group's :math:`\Delta t` and :math:`\lambda`); ``eta``, ``F0``, ``nu``,
            ``projection`` and ``foreach`` are shared by all groups.
        lr: :math:`\gamma`; each step moves the parameters by :math:`\Delta t = \gamma/\sqrt\eta`
            times the kicked velocity (:func:`ecd_dt`: at least unit length under the global
            projection, longer near :math:`F_0`).
        eta: :math:`\eta > 0`, the concentration of the ergodic measure
            :math:`\propto (F - F_0)^{-\eta d/2}` at low loss.
        F0: :math:`F_0`, below every loss the run reaches. A step with :math:`F \le F_0` is
            skipped and counted in :attr:`skipped_steps`; a warning (once per optimizer) suggests
            lowering ``F0``.
        nu: :math:`\nu \ge 0`, size of the random rotation of :math:`v` after each step: each
            coordinate is perturbed by :math:`\nu/\sqrt d`, so the perturbation has length about
            :math:`\nu` and :math:`v` turns by an angle of order :math:`\nu` whatever ``d`` (about
            :math:`\arctan\nu` for large ``d``).
        weight_decay: :math:`\lambda \ge 0`, an L2 term :math:`\tfrac{\lambda}{2}|\theta|^2` added
            to the loss (and :math:`\lambda\theta` to its gradient), not decoupled.
        projection: ``"global"`` (default, the exact geometry) or ``"per_tensor"``: the authors'
            shortcut, in which the dot product is taken within each tensor :math:`b` of a
            partition, :math:`v_b \leftarrow v_b - \kappa\,\Delta t\,(g_b - v_b (v_b\cdot g_b))
            /(F - F_0)`, while the normalisation of :math:`v` stays global (as in their published
            ``ECD_q1`` code). It is not a projection orthogonal to :math:`v` and breaks the O(d)
            symmetry.
        blocks: the partition of ``"per_tensor"``: lists of parameters (tensors, not names)
            that form one tensor of the partition; every parameter not listed is a tensor of its
            own. ``None``: every parameter is its own tensor. GPT-2's own tensors, where the
            query, key and value weights of a layer are one fused ``c_attn.weight``, come from
            the names of :meth:`gaugebook.gpt.GPT.gpt2_tensors`:
            ``params = dict(model.named_parameters())`` and
            ``blocks=[[params[n] for n in names] for names in model.gpt2_tensors()]``.
        members: ``None`` (one model) or ``R >= 1`` stacked models (see above).
        chaos_seeds: seeds of the chaos generators, one per member (``None``: one draw each from
            torch's global generator at construction; under DDP rank 0's draws, broadcast).
        foreach: ``None`` or ``True`` (default): the fast path, on every device. The velocities
            of one dtype are views into one flat buffer ``[R, N]``, the gradients are copied into
            one flat buffer per dtype for the step (of the size of the parameters: a transient
            on a GPU, kept between steps on a CPU, where a fresh one costs page faults);
            the partial dot products come in a few kernels whatever the number of tensors, and
            each member's kick, normalisation and drift are a few multi-tensor kernels with
            scalars computed on the host (off the CPU without chaos, on the device: below).
            ``False``: the reference path, one tensor at a time.
            Both compute the same numbers up to round-off.
        fused: whether the fast path's device step (below) runs as two fused Triton kernels
            (:mod:`gaugebook.ecd_kernels`: the three dot products in one pass over v and g, the
            kick and drift in one more; about 9 N floats moved instead of about 24 N).
            ``None`` (default): on CUDA when Triton is installed; ``False``: never (the device
            step of PyTorch operators); ``True``: wherever the device step is taken (an error
            without Triton). The same numbers up to round-off. It says how a step is computed,
            not what: it is not saved in :meth:`state_dict`.

    ``step(closure)`` needs a closure that zeroes the gradients, computes the loss (a scalar; with
    ``members=R`` a tensor ``[R]``), calls ``backward()`` and returns it. Parameters whose
    ``.grad`` is ``None`` count as having a zero gradient (they still drift with :math:`v`).
    Under DDP (an initialised ``torch.distributed`` process group) :math:`F` is averaged over the
    ranks before the step; the gradients are already averaged by DDP. On a CPU, a step of the
    fast path reads its few scalars (:math:`F`, the partial dot products) to the host once and
    sends nothing back. Off the CPU, once every member has made its first step and without chaos
    (``nu = 0``), it reads nothing: its coefficients are computed on the device, so a GPU never
    waits for the host; the steps and skipped steps are then counted, and a non-finite loss or
    gradient reported, when :attr:`steps`, :attr:`skipped_steps` or :meth:`state_dict` is read.
    The chaos generators are saved by :meth:`state_dict`, so a resumed run is identical to an
    uninterrupted one.

    Attributes:
        steps: number of steps taken (not skipped); an integer for one model, a list (one per
            member) with ``members``; saved and restored by ``state_dict``/``load_state_dict``.
        skipped_steps: number of steps skipped because :math:`F \le F_0`, likewise.
    """

    def __init__(self, params, lr: float, eta: float, F0: float, *, nu: float = 0.0,
                 weight_decay: float = 0.0, projection: str = "global", blocks=None,
                 members: int | None = None, chaos_seeds: list[int] | None = None,
                 foreach: bool | None = None, fused: bool | None = None):
        defaults = dict(lr=lr, eta=eta, F0=F0, nu=nu, weight_decay=weight_decay,
                        projection=projection, foreach=foreach)
        self._validate_group(defaults)
        check_bool("fused", fused, optional=True)
        if fused and not ecd_kernels.AVAILABLE:
            raise ValueError("fused=True needs Triton (pip install triton); fused=None takes the "
                             "fused step where it can, fused=False never")
        self.fused = fused
        if members is not None and (type(members) is not int or members < 1):
            raise ValueError(f"members must be None or a positive integer, got {members!r}")
        self.members = members
        super().__init__(params, defaults)
        params = self._params()
        self._check_params()
        self._blocks_given = blocks is not None
        self._block = self._partition(blocks, projection)
        R, device = self._R, params[0].device
        if chaos_seeds is None:
            chaos_seeds = [self._chaos_seed(device) for _ in range(R)]
        if len(chaos_seeds) != R:
            raise ValueError(f"chaos_seeds must hold one seed per member ({R}), "
                             f"got {len(chaos_seeds)}")
        self._generators = [torch.Generator(device=device).manual_seed(int(s))
                            for s in chaos_seeds]
        self._moved, self._skipped, self._started = [0] * R, [0] * R, [False] * R
        # the steps taken on the device and not yet counted, [3, R]: moved, skipped, not finite
        # (added to in place, so that a CUDA graph's replays add up too); made by the first
        # step there, so that None means that no step has run there to be counted
        self._pending: torch.Tensor | None = None
        self._flat: dict[torch.dtype, torch.Tensor] = {}  # velocity storage, set on the first step
        self._layout: list[_Slice] = []
        self._units: _Units | None = None  # the device step's constants (off the CPU)
        self._kernels: ecd_kernels.FusedStep | None = None  # the fused device step, if taken
        self._workspace: dict[torch.dtype, torch.Tensor] | None = None  # CPU gradient copies
        self._warned = False

    @property
    def _R(self) -> int:
        return self.members or 1

    @staticmethod
    def _chaos_seed(device: torch.device) -> int:
        """One draw from torch's global generator; under DDP rank 0's draw, so that every rank
        adds the same chaos noise (all ranks must then construct the optimizer)."""
        seed = torch.randint(0, 2**62, ())
        if dist.is_available() and dist.is_initialized():
            seed = seed.to(device)  # NCCL broadcasts CUDA tensors only
            dist.broadcast(seed, src=0)
        return int(seed)

    @staticmethod
    def _validate_group(group: dict) -> None:
        check_number("lr", group["lr"], low=0.0, strict=True)
        check_number("eta", group["eta"], low=0.0, strict=True)
        check_number("nu", group["nu"], low=0.0, strict=False)
        check_number("weight_decay", group["weight_decay"], low=0.0, strict=False)
        check_finite("F0", group["F0"])
        if group["projection"] not in PROJECTIONS:
            raise ValueError(f"projection must be one of {PROJECTIONS}, "
                             f"got {group['projection']!r}")
        check_bool("foreach", group["foreach"], optional=True)

    def _partition(self, blocks, projection: str) -> list[int]:
        """The tensor of the partition that each parameter (in group order) belongs to."""
        params = self._params()
        if blocks is None:
            return list(range(len(params)))
        if projection != "per_tensor":
            raise ValueError("blocks partition the per-tensor projection; with projection="
                             f"{projection!r} the dot product is global: drop blocks or pass "
                             "projection='per_tensor'")
        position = {id(p): i for i, p in enumerate(params)}
        block = [-1] * len(params)
        for b, block_params in enumerate(blocks):
            block_params = list(block_params)
            if not block_params:
                raise ValueError(f"block {b} of the partition is empty")
            for p in block_params:
                if not isinstance(p, torch.Tensor):
                    raise TypeError(
                        f"block {b} holds a {type(p).__name__}; pass tensors, e.g. [[params[n] "
                        "for n in names] for names in model.gpt2_tensors()] with "
                        "params = dict(model.named_parameters())")
                i = position.get(id(p))
                if i is None:
                    raise ValueError(f"block {b} holds a tensor that ECD does not optimise")
                if block[i] >= 0:
                    raise ValueError(f"parameter {i} is in two blocks of the partition "
                                     f"({block[i]} and {b})")
                block[i] = b
        n = len(blocks)
        for i, b in enumerate(block):
            if b < 0:
                block[i], n = n, n + 1
        return block

    def _check_params(self) -> None:
        """The parameters of all groups: each listed once, on one device, with a leading
        dimension of ``members`` when batched, and d >= 2 scalars."""
        params = self._params()
        if len({id(p) for p in params}) < len(params):
            raise ValueError("a parameter is listed twice: ECD would count its scalars twice in d "
                             "(pass each parameter once, e.g. model.parameters())")
        if len({p.device for p in params}) > 1:
            devices = sorted(str(d) for d in {p.device for p in params})
            raise ValueError("ECD moves all parameters along one unit velocity: put them on one "
                             f"device, got {devices}")
        strided = [i for i, p in enumerate(params) if not p.is_contiguous()]
        if strided:
            raise ValueError(f"ECD updates each parameter through a flat view of its storage: "
                             f"parameters {strided} (in group order) are not contiguous; make "
                             "them so first (model.to(memory_format=torch.contiguous_format), "
                             "or nn.Parameter(w.contiguous()))")
        if self.members is not None:
            wrong = [tuple(p.shape) for p in params if p.ndim == 0 or p.shape[0] != self.members]
            if wrong:
                raise ValueError(f"with members={self.members} every parameter must have a "
                                 f"leading dimension of {self.members} (one slice per model), "
                                 f"got shapes {wrong}")
        if self.dimension < 2:
            raise ValueError(f"ECD needs at least 2 trainable scalars (kappa has d - 1 in the "
                             f"denominator), got d = {self.dimension}")

    def add_param_group(self, param_group: dict) -> None:
        """Torch's, with ECD's checks; a refused group is not kept. After construction, only
        before the first step and without a ``blocks`` partition (which was fixed then)."""
        if getattr(self, "_flat", None):
            raise ValueError("ECD keeps one velocity over all parameters: parameter groups "
                             "cannot be added after the first step")
        if getattr(self, "_blocks_given", False):
            raise ValueError("the blocks partition was fixed when ECD was made: pass every "
                             "parameter to ECD(...) and list it in blocks")
        super().add_param_group(param_group)
        try:
            group = self.param_groups[-1]
            self._validate_group(group)
            for p in group["params"]:
                if not p.is_floating_point() or p.is_complex():
                    raise ValueError(f"ECD optimises real floating-point parameters, "
                                     f"got dtype {p.dtype}")
            for key in ("eta", "F0", "nu", "projection", "foreach"):
                if group[key] != self.param_groups[0][key]:
                    raise ValueError(f"{key} is shared by all parameter groups of ECD: got "
                                     f"{group[key]!r} in a group and "
                                     f"{self.param_groups[0][key]!r} in the first")
            if hasattr(self, "_block"):  # added after construction: the checks of __init__
                self._check_params()
                self._block = self._partition(None, group["projection"])
        except ValueError:
            self.param_groups.pop()
            raise

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    @property
    def dimension(self) -> int:
        """``d``: the number of scalars optimised (per member), over all parameter groups."""
        return sum(p.numel() for p in self._params()) // self._R

    @property
    def steps(self):
        """The number of steps that moved the parameters (a list per member when batched)."""
        self._settle()
        return self._moved if self.members else self._moved[0]

    @property
    def skipped_steps(self):
        """The number of steps skipped because ``F <= F0`` (a list per member when batched)."""
        self._settle()
        return self._skipped if self.members else self._skipped[0]

    def _settle(self) -> None:
        """Count the steps taken on the device since the last call (one read to the host), warn
        about skipped ones, and raise if one of them met a non-finite loss or gradient."""
        if self._pending is None:
            return
        moved, skipped, bad = self._pending.tolist()
        self._pending.zero_()
        for r in range(self._R):
            self._moved[r] += int(moved[r])
            self._skipped[r] += int(skipped[r])
        if any(bad):
            r = next(i for i, b in enumerate(bad) if b)
            raise FloatingPointError(
                f"ECD: a non-finite loss or gradient at or before step "
                f"{self._moved[r] + self._skipped[r]}" + (f", member {r}" if self.members else "")
                + "; check the model, the data and the learning rate")
        if any(skipped) and not self._warned:
            warnings.warn(f"ECD: F <= F0 = {float(self._shared('F0')):.6g} at some steps, which "
                          "were skipped (counted in ECD.skipped_steps). Lower F0 below every loss "
                          "the run can reach.", RuntimeWarning, stacklevel=3)
            self._warned = True

    def _shared(self, key: str):
        values = {group[key] for group in self.param_groups}
        if len(values) > 1:
            raise ValueError(f"{key} is shared by all parameter groups of ECD, "
                             f"found {sorted(values)}")
        return values.pop()

    def _use_foreach(self) -> bool:
        return self._shared("foreach") is not False  # None (default) and True: the fast path

    def _rows(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` as ``[R, n]``: one row per member."""
        return t.view(self._R, -1)

    def _col(self, values: list[float], like: torch.Tensor):
        """Per-member coefficients broadcasting against ``[R, n]`` rows (a float for one)."""
        if self._R == 1:
            return values[0]
        return torch.tensor(values, dtype=like.dtype, device=like.device).view(-1, 1)

    # Storage: the velocities of all parameters of one dtype are views into one flat buffer
    # [R, N], so that the fast path reduces and updates them with a few kernels whatever the
    # number of tensors. Parameters are numbered in group order; a bucket holds one dtype's.

    def _buckets(self) -> dict[torch.dtype, list[int]]:
        buckets: dict[torch.dtype, list[int]] = {}
        for i, p in enumerate(self._params()):
            buckets.setdefault(p.dtype, []).append(i)
        return buckets

    def _slices(self):
        """``(group, dtype, start, stop, indices)``: the group's parameters of one dtype occupy
        columns ``start:stop`` of ``flat[dtype]``."""
        params, offset, i, out = self._params(), {}, 0, []
        for group in self.param_groups:
            indices_by_dtype: dict[torch.dtype, list[int]] = {}
            for _ in group["params"]:
                indices_by_dtype.setdefault(params[i].dtype, []).append(i)
                i += 1
            for dtype, idx in indices_by_dtype.items():
                start = offset.get(dtype, 0)
                offset[dtype] = start + sum(params[j].numel() // self._R for j in idx)
                out.append((group, dtype, start, offset[dtype], idx))
        return out

    def _split(self, flat: torch.Tensor, idx: list[int]) -> list[torch.Tensor]:
        """Columns of ``flat [R, N]`` cut into the rows ``[R, n_j]`` of the parameters ``idx``."""
        params = self._params()
        return list(flat.split([params[j].numel() // self._R for j in idx], dim=1))

    def _attach(self, flat: dict[torch.dtype, torch.Tensor]) -> None:
        """Make ``state[p]["velocity"]`` views (shaped like ``p``) of the flat buffers. The
        parameter groups are fixed from now on, so their layout is kept, with each slice's
        parameter rows and velocity rows, also cut per member (the fast path then builds no
        lists per step), and the segment lengths of the per-tensor dot products."""
        self._flat, self._layout, self._units = flat, [], None
        params, R = self._params(), self._R
        self._storage = [p.data_ptr() for p in params]
        for dtype, idx in self._buckets().items():
            for j, rows in zip(idx, self._split(flat[dtype], idx)):
                self.state[params[j]]["velocity"] = rows.view(params[j].shape)
        for group, dtype, start, stop, idx in self._slices():
            param_rows = [self._rows(params[j]) for j in idx]
            velocity_rows = self._split(flat[dtype][:, start:stop], idx)
            per_member = [([w[r] for w in param_rows], [v[r] for v in velocity_rows])
                          for r in range(R)]
            self._layout.append(_Slice(group, dtype, start, stop, idx, param_rows, per_member))
        # per-tensor: member r's segment of parameter j in flat[dtype].view(-1), member-major
        device = params[0].device
        sizes = {dtype: [params[j].numel() // R for j in idx]
                 for dtype, idx in self._buckets().items()}
        self._segments = {dtype: _Segments.of(n, R, device) for dtype, n in sizes.items()}
        order = [j for idx in self._buckets().values() for j in idx]
        self._order = (None if order == sorted(order) else
                       torch.tensor(sorted(range(len(order)), key=order.__getitem__),
                                    device=device))
        self._kernels = None
        if _on_device(params[0]):  # here, where a step synchronises anyway
            if self.fused or (self.fused is None and ecd_kernels.AVAILABLE
                              and device.type == "cuda"):
                self._kernels = ecd_kernels.FusedStep(params, self._buckets(), R)
            self._prepare_units(device)

    def _reattach(self, params: list[torch.Tensor]) -> None:
        """Views of the parameters' new storage, after ``p.data = ...`` (or
        ``vector_to_parameters``) replaced it since the last step; ValueError when a parameter
        changed dtype, shape or device, which the velocity cannot follow."""
        velocities = [self.state[p]["velocity"] for p in params]
        changed = [i for i, (p, v) in enumerate(zip(params, velocities))
                   if (p.dtype, p.shape, p.device) != (v.dtype, v.shape, v.device)]
        if changed:
            raise ValueError(f"parameters {changed} (in group order) changed dtype, shape or "
                             "device since ECD's first step; its velocity cannot follow: make "
                             "a new ECD (or move or cast the model before the first step)")
        self._attach(self._flat)

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None):
        """One ECD step; ``closure`` (required) recomputes the loss and its gradient."""
        if closure is None:
            raise ValueError("ECD.step needs the loss, not only the gradient: pass a closure that "
                             "zeroes the gradients, computes the loss, calls loss.backward() and "
                             "returns the loss, e.g. opt.step(closure)")
        with torch.enable_grad():
            loss = closure()
        params, R = self._params(), self._R
        F_loss = torch.as_tensor(loss).detach().to(params[0].device, torch.float64)
        expected = () if self.members is None else (R,)
        if tuple(F_loss.shape) != expected:
            what = "a scalar loss" if self.members is None else f"one loss per member, shape [{R}]"
            raise ValueError(f"the closure must return {what}, got shape {tuple(F_loss.shape)}")
        F_loss = _mean_over_ranks(F_loss.reshape(R))
        foreach = self._use_foreach()
        if self._flat and self._storage != [p.data_ptr() for p in params]:
            self._reattach(params)
        if not self._flat:  # zero velocity rows until each member's first step sets -g/|g|
            self._attach({dtype: torch.zeros(R, sum(params[j].numel() // R for j in idx),
                                             dtype=dtype, device=params[0].device)
                          for dtype, idx in self._buckets().items()})
        # per member: F (averaged over DDP ranks), the L2 term and partial dot products
        on_device = (foreach and all(self._started) and self._shared("nu") == 0
                     and _on_device(F_loss))
        if on_device and self._kernels is not None:
            grads, penalty = self._flat_gradients()
            self._step_fused(F_loss + penalty, grads)
            return loss
        grads, penalty, partials = (self._gather_foreach if foreach else self._gather_reference)()
        if on_device:
            self._step_on_device(F_loss + penalty, grads, partials)
            return loss
        self._settle()  # (steps on the device before, if any)
        stats = torch.cat([F_loss, penalty, *(t.flatten() for t in partials.values())]).tolist()
        n = next(iter(partials.values())).shape[1]  # partial sums per member
        rows = [(stats[r], stats[R + r],
                 {key: stats[2 * R + (k * R + r) * n: 2 * R + (k * R + r + 1) * n]
                  for k, key in enumerate(partials)}) for r in range(R)]  # (one sync above)
        kicks, dots, fresh = self._coefficients(rows, grads)
        if not any(kicks):
            return loss
        for r in fresh:  # a member's first step: v = -g/|g|
            g_norm = math.sqrt(math.fsum(rows[r][2]["gg"]))
            if isinstance(grads, dict):
                pairs = [(self._flat[dtype], g) for dtype, g in grads.items()]
            else:
                pairs = [(self._rows(self.state[p]["velocity"]), g) for p, g in zip(params, grads)]
            for v, g in pairs:
                v[r].copy_(g[r] / -g_norm)
        chaos = self._shared("nu") / math.sqrt(self.dimension)
        if foreach:
            self._update_foreach(grads, dots, kicks, chaos, [parts for *_, parts in rows])
        else:
            self._update_reference(grads, dots, kicks, chaos)
        return loss

    def _coefficients(self, rows, grads):
        """Per member: ``kappa / (F - F0)`` (0 for a skipped step) and, for each parameter, the dot
        product :math:`v \\cdot g` of its tensor of the partition (global: of all), from the
        partial dot products ``rows`` (``(F, L2 term, {"vg": [...], "gg": [...], ...})``, partial
        sums per parameter or per slice), checked for finiteness. Counts steps and skipped steps;
        returns the members that start moving now, whose partials it rewrites for
        :math:`v = -g/|g|`."""
        eta, F0 = float(self._shared("eta")), float(self._shared("F0"))
        d, params = self.dimension, self._params()
        kappa, per_tensor = ecd_kappa(eta, d), self._shared("projection") == "per_tensor"
        kicks, dots, fresh = [], [], []
        for r, (F_loss, penalty, parts) in enumerate(rows):
            vg, gg = parts["vg"], parts["gg"]
            who = f"ECD step {self._moved[r] + self._skipped[r] + 1}" + (
                f", member {r}" if self.members else "")
            if not math.isfinite(F_loss):
                raise FloatingPointError(f"{who}: the loss is {F_loss} (not finite); check the "
                                         "model, the data and the learning rate")
            if not all(map(math.isfinite, vg + gg)):
                bad = next((i for i, p in enumerate(params) if p.grad is not None
                            and not torch.isfinite(self._rows(p.grad)[r]).all()), None)
                if bad is None:
                    raise FloatingPointError(f"{who}: the gradients are finite but the dot "
                                             "product v.g overflowed")
                shape = tuple(params[bad].shape[1:] if self.members else params[bad].shape)
                raise FloatingPointError(f"{who}: the gradient of parameter {bad} (shape "
                                         f"{shape}) is not finite")
            F = F_loss + penalty
            if F <= F0:
                self._skipped[r] += 1
                if not self._warned:
                    warnings.warn(f"ECD: F = {F:.6g} <= F0 = {F0:.6g}, the step is skipped "
                                  "(counted in ECD.skipped_steps). Lower F0 below every loss the "
                                  "run can reach.", RuntimeWarning, stacklevel=3)
                    self._warned = True
                kicks.append(0.0)
                dots.append([0.0] * len(params))
                continue
            if not self._started[r]:
                g_norm = math.sqrt(math.fsum(gg))
                if g_norm == 0:
                    raise ValueError(f"{who}: the gradient is exactly zero at the first step, so "
                                     "the initial velocity -g/|g| is undefined")
                vg = parts["vg"] = [-x / g_norm for x in gg]  # v.g with v = -g/|g|
                if "vv" in parts:
                    parts["vv"] = [x / g_norm**2 for x in gg]
                self._started[r] = True
                fresh.append(r)
            if per_tensor:  # one dot product per tensor of the partition
                sums: dict[int, list[float]] = {}
                for i, x in enumerate(vg):
                    sums.setdefault(self._block[i], []).append(x)
                dots.append([math.fsum(sums[self._block[i]]) for i in range(len(params))])
            else:
                dots.append([math.fsum(vg)] * len(params))
            self._moved[r] += 1
            kicks.append(kappa / (F - F0))
        return kicks, dots, fresh

    def _raw_gradients(self) -> list[torch.Tensor]:
        params = self._params()
        if all(p.grad is None for p in params):
            raise ValueError("ECD.step: no parameter has a gradient; the closure must call "
                             "loss.backward() before it returns the loss")
        grads = []
        for p in params:
            if p.grad is not None and p.grad.is_sparse:
                raise ValueError("ECD does not support sparse gradients")
            grads.append(torch.zeros_like(p) if p.grad is None else p.grad)
        return grads

    def _concatenate(self, tensors: list[torch.Tensor],
                     out: dict[torch.dtype, torch.Tensor] | None = None):
        """One flat copy ``[R, N]`` of ``tensors`` per dtype, into ``out[dtype]`` when given."""
        flat = {dtype: [self._rows(tensors[j]) for j in idx]
                for dtype, idx in self._buckets().items()}
        return {dtype: torch.cat(ts, dim=1) if out is None else torch.cat(ts, dim=1, out=out[dtype])
                for dtype, ts in flat.items()}

    def _penalties(self, rows_of_groups) -> torch.Tensor:
        """``sum_groups lambda/2 |theta_group|^2`` per member, float64 ``[R]``, from pairs
        ``(group, its parameters' rows [R, n_j])``."""
        penalty = torch.zeros(self._R, dtype=torch.float64, device=self._params()[0].device)
        for group, rows in rows_of_groups:
            if group["weight_decay"] != 0:
                for t in rows:
                    penalty += group["weight_decay"] / 2 * _dots(t, t)
        return penalty

    def _gather_reference(self):
        """Gradients ``g + wd theta`` per tensor (rows ``[R, n]``), the L2 terms ``[R]``, and
        ``v.g``, ``g.g`` per member and tensor, ``[R, P]``."""
        raw, params, i = self._raw_gradients(), self._params(), 0
        grads = []
        for group in self.param_groups:
            for p in group["params"]:
                g = self._rows(raw[i])
                if group["weight_decay"] != 0:
                    g = g + group["weight_decay"] * self._rows(p)
                grads.append(g)
                i += 1
        penalty = self._penalties([(g, [self._rows(p) for p in g["params"]])
                                   for g in self.param_groups])
        velocities = [self._rows(self.state[p]["velocity"]) for p in params]
        vg = torch.stack([_dots(v, g) for v, g in zip(velocities, grads)], dim=1)
        gg = torch.stack([_dots(g, g) for g in grads], dim=1)
        return grads, penalty, {"vg": vg, "gg": gg}

    def _flat_gradients(self):
        """Flat gradients ``{dtype: [R, N]}`` (copies, in the velocity's layout), with the
        weight decay added, and the L2 terms ``[R]``."""
        params = self._params()
        grads = self._concatenate(self._raw_gradients(), self._workspace)  # copies: safe to modify
        if params[0].device.type == "cpu":
            # A CPU allocator hands large blocks back to the system, so a fresh buffer per step
            # costs page faults (more than the copy): keep it. CUDA's caching allocator reuses
            # the block by itself, and a kept buffer would raise the peak memory of training.
            self._workspace = grads
        for sl in self._layout:
            if sl.group["weight_decay"] != 0:
                g = self._split(grads[sl.dtype][:, sl.start:sl.stop], sl.indices)
                torch._foreach_add_(g, sl.param_rows, alpha=sl.group["weight_decay"])
        penalty = self._penalties([(sl.group, sl.param_rows) for sl in self._layout])
        return grads, penalty

    def _gather_foreach(self):
        """The same as :meth:`_gather_reference` with flat gradients (:meth:`_flat_gradients`),
        and with :math:`v\\cdot v` too (the update normalises with it): partial sums per slice
        of the layout (a group's parameters of one dtype) for the global projection, per
        parameter for the per-tensor one (off the CPU two segmented reductions per dtype and
        product, whatever the number of tensors)."""
        grads, penalty = self._flat_gradients()
        pairs = {"vg": lambda v, g: (v, g), "gg": lambda v, g: (g, g), "vv": lambda v, g: (v, v)}
        if self._shared("projection") == "global":  # one sum per slice suffices
            slices = [(self._flat[sl.dtype][:, sl.start:sl.stop],
                       grads[sl.dtype][:, sl.start:sl.stop]) for sl in self._layout]
            partials = {key: torch.stack([_dots(*pick(v, g)) for v, g in slices], dim=1)
                        for key, pick in pairs.items()}
        else:  # per parameter, summed over the partition's tensors on the host
            partials = {key: torch.cat([_segment_dots(*pick(self._flat[dtype], g),
                                                      self._segments[dtype])
                                        for dtype, g in grads.items()], dim=1)
                        for key, pick in pairs.items()}
            if self._order is not None:  # several dtypes: back to parameter order
                partials = {key: t[:, self._order] for key, t in partials.items()}
        return grads, penalty, partials

    def _noise(self, r: int) -> dict[torch.dtype, torch.Tensor]:
        """z ~ N(0, I) for member ``r``, one flat vector per dtype, from its own generator."""
        return {dtype: torch.randn(v.shape[1], generator=self._generators[r], device=v.device,
                                   dtype=dtype) for dtype, v in self._flat.items()}

    def _chaos(self, chaos: float, kicks: list[float]) -> None:
        """``v += (nu/sqrt d) z`` for the members that moved; then back to unit length (the
        length stays on the device)."""
        for r, kick in enumerate(kicks):
            if kick:
                rows = [v[r:r + 1] for v in self._flat.values()]  # [1, n] per dtype
                for row, z in zip(rows, self._noise(r).values()):
                    row.add_(z, alpha=chaos)
                speed = torch.cat([_dots(row, row) for row in rows]).sum().sqrt()
                for row in rows:
                    row.div_(speed)

    def _normalise(self, buffers, kicks) -> None:
        """Rescale the moving members' rows of the velocity, held in ``buffers`` (``[R, n]``
        each), to unit speed."""
        speed = torch.stack([_dots(u, u) for u in buffers]).sum(0).sqrt()  # [R]
        moving = torch.tensor([k != 0 for k in kicks], device=speed.device)
        for u in buffers:
            u.mul_(torch.where(moving, 1.0 / speed, 1.0).to(u.dtype).view(-1, 1))

    def _update_reference(self, grads, dots, kicks, chaos) -> None:
        """Kick, drift and renormalise, one tensor at a time (the readable path)."""
        params = self._params()
        eta, i = float(self._shared("eta")), 0
        velocities = [self._rows(self.state[p]["velocity"]) for p in params]
        for group in self.param_groups:
            dt = ecd_dt(group["lr"], eta)
            for p in group["params"]:
                v, g = velocities[i], grads[i]
                c = self._col([kick * dt for kick in kicks], v)
                vg = self._col([row[i] for row in dots], v)
                v.sub_(c * (g - v * vg))  # kick: g's component orthogonal to v (or v_b)
                p_rows = self._rows(p)
                p_rows.add_(v * self._col([dt if kick else 0.0 for kick in kicks], v))  # drift
                i += 1
        self._normalise(velocities, kicks)
        if chaos > 0:
            self._chaos(chaos, kicks)

    def _update_foreach(self, grads, dots, kicks, chaos, partials) -> None:
        """The same update with host scalars, a few multi-tensor kernels per member and slice,
        and no transfer to the device. The kicked velocity of slice ``s`` (its own
        :math:`c = \\kappa\\Delta t_s/(F - F_0)`) is :math:`v' = a v - c g` with
        :math:`a = 1 + c\\,(v\\cdot g)_b` (the dot product of its tensor ``b`` of the partition,
        or the global one), so :math:`|v'|^2 = \\sum (a^2\\, v\\cdot v - 2ac\\, v\\cdot g + c^2\\,
        g\\cdot g)` over the partial sums: the velocity is kicked and normalised in one pass,
        :math:`v \\leftarrow v'/|v'|`, and the drift adds :math:`\\Delta t_s |v'|\\, v`."""
        eta, per_tensor = float(self._shared("eta")), self._shared("projection") == "per_tensor"
        for r, kick in enumerate(kicks):
            if not kick:
                continue
            vg, gg, vv = partials[r]["vg"], partials[r]["gg"], partials[r]["vv"]
            plan, speed = [], 0.0  # per slice: dt, c, the factors a (per parameter or one)
            for s, sl in enumerate(self._layout):
                dt = ecd_dt(sl.group["lr"], eta)
                c = kick * dt
                if per_tensor:
                    a = [1 + c * dots[r][j] for j in sl.indices]
                    speed += math.fsum(aj * aj * vv[j] - 2 * aj * c * vg[j] + c * c * gg[j]
                                       for aj, j in zip(a, sl.indices))
                else:
                    a = 1 + c * dots[r][0]
                    speed += a * a * vv[s] - 2 * a * c * vg[s] + c * c * gg[s]
                plan.append((dt, c, a))
            if not speed > 0:  # |v'|^2 lost to round-off: c |g| dwarfs |v| = 1 by ~1e8 or more
                raise FloatingPointError(
                    f"ECD: the kicked velocity's squared norm came out {speed:.3g}, not positive: "
                    "the step is too large for float round-off (or a gradient is not finite); "
                    "lower lr")
            n = math.sqrt(speed)
            for (dt, c, a), sl in zip(plan, self._layout):
                v = self._flat[sl.dtype][r, sl.start:sl.stop]
                weights, velocities = sl.per_member[r]
                if per_tensor:
                    torch._foreach_mul_(velocities, [aj / n for aj in a])
                else:
                    v.mul_(a / n)
                v.add_(grads[sl.dtype][r, sl.start:sl.stop], alpha=-c / n)  # v = (a v - c g)/|v'|
                torch._foreach_add_(weights, velocities, alpha=dt * n)  # drift: dt v'
        if chaos > 0:
            self._chaos(chaos, kicks)

    def _step_on_device(self, F: torch.Tensor, grads, partials) -> None:
        r"""The update of :meth:`_update_foreach` for every member at once, with its coefficients
        computed on the device (:meth:`_device_coefficients`), so that nothing is read to the
        host (a GPU runs ahead of the Python that launches its kernels): ``F [R]`` (loss plus L2
        term), the flat gradients, and the partial sums (per parameter, or per slice for the
        global projection), as PyTorch operators. Without chaos (``nu = 0``), once every member
        has made its first step."""
        vg, gg, vv = partials["vg"], partials["gg"], partials["vv"]  # [R, U]
        moving, scale, coef, drift = self._device_coefficients(F, vg, gg, vv)
        for s, sl in enumerate(self._layout):
            dtype = sl.dtype
            v, g = self._flat[dtype][:, sl.start:sl.stop], grads[dtype][:, sl.start:sl.stop]
            columns = self._units.columns[s]  # the unit of each column (None: one for all)
            factor = scale[:, self._units.of_slice[s]].to(dtype)
            v.mul_(factor if columns is None else factor.index_select(1, columns))
            u = self._units.first[s]  # (a slice's units share their dt, so coef and drift)
            v.addcmul_(g, coef[:, u:u + 1].to(dtype), value=-1)
            moved = v * drift[:, u:u + 1].to(dtype)
            for r, (weights, _) in enumerate(sl.per_member):
                torch._foreach_add_(weights, moved[r].split([w.numel() for w in weights]))
        self._count(F, vg, gg, moving)

    def _step_fused(self, F: torch.Tensor, grads) -> None:
        """:meth:`_step_on_device` as the two kernels of :mod:`gaugebook.ecd_kernels`: the
        partial sums per member and parameter in one pass, the kick and drift in another."""
        vg, gg, vv = self._kernels.sums(self._flat, grads)  # [R, P] each
        moving, scale, coef, drift = self._device_coefficients(F, vg, gg, vv)
        self._kernels.update(self._flat, grads, scale, coef, drift)
        self._count(F, vg, gg, moving)

    def _device_coefficients(self, F: torch.Tensor, vg, gg, vv):
        r"""From ``F [R]`` and the partial sums ``[R, U]`` per unit (:meth:`_prepare_units`),
        on the device: which members move (:math:`F > F_0`) and, per member and unit, the
        coefficients of :math:`v \leftarrow s\,v - c\,g` and :math:`\theta \leftarrow
        \theta + m\,v` (after the kick): :math:`s = a/|v'|`, :math:`c = k\,\Delta t/|v'|`
        and :math:`m = \Delta t\,|v'|`, with :math:`k = \kappa/(F - F_0)`, :math:`a = 1 +
        k\Delta t\,(v\cdot g)_b` (the dot product of the unit's tensor :math:`b`, or the
        global one) and :math:`|v'|` from the partial sums (as in :meth:`_update_foreach`).
        A member that does not move gets :math:`s = 1`, :math:`c = m = 0`."""
        if self._units is None or self._units.rates != self._rates():  # (lr or eta changed)
            self._prepare_units(F.device)
        eta, F0, d = float(self._shared("eta")), float(self._shared("F0")), self.dimension
        kappa, dt = ecd_kappa(eta, d), self._units.dt  # dt [U]
        moving = F > F0
        kick = torch.where(moving, kappa / (F - F0), 0.0)  # [R]
        c = kick[:, None] * dt  # [R, U]
        a = 1 + c * (vg @ self._units.same)  # v.g of each unit's tensor (global: of all)
        speed = (a * a * vv - 2 * a * c * vg + c * c * gg).sum(1).sqrt()  # |v'| [R]
        scale = torch.where(moving[:, None], a / speed[:, None], 1.0)
        coef = torch.where(moving, kick / speed, 0.0)[:, None] * dt
        drift = torch.where(moving, speed, 0.0)[:, None] * dt
        return moving, scale, coef, drift

    def _count(self, F: torch.Tensor, vg, gg, moving) -> None:
        """Add the step's counts (moved, skipped, non-finite loss or gradient) per member to
        the device's tally, which :meth:`_settle` reads."""
        bad = ~(torch.isfinite(F) & torch.isfinite(vg.sum(1)) & torch.isfinite(gg.sum(1)))
        counts = torch.stack([moving.long(), (~moving).long(), bad.long()])
        if self._pending is None:  # (the first device step precedes a CUDA graph's capture)
            self._pending = torch.zeros_like(counts)
        self._pending.add_(counts)

    def _rates(self) -> tuple:
        return float(self._shared("eta")), tuple(group["lr"] for group in self.param_groups)

    def _prepare_units(self, device: torch.device) -> None:
        """The device step's constants, for the present learning rates and eta. Its units are
        the parameters (per-tensor projection, or the fused step), else the slices of the
        layout. Per unit: its dt, and the 0/1 matrix of units whose partial sums form its dot
        product (one tensor of the partition; global: all). For the unfused step, per slice:
        its units, its first, and (per-tensor) the unit within the slice of each column."""
        eta, params = float(self._shared("eta")), self._params()
        per_tensor = self._shared("projection") == "per_tensor"
        by_parameter = per_tensor or self._kernels is not None
        dt, of_slice, first, columns = [], [], [], []
        for s, sl in enumerate(self._layout):
            idx = sl.indices
            if by_parameter:
                of_slice.append(torch.tensor(idx, device=device))
                first.append(idx[0])
                dt += [ecd_dt(sl.group["lr"], eta)] * len(idx)
            else:
                of_slice.append(torch.tensor([s], device=device))
                first.append(s)
                dt.append(ecd_dt(sl.group["lr"], eta))
            if per_tensor and self._kernels is None:
                sizes = torch.tensor([params[j].numel() // self._R for j in idx], device=device)
                units = torch.arange(len(idx), dtype=torch.int32, device=device)  # 4 bytes
                columns.append(torch.repeat_interleave(units, sizes,  # per column, read a step
                                                       output_size=sl.stop - sl.start))
            else:
                columns.append(None)
        if by_parameter:  # units are parameters, in parameter order
            order = [j for sl in self._layout for j in sl.indices]
            dt = [dt[order.index(j)] for j in range(len(params))]
        if per_tensor:
            block = torch.tensor(self._block, device=device)
            same = (block[:, None] == block[None, :]).double()
        else:
            same = torch.ones(len(dt), len(dt), dtype=torch.float64, device=device)
        self._units = _Units(torch.tensor(dt, dtype=torch.float64, device=device), same,
                             of_slice, first, columns, self._rates())

    def state_dict(self) -> dict:
        """torch's optimizer state plus ``"ecd"``: step counters, which members have started and
        the chaos generators' states."""
        self._settle()
        state = super().state_dict()
        state["ecd"] = {"steps": self.steps, "skipped_steps": self.skipped_steps,
                        "started": list(self._started),
                        "generators": [g.get_state() for g in self._generators]}
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a :meth:`state_dict` written by ECD (also its step counts and the flat velocity)."""
        state_dict = dict(state_dict)
        extra = state_dict.pop("ecd", None)
        if extra is None:
            raise ValueError("this state dict was not written by ECD (it has no 'ecd' entry): "
                             "an optimizer's state loads only into an optimizer of its kind")
        R, states = self._R, extra["generators"]
        if len(states) != R:
            raise ValueError(f"this state is of {len(states)} stacked models, this optimizer "
                             f"moves {R}: load it into an ECD built with members={len(states)}")
        super().load_state_dict(state_dict)
        self._pending, self._units = None, None
        steps, skipped = extra["steps"], extra["skipped_steps"]
        self._moved = list(steps) if isinstance(steps, list) else [int(steps)] * R
        self._skipped = list(skipped) if isinstance(skipped, list) else [int(skipped)] * R
        for g, s in zip(self._generators, states):
            g.set_state(s.cpu())  # set_state takes CPU bytes
        params = self._params()
        self._flat, self._layout = {}, []
        started = all("velocity" in self.state[p] for p in params)
        self._started = list(extra.get("started", [started] * R))
        if started:  # back into flat buffers
            self._attach(self._concatenate([self.state[p]["velocity"] for p in params]))


def _dots(u: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Row-wise ``u_r . g_r`` of ``[R, n]`` tensors, float64 ``[R]``: on a CPU one BLAS dot per
    row; on a device the product's rows summed by one reduction kernel, in float64 (a batched
    matrix product of row vectors with n ~ 10^7 runs on a few of a GPU's cores: on an H200 three
    rows of 12.6M took 24 ms, against about 1 ms for one row). 16-bit tensors are multiplied in
    float32: in their own dtype the sum overflows (float16 tops out at 65504)."""
    if u.element_size() < 4:
        u, g = u.float(), g.float()
    if u.device.type == "cpu":
        return torch.stack([torch.dot(a, b) for a, b in zip(u, g)]).double()
    return (u * g).sum(dim=1, dtype=torch.float64)


def _on_device(t: torch.Tensor) -> bool:
    """Whether ECD's steps run without reading scalars to the host: off the CPU (on a CPU the
    host and the arithmetic are one, and the host path computes its scalars exactly)."""
    return t.device.type != "cpu"


class _Slice(NamedTuple):
    """One parameter group's parameters of one dtype: columns ``start:stop`` of the flat
    velocity ``flat[dtype] [R, N]`` (see :meth:`ECD._attach`)."""
    group: dict
    dtype: torch.dtype
    start: int
    stop: int
    indices: list[int]  # the parameters' positions in ECD._params()
    param_rows: list[torch.Tensor]  # per parameter: its rows [R, n_j]
    # per member r: its parameter rows and velocity rows, [n_j] each
    per_member: list[tuple[list[torch.Tensor], list[torch.Tensor]]]


class _Units(NamedTuple):
    """Constants of :meth:`ECD._step_on_device` (see :meth:`ECD._prepare_units`)."""
    dt: torch.Tensor  # [U] float64
    same: torch.Tensor  # [U, U] float64, 1 where two units share a dot product
    of_slice: list[torch.Tensor]  # per slice: its units
    first: list[int]  # per slice: its first unit
    columns: list[torch.Tensor | None]  # per slice: each column's unit within the slice
    rates: tuple  # (eta, the groups' learning rates) they were computed for


class _Segments(NamedTuple):
    """Consecutive column segments of ``[R, N]`` rows (one per parameter), and how a device
    reduces them: each segment cut into ``pieces`` of at most ``PIECE`` columns (lengths for the
    flattened rows, member-major), ``counts`` pieces per segment. A device's segmented reduction
    sums each segment with one thread block, so a long segment (a 1.9M-scalar embedding) would
    keep one block busy while the others wait: equal short pieces keep every block busy."""
    sizes: list[int]
    pieces: torch.Tensor  # [R x pieces per member]
    counts: torch.Tensor  # [R x len(sizes)]

    PIECE = 1 << 15

    @classmethod
    def of(cls, sizes: list[int], R: int, device) -> _Segments:
        pieces, counts = [], []
        for n in sizes:
            k = max(1, -(-n // cls.PIECE))  # ceil(n / PIECE) pieces of nearly equal length
            pieces += [n // k + (i < n % k) for i in range(k)]
            counts.append(k)
        return cls(sizes, torch.tensor(pieces * R, device=device),
                   torch.tensor(counts * R, device=device))


def _segment_dots(u: torch.Tensor, g: torch.Tensor, segments: _Segments,
                  segmented: bool | None = None) -> torch.Tensor:
    """Row-wise dot products of ``u, g [R, N]`` over the column segments, float64 ``[R, S]``.
    ``segmented`` (default: off the CPU) sums the flattened product piece by piece in one
    segmented reduction, then the pieces of each segment in float64 in another: a few kernels
    whatever the number of segments. Otherwise one BLAS dot per segment (on a CPU faster, and
    summed more accurately than a running sum). 16-bit tensors are multiplied and summed in
    float32."""
    if segmented is None:
        segmented = u.device.type != "cpu"
    if not segmented:  # one dot per member and segment, stacked once
        R, sizes, wide = u.shape[0], segments.sizes, u.element_size() < 4
        dots = [torch.dot(a.float(), b.float()) if wide else torch.dot(a, b)
                for r in range(R) for a, b in zip(u[r].split(sizes), g[r].split(sizes))]
        return torch.stack(dots).view(R, -1).double()
    if u.element_size() < 4:
        u, g = u.float(), g.float()
    pieces = torch.segment_reduce((u * g).view(-1), "sum", lengths=segments.pieces, unsafe=True)
    sums = torch.segment_reduce(pieces.double(), "sum", lengths=segments.counts, unsafe=True)
    return sums.view(u.shape[0], -1)


OPTIMIZERS = {"ecd": ECD, "adamw": adamw, "sgdm": sgdm, "muon": muon, "soap": soap}


def make_optimizer(name: str, params: Iterable, **hp):
    """Build an optimizer by name, with the library's defaults; these are not all the
    symmetry-breaking paper's (whose AdamW has betas (0.9, 0.999) and weight decay 0, and whose
    SGDM starts from a random velocity): the ``paper`` preset
    (:mod:`gaugebook.experiment`) passes the paper's values.

    - ``"ecd"``: :class:`ECD` (needs ``lr``, ``eta``, ``F0``).
    - ``"adamw"``: ``torch.optim.AdamW``, betas (0.9, 0.95) as in nanoGPT, torch's weight decay
      0.01, ``fused=True`` when every parameter is on CUDA or the CPU (unless ``foreach`` is
      given).
    - ``"sgdm"``: ``torch.optim.SGD`` with Nesterov momentum 0.95, from zero velocity (a run's
      ``init_velocity_std``, :class:`~gaugebook.run_config.RunConfig`, draws a random one).
    - ``"muon"``: ``torch.optim.Muon`` (``adjust_lr_fn="match_rms_adamw"``, so it shares AdamW's
      ``lr`` and ``weight_decay``, default 0.1) for the matrices that act on the residual stream:
      the weights of linear layers and, one head at a time, the per-head attention weights
      (``HEAD_MATRICES``: ``W_Q``, ``W_K``, ``W_V``, ``W_O`` and gated RoPE's ``W_GQ``,
      ``W_GK``, ``[heads, ., .]``); biases (per-head ones included),
      LayerNorm gains and the embeddings and output head (names containing ``wte``, ``wpe``,
      ``embed``, ``lm_head``) go to AdamW. ``params`` must be ``(name, parameter)`` pairs such as
      ``model.named_parameters()``. Returns a :class:`~gaugebook.baselines.MultiOptimizer`.
    - ``"soap"``: ``SOAP`` from ``pytorch_optimizer`` (its default betas (0.95, 0.95)).

    ``lr`` is required for every optimizer; other keyword arguments go to the constructor.
    """
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; valid names: {', '.join(OPTIMIZERS)}")
    if "lr" not in hp:
        raise ValueError(f"make_optimizer({name!r}, ...) needs a learning rate: pass lr=...")
    return OPTIMIZERS[name](params, **hp)
