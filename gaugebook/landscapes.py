r"""Toy loss landscapes and the simple integrators that the book runs on them (chapters 14-15).

**Landscapes** take points ``x [..., 2]`` and return ``F [...]`` (differentiable, any float dtype):

* :func:`rosenbrock`: ``(a - x_1)^2 + b (x_2 - x_1^2)^2``, a curved valley, minimum 0 at
  ``(a, a^2)``.
* :func:`multiwell`: :math:`(x_1^2 - 1)^2 + (x_2^2 - 1)^2 + c \cdot x`, four wells near
  :math:`(\pm 1, \pm 1)`; the tilt ``c`` makes them unequal.
* :func:`sombrero`: :math:`(|x|^2 - 1)^2 + c \cdot x`, the Mexican hat: rotationally symmetric for
  ``c = 0``, its brim tilted otherwise.

**Integrators** move lists of float64 tensors ``theta`` (and momenta ``p``) out of place; the
gradient is a callable ``grad(theta, k) -> list`` that may depend on the step ``k`` (e.g. through
a bias resampled every step):

* :func:`leapfrog` (kick ``h/2``, drift ``h``, kick ``h/2``): symplectic, for
  ``H = |p|^2/2 + L(theta)``;
* :func:`explicit_euler` (``theta += h p`` and ``p -= h grad L`` from the same old state);
* :func:`gradient_descent` (``theta -= lr grad L``), the discretised gradient flow.

**ECD** (chapter 15): :func:`ecd_path` is a reference implementation of the :math:`q = 1` map of
:class:`gaugebook.optim.ECD` on a single point, with a choice of initial velocity, per-step shifts
of the landscape and the chaos term; :func:`optimizer_path` runs any ``torch.optim`` optimizer
(ECD included) on a point. :func:`angular_momentum` is ``x_1 v_2 - x_2 v_1``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

import torch

from gaugebook.checks import check_finite, check_number
from gaugebook.optim import ecd_dt, ecd_kappa

__all__ = ["rosenbrock", "multiwell", "sombrero", "angular_momentum", "leapfrog",
           "explicit_euler", "gradient_descent", "ECDPath", "ecd_path",
           "OptimizerPath", "optimizer_path"]

Tensors = list[torch.Tensor]
Gradient = Callable[[Tensors, int], Tensors]


def _check_points(x: torch.Tensor) -> None:
    if x.shape[-1:] != (2,):
        raise ValueError(f"points must have shape [..., 2], got {tuple(x.shape)}")


def _tilt(x: torch.Tensor, tilt) -> torch.Tensor:
    c = torch.as_tensor(tilt, dtype=x.dtype, device=x.device)
    if c.shape != (2,):
        raise ValueError(f"tilt must have two components, got shape {tuple(c.shape)}")
    return x @ c  # (...,)


def rosenbrock(x: torch.Tensor, a: float = 1.0, b: float = 100.0) -> torch.Tensor:
    """``(a - x_1)^2 + b (x_2 - x_1^2)^2``; minimum 0 at ``(a, a^2)``."""
    _check_points(x)
    return (a - x[..., 0]) ** 2 + b * (x[..., 1] - x[..., 0] ** 2) ** 2


def multiwell(x: torch.Tensor, tilt=(0.3, 0.2)) -> torch.Tensor:
    """``(x_1^2 - 1)^2 + (x_2^2 - 1)^2 + tilt . x``: four wells near ``(+-1, +-1)``, the lowest
    opposite to the tilt (near ``(-1, -1)`` for the default)."""
    _check_points(x)
    return (x[..., 0] ** 2 - 1) ** 2 + (x[..., 1] ** 2 - 1) ** 2 + _tilt(x, tilt)


def sombrero(x: torch.Tensor, tilt=(0.0, 0.0)) -> torch.Tensor:
    """``(|x|^2 - 1)^2 + tilt . x``: invariant under rotations about 0 when ``tilt = 0`` (its
    minima are then the whole circle ``|x| = 1``)."""
    _check_points(x)
    return ((x ** 2).sum(-1) - 1) ** 2 + _tilt(x, tilt)


def angular_momentum(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``x_1 v_2 - x_2 v_1`` for ``x, v [..., 2]``: the Noether charge of rotations about 0."""
    _check_points(x), _check_points(v)
    return x[..., 0] * v[..., 1] - x[..., 1] * v[..., 0]


# --- Hamiltonian integrators and gradient descent on lists of tensors ---------------------------

