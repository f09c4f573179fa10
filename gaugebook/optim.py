r"""Energy Conserving Descent (ECD), and the baseline optimizers of the experiment (chapter 15-17).

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
optimizer state of AdamW.

:func:`make_optimizer` builds ECD and the library baselines (AdamW, SGD with Nesterov momentum,
Muon, SOAP) by name, for the experiment runner.
"""
from __future__ import annotations

import math
import warnings
from typing import Callable, Iterable

import torch
import torch.distributed as dist
from torch.optim import Optimizer

__all__ = ["ECD", "MultiOptimizer", "make_optimizer", "OPTIMIZERS", "PROJECTIONS"]

PROJECTIONS = ("global", "per_tensor")


def _number(name: str, value, *, low: float, strict: bool) -> float:
    """``value`` as a finite float ``> low`` (``strict``) or ``>= low``; ValueError otherwise."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number, got {value!r}") from None
    if not math.isfinite(x) or (x <= low if strict else x < low):
        relation = ">" if strict else ">="
        raise ValueError(f"{name} must be finite and {relation} {low:g}, got {value!r}")
    return x


def _dot(u: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``u . g`` over all entries, as a float64 scalar. 16-bit tensors are multiplied and summed
    in float32: in their own dtype the sum overflows (float16 tops out at 65504)."""
    if u.element_size() < 4:
        u, g = u.float(), g.float()
    return torch.dot(u.reshape(-1), g.reshape(-1)).double()


