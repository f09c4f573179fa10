r"""Hessian-based sharpness, and its minimum over a gauge orbit (chapter 9).

A loss is handled as a function :math:`f(\theta)` of the flat float64 parameter vector
(:class:`FlatLoss` builds one from a model). From it:

* :func:`hessian_vector_product` :math:`H v` by forward-over-reverse differentiation,
  ``jvp(grad f)(theta; v)`` (:mod:`torch.func`), never forming :math:`H`;
* :func:`top_eigenvalue`: the eigenvalue of :math:`H` of largest magnitude by power iteration on
  :math:`v \mapsto H v / \|H v\|` (at a minimum, where :math:`H` is positive semi-definite, the
  largest one; where :math:`H` is indefinite it may be the most negative one);
* :func:`hutchinson_trace`: :math:`\tr H = \mathbb{E}[z^\top H z]` for Rademacher probes
  :math:`z`;
* :func:`hessian`: the full matrix (``torch.func.hessian``), for tiny models and tests.

**Sharpness is not a function property.** A gauge transformation acts on the parameters by an
invertible *linear* map :math:`A` (:math:`W_Q \to W_Q M`, :math:`W_K \to W_K M^{-\top}`, ...)
with :math:`f(A\theta) = f(\theta)` for every :math:`\theta`. Differentiating twice,

.. math::  \nabla^2 f(A\theta) = A^{-\top}\, \nabla^2 f(\theta)\, A^{-1},

a congruence: the spectrum changes although the function does not (Dinh et al. 2017).

**Its minimum over the orbit is.** :func:`minimise_over_orbit` minimises
:math:`\lambda_{\max}(H(g \cdot \theta))` over the QK and VO matrices of every attention layer.
Two facts shrink the search. (1) Orthogonal :math:`M, N` and head permutations make :math:`A`
orthogonal, so they leave the spectrum unchanged; by the polar decomposition :math:`M = P Q`
(:math:`P` symmetric positive definite, :math:`Q` orthogonal, :math:`Q` applied last) the
sharpness depends on :math:`M` only through :math:`P`, and since :math:`M_0 P^2 M_0^\top` runs
over all positive definite matrices when :math:`P` does, searching :math:`P = \exp(S)`, :math:`S`
symmetric, from *any* point :math:`M_0 \cdot \theta` of the orbit reaches every value the orbit
offers. (2) For symmetric positive definite :math:`P, N` the map :math:`A` is self-adjoint, so
:math:`H(g \cdot \theta) = A^{-1} H_0 A^{-1}` with :math:`H_0` the Hessian at the starting
point: every Hessian-vector product is taken at one fixed point and the gradient of
:math:`\lambda = w^\top H_0 w` (:math:`w = A^{-1} v`, :math:`v` the top unit eigenvector,
Hellmann-Feynman) with respect to :math:`S` is :math:`2 (H_0 w)^\top \partial w / \partial S`,
with no third derivatives.

Key- and value-bias translations are not searched (a key-bias shift is a translation along which
:math:`f` is constant, so it does not change :math:`H` at all; the value-bias shift does). RoPE
layers are refused: their QK group is only the commutant of the rotations (chapter 5). So are
models with symmetry-breaking biases (chapter 16): :math:`W_Q \to W_Q M` does not move the
unlearned query bias,
so the orbit is no longer a set of equal-loss points
(:func:`~gaugebook.gauge.gauge_layers` checks both).
"""
from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from scipy.sparse.linalg import LinearOperator, eigsh
from torch import nn
from torch.func import grad, jvp
from tqdm.auto import tqdm

from gaugebook.attention import math_attention
from gaugebook.checks import check_finite_tensors, check_number, check_positive_ints
from gaugebook.gauge import GaugeElement, QKTransform, VOTransform, gauge_layers
from gaugebook.linalg import DTYPE
from gaugebook.redundancy import FlatModel