def _check_steps(steps: int, shifts: torch.Tensor | None = None, d: int = 0) -> None:
    """ValueError unless ``steps`` is a non-negative integer and ``shifts`` (if any) ``[steps,
    d]``."""
    if not (type(steps) is int and steps >= 0):  # not True, which is an int
        raise ValueError(f"steps must be a non-negative integer, got {steps!r}")
    if shifts is not None and tuple(shifts.shape) != (steps, d):
        raise ValueError(f"shifts must have shape [steps, d] = [{steps}, {d}], "
                         f"got {tuple(shifts.shape)}")


def _check_step(h: float, steps: int) -> None:
    _check_steps(steps)
    if not (math.isfinite(h) and h > 0):
        raise ValueError(f"the step size must be positive and finite, got {h!r}")


def _axpy(a: float, xs: Tensors, ys: Tensors) -> Tensors:
    """``y + a x`` for each pair; ValueError unless the lists match tensor by tensor (``zip``
    would drop a tensor, broadcasting would hide a shape mismatch)."""
    if len(xs) != len(ys) or any(x.shape != y.shape for x, y in zip(xs, ys)):
        raise ValueError(f"the parameters and their momenta (or gradients) must match tensor "
                         f"by tensor, got shapes {[tuple(y.shape) for y in ys]} and "
                         f"{[tuple(x.shape) for x in xs]}")
    return [y + a * x for x, y in zip(xs, ys)]


def leapfrog(theta: Tensors, p: Tensors, grad: Gradient, h: float,
             steps: int) -> tuple[Tensors, Tensors]:
    """``steps`` leapfrog steps of ``H = |p|^2/2 + L``: ``p -= h/2 grad``, ``theta += h p``,
    ``p -= h/2 grad``, with ``grad(theta, k)`` at step ``k`` (both half kicks use step ``k``'s
    landscape). Returns the new ``(theta, p)``."""
    _check_step(h, steps)
    for k in range(steps):
        p = _axpy(-h / 2, grad(theta, k), p)
        theta = _axpy(h, p, theta)
        p = _axpy(-h / 2, grad(theta, k), p)
    return theta, p


def explicit_euler(theta: Tensors, p: Tensors, grad: Gradient, h: float,
                   steps: int) -> tuple[Tensors, Tensors]:
    """``steps`` explicit Euler steps: ``theta' = theta + h p``, ``p' = p - h grad(theta)``."""
    _check_step(h, steps)
    for k in range(steps):
        g = grad(theta, k)
        theta, p = _axpy(h, p, theta), _axpy(-h, g, p)
    return theta, p


def gradient_descent(theta: Tensors, grad: Gradient, lr: float, steps: int) -> Tensors:
    """``steps`` steps of ``theta -= lr grad(theta, k)``."""
    _check_step(lr, steps)
    for k in range(steps):
        theta = _axpy(-lr, grad(theta, k), theta)
    return theta


# --- Energy Conserving Descent on a point ------------------------------------------------------

@dataclass(frozen=True)
class ECDPath:
    """Iterates of :func:`ecd_path`: ``x [n + 1, d]``, unit velocities ``v [n + 1, d]`` (``v[0]``
    the initial one) and losses ``F [n]`` (``F[k]`` at ``x[k]``, as the optimizer sees it)."""

    x: torch.Tensor
    v: torch.Tensor
    F: torch.Tensor