def _finite(name: str, value) -> float:
    """``value`` as a finite float; ValueError otherwise."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        x = math.nan
    if not math.isfinite(x):
        raise ValueError(f"{name} must be a finite real number, got {value!r}")
    return x


def _mean_over_ranks(value: torch.Tensor) -> torch.Tensor:
    """Average a scalar over the ranks of an initialised process group (DDP); identity otherwise."""
    if dist.is_available() and dist.is_initialized():
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)  # AVG is NCCL-only; SUM works on every backend
        value /= dist.get_world_size()
    return value


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

    Args:
        params: parameters or parameter groups. ``lr`` and ``weight_decay`` may differ between
            groups (the group's :math:`\Delta t` and :math:`\lambda`); ``eta``, ``F0``, ``nu``,
            ``projection`` and ``foreach`` are shared by all groups.
        lr: :math:`\gamma`; each step moves the parameters by :math:`\Delta t = \gamma/\sqrt\eta`
            times the (nearly unit) velocity.
        eta: :math:`\eta > 0`, the concentration of the ergodic measure
            :math:`\propto (F - F_0)^{-\eta d/2}` at low loss.
        F0: :math:`F_0`, below every loss the run reaches (the paper uses about 0.6 times the
            final loss). A step with :math:`F \le F_0` is skipped and counted in
            :attr:`skipped_steps`; a warning (once per optimizer) suggests lowering ``F0``.
        nu: :math:`\nu \ge 0`, size of the random rotation of :math:`v` after each step: each
            coordinate is perturbed by :math:`\nu/\sqrt d`, so the perturbation has length about
            :math:`\nu` and :math:`v` turns by an angle of order :math:`\nu` whatever ``d`` (about
            :math:`\arctan\nu` for large ``d``).
        weight_decay: :math:`\lambda \ge 0`, an L2 term :math:`\tfrac{\lambda}{2}|\theta|^2` added
            to the loss (and :math:`\lambda\theta` to its gradient), not decoupled.
        projection: ``"global"`` (default, the exact geometry) or ``"per_tensor"``: the authors'
            shortcut, in which the dot product is taken within each tensor,
            :math:`v_i \leftarrow v_i - \kappa\,\Delta t\,(g_i - v_i (v_i\cdot g_i))/(F - F_0)`,
            while the normalisation of :math:`v` stays global (as in their published ``ECD_q1``
            code). It is not a projection orthogonal to :math:`v` and breaks the O(d) symmetry.
        foreach: ``None`` or ``True`` (default): the fast path, on every device. The velocities
            of one dtype are views into one flat buffer, the gradients are copied into one flat
            buffer per dtype for the step (a transient of the size of the parameters), and the
            dot products, norms and updates take a few kernels (flat tensor ops and
            ``torch._foreach_*``) whatever the number of tensors. ``False``: the reference path,
            one tensor at a time. Both compute the same numbers up to round-off.

    ``step(closure)`` needs a closure that zeroes the gradients, computes the loss, calls
    ``backward()`` and returns the loss. Parameters whose ``.grad`` is ``None`` count as having a
    zero gradient (they still drift with :math:`v`). Under DDP (an initialised
    ``torch.distributed`` process group) :math:`F` is averaged over the ranks before the step; the
    gradients are already averaged by DDP. The random numbers of the chaos term come from a
    generator owned by the optimizer, seeded from torch's global generator at construction (one
    draw; under DDP rank 0's draw, broadcast) and saved by :meth:`state_dict`, so a resumed run is
    identical to an uninterrupted one.

    Attributes:
        steps: number of steps taken. skipped_steps: number of steps skipped because
        :math:`F \le F_0`. Both are saved and restored by ``state_dict``/``load_state_dict``.
    """

    def __init__(self, params, lr: float, eta: float, F0: float, *, nu: float = 0.0,
                 weight_decay: float = 0.0, projection: str = "global",
                 foreach: bool | None = None):
        defaults = dict(lr=lr, eta=eta, F0=F0, nu=nu, weight_decay=weight_decay,
                        projection=projection, foreach=foreach)
        self._validate_group(defaults)
        super().__init__(params, defaults)
        params = self._params()
        if len({p.device for p in params}) > 1:
            devices = sorted(str(d) for d in {p.device for p in params})
            raise ValueError("ECD moves all parameters along one unit velocity: put them on one "
                             f"device, got {devices}")
        if self.dimension < 2:
            raise ValueError(f"ECD needs at least 2 trainable scalars (kappa has d - 1 in the "
                             f"denominator), got d = {self.dimension}")
        self.steps = 0
        self.skipped_steps = 0
        self._generator = torch.Generator(device=params[0].device)
        self._generator.manual_seed(self._chaos_seed(params[0].device))
        self._flat: dict[torch.dtype, torch.Tensor] = {}  # velocity storage, set on the first step
        self._layout: list = []
        self._workspace: dict[torch.dtype, torch.Tensor] | None = None  # CPU gradient copies
        self._warned = False

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
        _number("lr", group["lr"], low=0.0, strict=True)
        _number("eta", group["eta"], low=0.0, strict=True)
        _number("nu", group["nu"], low=0.0, strict=False)
        _number("weight_decay", group["weight_decay"], low=0.0, strict=False)
        _finite("F0", group["F0"])
        if group["projection"] not in PROJECTIONS:
            raise ValueError(f"projection must be one of {PROJECTIONS}, "
                             f"got {group['projection']!r}")
        if group["foreach"] not in (None, True, False):
            raise ValueError(f"foreach must be None, True or False, got {group['foreach']!r}")

    def add_param_group(self, param_group: dict) -> None:
        if getattr(self, "steps", 0) > 0:
            raise ValueError("ECD keeps one velocity over all parameters: parameter groups "
                             "cannot be added after the first step")
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        self._validate_group(group)
        for p in group["params"]:
            if not p.is_floating_point() or p.is_complex():
                raise ValueError(f"ECD optimises real floating-point parameters, "
                                 f"got dtype {p.dtype}")
        for key in ("eta", "F0", "nu", "projection", "foreach"):
            if group[key] != self.param_groups[0][key]:
                raise ValueError(f"{key} is shared by all parameter groups of ECD: got "
                                 f"{group[key]!r} in a group and {self.param_groups[0][key]!r} "
                                 "in the first")

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    @property
    def dimension(self) -> int:
        """``d``: the number of scalars optimised, over all parameter groups."""
        return sum(p.numel() for p in self._params())

    def _shared(self, key: str):
        values = {group[key] for group in self.param_groups}
        if len(values) > 1:
            raise ValueError(f"{key} is shared by all parameter groups of ECD, "
                             f"found {sorted(values)}")
        return values.pop()

    def _use_foreach(self) -> bool:
        return self._shared("foreach") is not False  # None (default) and True: the fast path

    # Storage: the velocities of all parameters of one dtype are views into one flat buffer, so
    # that the fast path reduces and updates them with a few kernels whatever the number of
    # tensors. Parameters are numbered in group order; a bucket holds one dtype's parameters.

    def _buckets(self) -> dict[torch.dtype, list[int]]:
        buckets: dict[torch.dtype, list[int]] = {}
        for i, p in enumerate(self._params()):
            buckets.setdefault(p.dtype, []).append(i)
        return buckets

    def _slices(self):
        """``(group, dtype, start, stop, indices)``: the group's parameters of one dtype occupy
        ``flat[dtype][start:stop]``."""
        params, offset, i, out = self._params(), {}, 0, []
        for group in self.param_groups:
            members: dict[torch.dtype, list[int]] = {}
            for _ in group["params"]:
                members.setdefault(params[i].dtype, []).append(i)
                i += 1
            for dtype, idx in members.items():
                start = offset.get(dtype, 0)
                offset[dtype] = start + sum(params[j].numel() for j in idx)
                out.append((group, dtype, start, offset[dtype], idx))
        return out

    def _views(self, flat: torch.Tensor, idx: list[int]) -> list[torch.Tensor]:
        """``flat`` cut into the shapes of the parameters ``idx``."""
        params = self._params()
        return [view.view_as(params[j])
                for j, view in zip(idx, flat.split([params[j].numel() for j in idx]))]

    def _attach(self, flat: dict[torch.dtype, torch.Tensor]) -> None:
        """Make ``state[p]["velocity"]`` the views of ``p``'s slice of the flat buffers. The
        parameter groups are fixed from now on, so their layout is kept, with each slice's
        parameters and velocity views (the fast path then builds no lists per step)."""
        self._flat, self._layout = flat, []
        params = self._params()
        for dtype, idx in self._buckets().items():
            for j, view in zip(idx, self._views(flat[dtype], idx)):
                self.state[params[j]]["velocity"] = view
        for group, dtype, start, stop, idx in self._slices():
            members = [params[j] for j in idx]
            velocities = [self.state[p]["velocity"] for p in members]
            self._layout.append((group, dtype, start, stop, idx, members, velocities))

    def _noise(self) -> dict[torch.dtype, torch.Tensor]:
        """z ~ N(0, I), one flat vector per dtype, from the optimizer's own generator."""
        return {dtype: torch.randn(v.numel(), generator=self._generator, device=v.device,
                                   dtype=dtype) for dtype, v in self._flat.items()}

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None):
        """One ECD step; ``closure`` (required) recomputes the loss and its gradient."""
        if closure is None:
            raise ValueError("ECD.step needs the loss, not only the gradient: pass a closure that "
                             "zeroes the gradients, computes the loss, calls loss.backward() and "
                             "returns the loss, e.g. opt.step(closure)")
        with torch.enable_grad():
            loss = closure()
        eta, F0, nu = (float(self._shared(key)) for key in ("eta", "F0", "nu"))
        projection, foreach = self._shared("projection"), self._use_foreach()
        params = self._params()
        d, first = self.dimension, not self._flat

        # F (averaged over DDP ranks) + the L2 term; gradients of F; dot products v.g (g.g on
        # the first step, which sets v = -g/|g|): per tensor, or per dtype on the global fast path.
        F_loss = _mean_over_ranks(torch.as_tensor(loss).detach().to(params[0].device, torch.float64))
        gather = self._gather_foreach if foreach else self._gather_reference
        grads, penalty, dots = gather(first, per_tensor=projection == "per_tensor")
        scalars = torch.cat([torch.stack([F_loss, penalty]), dots.double()]).tolist()  # one sync
        F_loss, penalty, *dots = scalars
        if not math.isfinite(F_loss):
            raise FloatingPointError(f"ECD step {self.steps + 1}: the loss is {F_loss} (not "
                                     "finite); check the model, the data and the learning rate")
        if not all(map(math.isfinite, dots)):
            bad = next((i for i, p in enumerate(params)
                        if p.grad is not None and not torch.isfinite(p.grad).all()), None)
            if bad is None:
                raise FloatingPointError(f"ECD step {self.steps + 1}: the gradients are finite "
                                         "but the dot product v.g overflowed")
            raise FloatingPointError(f"ECD step {self.steps + 1}: the gradient of parameter {bad} "
                                     f"(shape {tuple(params[bad].shape)}) is not finite")
        F = F_loss + penalty
        if F <= F0:
            self.skipped_steps += 1
            if not self._warned:
                warnings.warn(f"ECD: F = {F:.6g} <= F0 = {F0:.6g}, the step is skipped (counted in "
                              "ECD.skipped_steps). Lower F0 below every loss the run can reach.",
                              RuntimeWarning, stacklevel=2)
                self._warned = True
            return loss

        if first:
            g_norm = math.sqrt(math.fsum(dots))
            if g_norm == 0:
                raise ValueError("ECD: the gradient is exactly zero at the first step, so the "
                                 "initial velocity -g/|g| is undefined")
            flat = grads if foreach else self._concatenate(grads)
            self._attach({dtype: g / -g_norm for dtype, g in flat.items()})
            dots = [-x / g_norm for x in dots]  # v.g with v = -g/|g|
        if projection == "global":
            dots = [math.fsum(dots)]
        kappa = eta / 2 * d / (d - 1)
        update = self._update_foreach if foreach else self._update_reference
        update(grads, dots, kappa / (F - F0), nu / math.sqrt(d))
        self.steps += 1
        return loss

    def _raw_gradients(self) -> list[torch.Tensor]:
        grads = []
        for p in self._params():
            if p.grad is not None and p.grad.is_sparse:
                raise ValueError("ECD does not support sparse gradients")
            grads.append(torch.zeros_like(p) if p.grad is None else p.grad)
        return grads

    def _concatenate(self, tensors: list[torch.Tensor],
                     out: dict[torch.dtype, torch.Tensor] | None = None):
        """One flat copy of ``tensors`` per dtype, written into ``out[dtype]`` when given."""
        flat = {dtype: [tensors[j].reshape(-1) for j in idx]
                for dtype, idx in self._buckets().items()}
        return {dtype: torch.cat(ts) if out is None else torch.cat(ts, out=out[dtype])
                for dtype, ts in flat.items()}

    def _gather_reference(self, first: bool, per_tensor: bool):
        """Gradients ``g + wd theta`` per tensor, the L2 term, and one dot product per tensor."""
        grads, penalty, i = self._raw_gradients(), 0.0, 0
        velocities = [self.state[p].get("velocity") for p in self._params()]
        for group in self.param_groups:
            for p in group["params"]:
                if group["weight_decay"] != 0:
                    grads[i] = grads[i] + group["weight_decay"] * p
                    penalty = penalty + group["weight_decay"] / 2 * (p.double() ** 2).sum()
                i += 1
        left = grads if first else velocities
        dots = torch.stack([_dot(u, g) for u, g in zip(left, grads)])
        return grads, torch.as_tensor(penalty, dtype=torch.float64, device=dots.device), dots

    def _gather_foreach(self, first: bool, per_tensor: bool):
        """The same with flat gradients: one dot product per dtype (global projection) or per
        tensor (per-tensor projection)."""
        params = self._params()
        grads = self._concatenate(self._raw_gradients(), self._workspace)  # copies: safe to modify
        if params[0].device.type == "cpu":
            # A CPU allocator hands large blocks back to the system, so a fresh buffer per step
            # costs page faults (more than the copy): keep it. CUDA's caching allocator reuses
            # the block by itself, and a kept buffer would raise the peak memory of training.
            self._workspace = grads
        penalty = torch.zeros((), dtype=torch.float64, device=params[0].device)
        for group, dtype, start, stop, idx, *_ in self._layout or self._slices():
            if group["weight_decay"] != 0:
                members = [params[j] for j in idx]
                torch._foreach_add_(self._views(grads[dtype][start:stop], idx), members,
                                    alpha=group["weight_decay"])
                norms = torch.stack(torch._foreach_norm(members)).double()
                penalty += group["weight_decay"] / 2 * (norms ** 2).sum()
        left = grads if first else self._flat
        if per_tensor:  # one dot product per tensor, on views of the flat buffers
            dots = [None] * len(params)
            for dtype, idx in self._buckets().items():
                sizes = [params[j].numel() for j in idx]
                for j, u, g in zip(idx, left[dtype].split(sizes), grads[dtype].split(sizes)):
                    dots[j] = _dot(u, g)
        else:
            dots = [_dot(left[dtype], g) for dtype, g in grads.items()]
        return grads, penalty, torch.stack(dots)

    def _update_reference(self, grads, v_dot_g, kick, chaos) -> None:
        """Kick, drift and renormalise, one tensor at a time (the readable path)."""
        params = self._params()
        velocities = [self.state[p]["velocity"] for p in params]
        sqrt_eta, i = math.sqrt(float(self._shared("eta"))), 0
        for group in self.param_groups:
            dt = group["lr"] / sqrt_eta
            for p in group["params"]:
                v, g = velocities[i], grads[i]
                vg = v_dot_g[0] if len(v_dot_g) == 1 else v_dot_g[i]  # global or per tensor
                v.sub_(kick * dt * (g - v * vg))  # kick: g's component orthogonal to v
                p.add_(v, alpha=dt)  # drift
                i += 1
        self._normalise_reference(velocities)
        if chaos > 0:
            noise = self._noise()
            for dtype, idx in self._buckets().items():
                for j, z in zip(idx, self._views(noise[dtype], idx)):
                    velocities[j].add_(z, alpha=chaos)
            self._normalise_reference(velocities)

    @staticmethod
    def _normalise_reference(velocities) -> None:
        speed = torch.stack([torch.linalg.vector_norm(v).double() for v in velocities]).norm()
        for v in velocities:
            v.div_(speed)

    def _update_foreach(self, grads, v_dot_g, kick, chaos) -> None:
        """The same update on the flat buffers, a few kernels per (group, dtype) slice.

        Global projection: the kicked velocity ``a v - c g`` (``a = 1 + c v.g``) is formed in one
        pass as ``s * lerp(v, g, -c/s)`` with ``s = a - c``; the buffer keeps the lerp, the drift
        and the normalisation apply the factor ``s``. (When ``s`` is near zero, two passes.)"""
        sqrt_eta, slices = math.sqrt(float(self._shared("eta"))), []
        for group, dtype, start, stop, idx, members, velocities in self._layout:
            dt = group["lr"] / sqrt_eta
            v, g, c, scale = self._flat[dtype][start:stop], grads[dtype][start:stop], kick * dt, 1.0
            if len(v_dot_g) == 1:  # global projection
                a = 1.0 + c * v_dot_g[0]
                if abs(a - c) > 1e-3 * (abs(a) + c):
                    scale = a - c
                    v.lerp_(g, -c / scale)
                else:
                    v.mul_(a).add_(g, alpha=-c)
            else:  # per tensor: v_i (1 + c v_i.g_i) - c g_i
                torch._foreach_mul_(velocities, [1.0 + c * v_dot_g[j] for j in idx])
                v.add_(g, alpha=-c)
            torch._foreach_add_(members, velocities, alpha=dt * scale)  # drift
            slices.append((v, scale))
        self._normalise_foreach(slices)
        if chaos > 0:
            for dtype, z in self._noise().items():
                self._flat[dtype].add_(z, alpha=chaos)
            self._normalise_foreach([(v, 1.0) for v in self._flat.values()])

    @staticmethod
    def _normalise_foreach(slices) -> None:
        """Each buffer ``u`` of ``slices = [(u, s), ...]`` holds its part of the velocity divided
        by ``s``: rescale them all to the unit velocity ``s u / |velocity|``."""
        speed = torch.stack([s * s * _dot(u, u) for u, s in slices]).sum().sqrt()
        for u, s in slices:
            u.mul_(s / speed)

    def state_dict(self) -> dict:
        """torch's optimizer state plus ``"ecd"``: step counters and the chaos generator's state."""
        state = super().state_dict()
        state["ecd"] = {"steps": self.steps, "skipped_steps": self.skipped_steps,
                        "generator": self._generator.get_state()}
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        extra = state_dict.pop("ecd", None)
        super().load_state_dict(state_dict)
        if extra is not None:
            self.steps, self.skipped_steps = int(extra["steps"]), int(extra["skipped_steps"])
            self._generator.set_state(extra["generator"].cpu())  # set_state takes CPU bytes
        params = self._params()
        self._flat, self._layout = {}, []
        if all("velocity" in self.state[p] for p in params):  # back into flat buffers
            self._attach(self._concatenate([self.state[p]["velocity"] for p in params]))