__all__ = ["FlatLoss", "hessian_vector_product", "hessian", "top_eigenvalue", "TopEigen",
           "hutchinson_trace", "TraceEstimate", "OrbitMinimum", "minimise_over_orbit"]


class FlatLoss(FlatModel):
    r""":math:`f(\theta)` = ``loss(model(*inputs))`` as a function of the flat float64 parameter
    vector :math:`\theta`.

    ``model`` is deep-copied and cast to float64 (inputs too, where floating point); ``loss``
    maps the model's output (a tensor, or the tuple a :class:`~gaugebook.gpt.GPT` returns) to a
    scalar. ``theta`` holds the model's trainable parameters in ``named_parameters`` order. The
    copy is in eval mode (:class:`~gaugebook.redundancy.FlatModel`), so :math:`f` is deterministic:
    no dropout, no resampled biases.
    """

    def __init__(self, model: nn.Module, loss: Callable, *inputs):
        super().__init__(model, *inputs)
        self.loss = loss

    def __call__(self, theta: torch.Tensor) -> torch.Tensor:
        value = self.loss(super().__call__(theta))
        if not torch.is_tensor(value) or value.ndim != 0:
            raise ValueError("loss must return a scalar tensor")
        return value


def hessian_vector_product(f: Callable, theta: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    r""":math:`H(\theta) v = \frac{d}{ds} \nabla f(\theta + s v)` at :math:`s = 0` (forward over
    reverse mode)."""
    with math_attention():
        return jvp(grad(f), (theta,), (v,))[1]


def hessian(f: Callable, theta: torch.Tensor) -> torch.Tensor:
    """The full Hessian ``[n, n]`` (``torch.func.hessian``); only for small :math:`n`."""
    with math_attention():
        return torch.func.hessian(f)(theta)


@dataclass(frozen=True)
class TopEigen:
    r"""Result of :func:`top_eigenvalue`: :math:`H v \approx \lambda v` with :math:`\|v\| = 1`,
    :math:`\lambda` = ``value`` and :math:`v` = ``vector``."""

    value: float
    vector: torch.Tensor
    iterations: int
    residual: float  #: ``|H v - value v| / |value|``


def _power_iteration(apply: Callable, v: torch.Tensor, max_iter: int, rtol: float) -> TopEigen:
    v = v / v.norm()
    previous = None
    for i in range(1, max_iter + 1):
        w = apply(v)
        value = torch.dot(v, w).item()  # Rayleigh quotient at v
        norm = w.norm()
        if norm == 0:
            return TopEigen(0.0, v, i, 0.0)
        residual = ((w - value * v).norm() / abs(value)).item() if value else float("inf")
        if i == max_iter or (previous is not None and abs(value - previous) <= rtol * abs(value)):
            break
        v = w / norm * (1.0 if value >= 0 else -1.0)  # keep the sign stable for value < 0
        previous = value
    return TopEigen(value, v, i, residual)  # value and residual measured at v


def _top_algebraic(apply: Callable, v0: torch.Tensor, rtol: float,
                   max_restarts: int) -> tuple[float, torch.Tensor]:
    r"""The largest (algebraic, not absolute) eigenvalue of the symmetric operator ``apply`` and
    its unit eigenvector, by Lanczos (ARPACK ``eigsh``, ``which="LA"``) warm-started at ``v0``;
    converged to :math:`\|H v - \lambda v\| \le \mathrm{rtol}\, |\lambda|` in at most
    ``max_restarts`` restarts,
    else ``scipy.sparse.linalg.ArpackNoConvergence``."""
    n = v0.numel()

    def matvec(x):  # numpy (n,) on the CPU -> numpy (n,); apply runs on v0's device
        u = torch.from_numpy(np.ascontiguousarray(x).reshape(n)).to(v0)
        return apply(u).detach().cpu().numpy()

    operator = LinearOperator((n, n), matvec=matvec, dtype=np.float64)
    values, vectors = eigsh(operator, k=1, which="LA", v0=v0.detach().cpu().numpy(), tol=rtol,
                            maxiter=max_restarts)
    return values[0].item(), torch.from_numpy(vectors[:, 0]).to(v0)


def top_eigenvalue(f: Callable, theta: torch.Tensor, *, max_iter: int = 1000, rtol: float = 1e-10,
                   v0: torch.Tensor | None = None,
                   generator: torch.Generator | None = None) -> TopEigen:
    r"""The eigenvalue of largest magnitude of :math:`H = \nabla^2 f(\theta)` by power iteration.

    Stops when the Rayleigh quotient changes by at most ``rtol`` (relative) between iterations;
    ``v0`` (``theta``'s shape, finite, non-zero; cast to ``theta``'s dtype and device)
    warm-starts it (default: a Gaussian vector from ``generator``). Convergence is
    geometric with ratio :math:`|\lambda_2 / \lambda_1|`: ``residual`` says how far it got.
    """
    check_positive_ints(max_iter=max_iter)
    if v0 is None:  # drawn on the CPU (the same numbers on every device), then moved
        v = torch.randn(theta.shape, generator=generator, dtype=theta.dtype).to(theta.device)
    else:
        v = _start_vector(v0, theta)
    return _power_iteration(lambda u: hessian_vector_product(f, theta, u), v, max_iter, rtol)


def _start_vector(v0, theta: torch.Tensor) -> torch.Tensor:
    """``v0`` as a start of power iteration at ``theta``: of its shape, finite and non-zero (a
    zero vector stays zero), cast to its dtype and device."""
    v0 = torch.as_tensor(v0).detach()
    if v0.shape != theta.shape or v0.is_complex():
        raise ValueError(f"v0 must be a real vector of theta's shape {tuple(theta.shape)}, got "
                         f"shape {tuple(v0.shape)} and dtype {v0.dtype}")
    v0 = v0.to(dtype=theta.dtype, device=theta.device)
    if not torch.isfinite(v0).all() or not v0.any():
        raise ValueError("v0 must be finite and non-zero (power iteration keeps a zero vector "
                         "at zero); pass v0=None for a random start")
    return v0


@dataclass(frozen=True)
class TraceEstimate:
    r"""Result of :func:`hutchinson_trace`: mean of :math:`z^\top H z` and its standard error."""

    value: float
    stderr: float
    n_samples: int


def hutchinson_trace(f: Callable, theta: torch.Tensor, n_samples: int = 64, *,
                     generator: torch.Generator | None = None) -> TraceEstimate:
    r"""Hutchinson's estimator :math:`\tr H = \mathbb{E}[z^\top H z]`, :math:`z` with independent
    entries :math:`\pm 1`.

    Its variance is :math:`2 (\|H\|_F^2 - \sum_i H_{ii}^2) / n`, with :math:`n` = ``n_samples``.
    """
    if type(n_samples) is not int or n_samples < 2:
        raise ValueError(f"n_samples must be an integer >= 2, got {n_samples!r}")
    samples = []
    for _ in range(n_samples):
        z = torch.randint(0, 2, theta.shape, generator=generator)  # on the CPU, then moved
        z = z.to(theta.device, theta.dtype) * 2 - 1
        samples.append(torch.dot(z, hessian_vector_product(f, theta, z)).item())
    s = torch.tensor(samples, dtype=DTYPE)
    return TraceEstimate(s.mean().item(), (s.std() / n_samples ** 0.5).item(), n_samples)


# ----------------------------------------------------------------------------------------------
# minimum over the orbit
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class OrbitMinimum:
    """Result of :func:`minimise_over_orbit`.

    ``element.act(model)`` is the flattest point found; ``sharpness`` is its top (largest,
    not largest in magnitude) Hessian eigenvalue, ``initial`` the one at ``model``; ``history``
    has one value per evaluated point, ``steps + 1`` per round (the round's start and each
    step; each converged, also with ``method="hvp"``), so ``rounds * (steps + 1)`` in all, and
    ``sharpness == min(history)``; ``method`` is the one used, ``"dense"`` or ``"hvp"`` (what
    ``"auto"`` chose).
    """

    sharpness: float
    initial: float
    history: list[float]
    element: GaugeElement
    method: str


def _sym(S: torch.Tensor) -> torch.Tensor:
    return (S + S.transpose(-1, -2)) / 2


def _spd_action(params: dict, model: nn.Module, layers, P_qk: dict, P_vo: dict) -> dict:
    r""":math:`(P, N) \cdot` ``params`` for symmetric positive definite ``P [n_kv, dk, dk]``,
    ``N [n_kv, dv, dv]`` per layer: the QK and VO actions of :mod:`gaugebook.gauge` (where
    :math:`P^{-\top} = P^{-1}`), differentiable, on tensors that may carry leading batch
    dimensions."""
    element = GaugeElement(f for path, _ in layers
                           for f in (QKTransform.unchecked(P_qk[path], target=path),
                                     VOTransform.unchecked(P_vo[path], target=path)))
    return element.transform(params, model)


def minimise_over_orbit(model: nn.Module, loss: Callable, *inputs, steps: int = 200,
                        rounds: int = 2, lr: float = 0.1, method: str = "auto",
                        dense_limit: int = 1024, max_restarts: int = 30, rtol: float = 1e-8,
                        generator: torch.Generator | None = None,
                        progress: bool = False) -> OrbitMinimum:
    r"""Minimise the top Hessian eigenvalue of ``loss(model(*inputs))`` over the gauge orbit.

    Searches :math:`P = \exp(S)`, :math:`N = \exp(S')` (:math:`S, S'` symmetric, one per
    key/value group of every attention layer) with Adam (learning rate ``lr``, cosine-decayed to
    zero over ``steps``), using :math:`H(g \cdot \theta) = A^{-1} H_0 A^{-1}` (module docstring).
    ``method``:

    * ``"dense"``: form :math:`H_0` once, then :math:`A^{-1}` as a matrix each step, and
      differentiate the top eigenvalue of :math:`A^{-1} H_0 A^{-1}` (``eigvalsh``; exact; for up
      to a few thousand parameters);
    * ``"hvp"``: Lanczos (``scipy.sparse.linalg.eigsh``, largest algebraic eigenvalue)
      warm-started at the previous step's eigenvector, with Hessian-vector products at the
      starting point, converged to ``rtol`` in at most ``max_restarts`` Lanczos restarts per
      step (else ``ArpackNoConvergence``), and the Hellmann-Feynman gradient
      :math:`2 (H_0 w)^\top \partial w / \partial S`, :math:`w = A^{-1} v`;
    * ``"auto"``: ``"dense"`` when the model has at most ``dense_limit`` parameters.

    The coordinates :math:`S` are ill-conditioned when the start is far from balanced (a start
    :math:`M_0 \cdot \theta` turns the search into one over :math:`M_0 P^2 M_0^\top`), so the
    search restarts ``rounds`` times from the best point so far, with :math:`S = 0` there.
    Returns the best point seen; all attention parameters must be trainable (the gauge action
    changes them all). ``progress``: a tqdm bar over the ``rounds * (steps + 1)`` evaluations,
    showing the best sharpness so far.
    """
    check_finite_tensors(model, *inputs)
    check_positive_ints(steps=steps, rounds=rounds, max_restarts=max_restarts)
    check_number("lr", lr, low=0.0, strict=True)
    if method not in ("auto", "dense", "hvp"):
        raise ValueError(f"method must be 'auto', 'dense' or 'hvp', got {method!r}")
    layers = gauge_layers(model)
    for path, m in layers:
        frozen = [n for n, p in m.named_parameters() if not p.requires_grad]
        if frozen:
            raise ValueError(f"attention parameters {frozen} of {path or 'the module'} are "
                             "frozen: the gauge action would change them")
    if method == "auto":
        n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
        method = "dense" if n_params <= dense_limit else "hvp"
    model = copy.deepcopy(model).double()  # compose the rounds' actions without rounding
    element, history, current = GaugeElement(), [], model
    with tqdm(total=rounds * (steps + 1), desc=f"orbit minimum ({method})", disable=not progress,
              leave=False) as bar:
        for _ in range(rounds):
            found = _minimise_once(current, loss, inputs, layers, steps, lr, method,
                                   max_restarts, rtol, generator, bar)
            history += found.history
            element = found.element @ element
            current = element.act(model)
    return OrbitMinimum(min(history), history[0], history, element, method)


def _minimise_once(model, loss, inputs, layers, steps, lr, method, max_restarts, rtol,
                   generator, bar):
    L = FlatLoss(model, loss, *inputs)
    theta0 = L.theta
    zeros = dict(dtype=DTYPE, device=theta0.device, requires_grad=True)
    S_qk = {p: torch.zeros(m.n_kv_heads, m.d_head, m.d_head, **zeros) for p, m in layers}
    S_vo = {p: torch.zeros(m.n_kv_heads, m.d_value, m.d_value, **zeros) for p, m in layers}
    variables = list(S_qk.values()) + list(S_vo.values())
    opt = torch.optim.Adam(variables, lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)

    def inverse_matrices():
        # exp(-S) per layer: the element whose action on tangent vectors is A^{-1}
        return ({p: torch.linalg.matrix_exp(-_sym(S)) for p, S in S_qk.items()},
                {p: torch.linalg.matrix_exp(-_sym(S)) for p, S in S_vo.items()})

    def inverse_action(u: torch.Tensor, matrices) -> torch.Tensor:
        # A^{-1} u for u [..., n] (the action is linear in the parameters)
        return L.flatten(_spd_action(L.unflatten(u), L.model, layers, *matrices))

    if method == "dense":
        H0 = hessian(L, theta0)
        eye = torch.eye(theta0.numel(), dtype=DTYPE, device=theta0.device)

        def sharpness_step(_):
            A_inv = inverse_action(eye, inverse_matrices())  # (n, n), symmetric
            lam = torch.linalg.eigvalsh(A_inv @ H0 @ A_inv)[-1]
            return lam.item(), lam, None
    else:
        def hvp0(u):
            return hessian_vector_product(L, theta0, u)

        def sharpness_step(v):
            matrices = inverse_matrices()
            with torch.no_grad():
                fixed = tuple({p: X.detach() for p, X in d.items()} for d in matrices)
                value, v = _top_algebraic(
                    lambda u: inverse_action(hvp0(inverse_action(u, fixed)), fixed), v,
                    rtol, max_restarts)
            w = inverse_action(v, matrices)  # differentiable in S
            return value, 2 * torch.dot(hvp0(w.detach()), w), v

    v = torch.randn(theta0.shape, generator=generator, dtype=DTYPE).to(theta0.device)
    history, best, best_S = [], None, None
    for step in range(steps + 1):
        value, surrogate, v = sharpness_step(v)
        history.append(value)
        if best is None or value < best:
            best, best_S = value, [S.detach().clone() for S in variables]
        bar.update()
        bar.set_postfix(best=f"{best:.4g}", refresh=False)  # a round starts at the best so far
        if step == steps:
            break
        opt.zero_grad()
        surrogate.backward()  # its gradient is d lambda_max / dS
        opt.step()
        schedule.step()

    n = len(layers)
    element = GaugeElement(
        [QKTransform(torch.linalg.matrix_exp(_sym(S)), target=p)
         for (p, _), S in zip(layers, best_S[:n])]
        + [VOTransform(torch.linalg.matrix_exp(_sym(S)), target=p)
           for (p, _), S in zip(layers, best_S[n:])])
    return OrbitMinimum(best, history[0], history, element, method)