def ecd_path(F: Callable[[torch.Tensor], torch.Tensor], x0, *, lr: float, eta: float, F0: float,
             steps: int, v0=None, shifts: torch.Tensor | None = None, nu: float = 0.0,
             generator: torch.Generator | None = None) -> ECDPath:
    r"""The q = 1 ECD map of :class:`gaugebook.optim.ECD` on one point, in float64.

    With :math:`\Delta t = \mathrm{lr}/\sqrt\eta`, :math:`\kappa = (\eta/2)\,d/(d-1)`, per step:
    :math:`v \leftarrow v - \kappa\Delta t\,(g - v\,(v\cdot g))/(F - F_0)`,
    :math:`x \leftarrow x + \Delta t\, v`, :math:`v \leftarrow v/|v|`, then (``nu > 0``)
    :math:`v \leftarrow (v + (\nu/\sqrt d) z)/|\cdot|`, :math:`z \sim N(0, I)` from ``generator``.

    Args:
        F: landscape, ``x [d] -> scalar``.
        x0: starting point ``[d]``.
        v0: initial velocity (normalised here); ``None`` takes ``-g/|g|`` at the first step
            that moves, as the optimizer does (the velocities recorded before it are that one;
            zero when no step moves).
        shifts: ``[steps, d]`` or ``None``: step ``k`` sees ``F(x + shifts[k])`` (a landscape moved
            by a bias drawn for that step).
        nu: chaos strength.

    Steps with ``F <= F0`` are skipped (nothing moves), as in the optimizer; a non-finite loss or
    gradient raises ``FloatingPointError``, as in the optimizer.
    """
    _check_step(lr, steps)
    if steps < 1:
        raise ValueError("ecd_path needs at least one step")
    eta = check_number("eta", eta, low=0.0, strict=True)
    nu = check_number("nu", nu, low=0.0, strict=False)
    F0 = check_finite("F0", F0)
    x = torch.as_tensor(x0, dtype=torch.float64).clone()
    d = x.numel()
    kappa, dt = ecd_kappa(eta, d), ecd_dt(lr, eta)
    _check_steps(steps, shifts, d)

    def loss_and_grad(x, k):
        point = x.clone().requires_grad_(True)
        loss = F(point if shifts is None else point + shifts[k].to(torch.float64))
        (g,) = torch.autograd.grad(loss, point)
        if not (torch.isfinite(loss) and torch.isfinite(g).all()):
            raise FloatingPointError(f"ecd_path step {k + 1} at x = {x.tolist()}: the loss "
                                     f"{loss.item()} or its gradient {g.tolist()} is not finite")
        return loss.item(), g

    v = start = None  # without v0: -g/|g| at the first step that moves, as the optimizer
    if v0 is not None:
        v = torch.as_tensor(v0, dtype=torch.float64).clone()
        if v.shape != x.shape:
            raise ValueError(f"v0 must have the shape of x0 {tuple(x.shape)}, got {tuple(v.shape)}")
        if v.norm() == 0:
            raise ValueError("the initial velocity v0 is zero")
        v = v / v.norm()
    xs, vs, Fs = [x], [v], []
    for k in range(steps):
        loss, g = loss_and_grad(x, k)
        Fs.append(loss)
        if loss > F0:
            if v is None:
                if g.norm() == 0:
                    raise ValueError(f"the gradient is zero at step {k + 1}, the first that "
                                     "moves, so the initial velocity -g/|g| is undefined")
                v = start = -g / g.norm()
            v = v - kappa * dt * (g - v * (v @ g)) / (loss - F0)  # kick: g's part orthogonal to v
            x = x + dt * v  # drift
            v = v / v.norm()
            if nu > 0:  # chaos: a small random rotation of v
                z = torch.randn(d, generator=generator, dtype=torch.float64)
                v = v + nu / math.sqrt(d) * z
                v = v / v.norm()
        xs.append(x)
        vs.append(v)
    if v is None:  # no step moved: the velocity is undefined, recorded as zero
        start = torch.zeros(d, dtype=torch.float64)
    vs = [start if u is None else u for u in vs]  # the steps before the first that moved
    return ECDPath(torch.stack(xs), torch.stack(vs), torch.tensor(Fs, dtype=torch.float64))


class OptimizerPath(NamedTuple):
    """Iterates of :func:`optimizer_path`; unpacks as ``(x, F)``."""

    x: torch.Tensor  #: [steps + 1, d] the iterates, float64
    F: torch.Tensor  #: [steps] the loss seen at each step, float64


def optimizer_path(F: Callable[[torch.Tensor], torch.Tensor], x0,
                   make_optimizer: Callable[[Sequence[torch.nn.Parameter]], torch.optim.Optimizer],
                   steps: int, *, shifts: torch.Tensor | None = None) -> OptimizerPath:
    """Run a ``torch.optim`` optimizer on the point ``x0`` for ``steps`` steps (through a closure,
    so ECD works too). Returns the iterates and the losses seen at each step
    (:class:`OptimizerPath`, as :func:`ecd_path` returns an :class:`ECDPath`); ``shifts [steps,
    d]`` moves the landscape at each step as in :func:`ecd_path`."""
    point = torch.nn.Parameter(torch.as_tensor(x0, dtype=torch.float64).clone())
    _check_steps(steps, shifts, point.numel())
    opt = make_optimizer([point])
    xs, Fs = [point.detach().clone()], []
    for k in range(steps):
        def closure():
            opt.zero_grad()
            loss = F(point if shifts is None else point + shifts[k].to(torch.float64))
            loss.backward()
            return loss

        loss = opt.step(closure)
        Fs.append(float(loss.detach() if torch.is_tensor(loss) else loss))
        xs.append(point.detach().clone())
    return OptimizerPath(torch.stack(xs), torch.tensor(Fs, dtype=torch.float64))