class MultiOptimizer:
    """Several optimizers over disjoint parameters, driven as one (e.g. Muon + AdamW).

    ``step(closure)`` evaluates the closure once and then steps every optimizer;
    ``param_groups`` and ``state`` are the union of theirs; ``state_dict`` nests theirs.
    """

    def __init__(self, *optimizers: Optimizer):
        if not optimizers:
            raise ValueError("MultiOptimizer needs at least one optimizer")
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict]:
        return [group for opt in self.optimizers for group in opt.param_groups]

    @property
    def state(self) -> dict:
        return {p: s for opt in self.optimizers for p, s in opt.state.items()}

    def step(self, closure: Callable[[], torch.Tensor] | None = None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for opt in self.optimizers:
            opt.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"optimizers": [opt.state_dict() for opt in self.optimizers]}

    def load_state_dict(self, state_dict: dict) -> None:
        states = state_dict["optimizers"]
        if len(states) != len(self.optimizers):
            raise ValueError(f"state_dict holds {len(states)} optimizers, this MultiOptimizer has "
                             f"{len(self.optimizers)}")
        for opt, state in zip(self.optimizers, states):
            opt.load_state_dict(state)


def _is_embedding(name: str) -> bool:
    return any(key in name for key in ("wte", "wpe", "embed", "lm_head"))


def _muon(params, lr, *, weight_decay=0.1, betas=(0.9, 0.95), **muon_hp) -> MultiOptimizer:
    """Muon for the 2-D weight matrices, AdamW (same lr and weight decay) for the rest."""
    params = list(params)
    if any(isinstance(p, dict) for p in params):
        raise ValueError("make_optimizer('muon', ...) takes parameters or (name, parameter) pairs, "
                         "not parameter groups")
    named = [(None, p) if isinstance(p, torch.Tensor) else tuple(p) for p in params]
    matrices = [p for n, p in named if p.ndim == 2 and not (n and _is_embedding(n))]
    others = [p for n, p in named if not (p.ndim == 2 and not (n and _is_embedding(n)))]
    muon_hp.setdefault("adjust_lr_fn", "match_rms_adamw")
    optimizers = []
    if matrices:
        optimizers.append(torch.optim.Muon(matrices, lr=lr, weight_decay=weight_decay, **muon_hp))
    if others:
        optimizers.append(_adamw(others, lr=lr, weight_decay=weight_decay, betas=betas))
    return MultiOptimizer(*optimizers)


def _tensors(params) -> list[torch.Tensor]:
    """The tensors in a list of parameters, ``(name, parameter)`` pairs or parameter groups."""
    out = []
    for item in params:
        items = item["params"] if isinstance(item, dict) else [item]
        out += [p[1] if isinstance(p, tuple) else p for p in items]
    return out


def _adamw(params, lr, **hp) -> torch.optim.AdamW:
    params = list(params)
    hp.setdefault("betas", (0.9, 0.95))
    if "foreach" not in hp:  # torch's fused kernel exists for CUDA and CPU parameters
        hp.setdefault("fused", all(p.device.type in ("cuda", "cpu") for p in _tensors(params)))
    return torch.optim.AdamW(params, lr=lr, **hp)


def _sgdm(params, lr, *, momentum=0.95, nesterov=True, **hp) -> torch.optim.SGD:
    return torch.optim.SGD(params, lr=lr, momentum=momentum, nesterov=nesterov, **hp)


def _soap(params, lr, **hp):
    from pytorch_optimizer import SOAP

    return SOAP(params, lr=lr, **hp)


OPTIMIZERS = {"ecd": ECD, "adamw": _adamw, "sgdm": _sgdm, "muon": _muon, "soap": _soap}


def make_optimizer(name: str, params: Iterable, **hp):
    """Build an optimizer by name, with the paper's defaults where it states them.

    - ``"ecd"``: :class:`ECD` (needs ``lr``, ``eta``, ``F0``).
    - ``"adamw"``: ``torch.optim.AdamW``, betas (0.9, 0.95), ``fused=True`` when every parameter
      is on CUDA or the CPU (unless ``foreach`` is given).
    - ``"sgdm"``: ``torch.optim.SGD`` with Nesterov momentum 0.95.
    - ``"muon"``: ``torch.optim.Muon`` (``adjust_lr_fn="match_rms_adamw"``, so it shares AdamW's
      ``lr`` and ``weight_decay``, default 0.1) for the 2-D weight matrices; Muon accepts only 2-D
      parameters, so everything else (biases, LayerNorm gains, per-head 3-D attention weights) and,
      when ``params`` are ``(name, parameter)`` pairs such as ``model.named_parameters()``, the
      embeddings and output head (names containing ``wte``, ``wpe``, ``embed``, ``lm_head``) go to
      AdamW. Returns a :class:`MultiOptimizer`.
    - ``"soap"``: ``SOAP`` from ``pytorch_optimizer`` (its default betas (0.95, 0.95)).

    ``lr`` is required for every optimizer; other keyword arguments go to the constructor.
    """
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; valid names: {', '.join(OPTIMIZERS)}")
    if "lr" not in hp:
        raise ValueError(f"make_optimizer({name!r}, ...) needs a learning rate: pass lr=...")
    return OPTIMIZERS[name](params, **hp)
