"""Toy landscapes, Hamiltonian integrators and the reference ECD map on a point."""
import math
import warnings

import pytest
import torch

from gaugebook.landscapes import (angular_momentum, ecd_path, explicit_euler,
                                  gradient_descent, leapfrog, multiwell, optimizer_path,
                                  rosenbrock, sombrero)
from gaugebook.optim import ECD, ecd_kappa

F64 = torch.float64


def rotation(angle: float) -> torch.Tensor:
    c, s = math.cos(angle), math.sin(angle)
    return torch.tensor([[c, -s], [s, c]], dtype=F64)


# --- landscapes --------------------------------------------------------------------------------

def test_landscape_minima_and_symmetry():
    assert rosenbrock(torch.tensor([1.0, 1.0], dtype=F64)) == 0
    assert rosenbrock(torch.tensor([1.1, 1.0], dtype=F64)) > 0
    # multiwell: the well opposite to the tilt is the lowest
    wells = torch.tensor([[-1.0, -1.0], [-1.0, 1.0], [1.0, -1.0], [1.0, 1.0]], dtype=F64)
    assert multiwell(wells).argmin() == 0
    x = torch.randn(5, 2, generator=torch.Generator().manual_seed(0), dtype=F64)
    turned = x @ rotation(0.7).T
    assert torch.allclose(sombrero(turned), sombrero(x), rtol=1e-13, atol=1e-13)
    assert not torch.allclose(sombrero(turned, tilt=(0.0, 0.1)), sombrero(x, tilt=(0.0, 0.1)))
    assert sombrero(torch.tensor([0.6, 0.8], dtype=F64)) == pytest.approx(0.0, abs=1e-15)


def test_angular_momentum():
    x, v = torch.tensor([1.0, 0.0], dtype=F64), torch.tensor([0.0, 1.0], dtype=F64)
    assert angular_momentum(x, v) == 1.0
    assert angular_momentum(x, -v) == -1.0
    assert angular_momentum(x, x) == 0.0


@pytest.mark.parametrize("f", [rosenbrock, multiwell, sombrero])
def test_landscapes_reject_points_of_the_wrong_shape(f):
    with pytest.raises(ValueError, match=r"\[\.\.\., 2\]"):
        f(torch.zeros(3, dtype=F64))


def test_bad_tilt():
    with pytest.raises(ValueError, match="tilt"):
        sombrero(torch.zeros(2, dtype=F64), tilt=(1.0, 2.0, 3.0))


# --- integrators --------------------------------------------------------------------------------

def harmonic(theta, k):
    """grad of L = |theta|^2 / 2."""
    return [t.clone() for t in theta]


def energy(theta, p):
    return sum(0.5 * (t * t).sum() + 0.5 * (q * q).sum() for t, q in zip(theta, p)).item()


def test_leapfrog_is_second_order_and_reversible():
    # not a circular orbit: there the O(h^2) errors of the two coordinates cancel
    theta, p = [torch.tensor([1.0, 0.0], dtype=F64)], [torch.tensor([0.0, 0.3], dtype=F64)]
    errors = []
    for h in (0.1, 0.05):
        t1, p1, worst = theta, p, 0.0
        for _ in range(round(10 / h)):
            t1, p1 = leapfrog(t1, p1, harmonic, h, 1)
            worst = max(worst, abs(energy(t1, p1) - energy(theta, p)))
        errors.append(worst)
    assert 3.0 < errors[0] / errors[1] < 5.0  # bounded energy error of order h^2
    t1, p1 = leapfrog(theta, p, harmonic, 0.1, 50)
    t2, p2 = leapfrog(t1, [-q for q in p1], harmonic, 0.1, 50)  # run back
    assert torch.allclose(t2[0], theta[0], atol=1e-13)
    assert theta[0][0] == 1.0  # inputs untouched


def test_explicit_euler_gains_energy_and_gd_matches_closed_form():
    theta, p = [torch.tensor([1.0, 0.0], dtype=F64)], [torch.tensor([0.0, 1.0], dtype=F64)]
    t1, p1 = explicit_euler(theta, p, harmonic, 0.1, 1)
    assert energy(t1, p1) == pytest.approx(energy(theta, p) * (1 + 0.1**2))  # exact per step
    x = gradient_descent(theta, harmonic, 0.1, 7)
    assert torch.allclose(x[0], theta[0] * 0.9**7)


def test_integrators_refuse_momenta_that_do_not_match():
    theta, grad = [torch.zeros(3), torch.zeros(2)], lambda th, k: [torch.zeros_like(t) for t in th]
    with pytest.raises(ValueError, match="match tensor by tensor"):
        leapfrog(theta, [torch.zeros(3)], grad, 0.1, 2)  # zip would drop the second tensor
    with pytest.raises(ValueError, match="match tensor by tensor"):
        explicit_euler(theta, [torch.zeros(1), torch.zeros(2)], grad, 0.1, 2)  # would broadcast


def test_step_is_passed_to_the_gradient():
    seen = []

    def grad(theta, k):
        seen.append(k)
        return [torch.zeros_like(t) for t in theta]

    leapfrog([torch.zeros(1)], [torch.zeros(1)], grad, 0.1, 3)
    assert seen == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize("h, steps", [(0.0, 1), (-1.0, 1), (float("nan"), 1), (0.1, -1),
                                      (0.1, 1.5)])
def test_integrators_validate(h, steps):
    with pytest.raises(ValueError):
        leapfrog([torch.zeros(1)], [torch.zeros(1)], harmonic, h, steps)
    with pytest.raises(ValueError):
        gradient_descent([torch.zeros(1)], harmonic, h, steps)


# --- ECD on a point ------------------------------------------------------------------------------

@pytest.mark.parametrize("F, x0", [(rosenbrock, [-1.0, 1.5]), (multiwell, [1.3, 1.4])])
def test_ecd_path_is_the_optimizer(F, x0):
    hp = dict(lr=0.05, eta=2.0, F0=-1.0)
    shifts = 0.1 * torch.randn(30, 2, generator=torch.Generator().manual_seed(1), dtype=F64)
    for s in (None, shifts):
        ref = ecd_path(F, x0, steps=30, shifts=s, **hp)
        xs, losses = optimizer_path(F, x0, lambda p: ECD(p, **hp), 30, shifts=s)
        assert (ref.x - xs).abs().max() < 1e-13
        assert torch.allclose(ref.F, losses, rtol=1e-13, atol=1e-13)
    assert torch.allclose(ref.v.norm(dim=1), torch.ones(31, dtype=F64))


def test_ecd_path_starts_its_velocity_at_the_first_step_that_moves():
    """Step 1 sees F <= F0 and is skipped: the optimizer takes v = -g/|g| from step 2's gradient,
    and so does ecd_path (it took step 1's, and went elsewhere)."""
    hp = dict(lr=0.1, eta=1.0, F0=0.5)
    shifts = torch.tensor([[0.0, 0.0], [0.0, 1.0], [0.0, 1.0]], dtype=F64)
    F = lambda x: (x * x).sum()  # noqa: E731
    with pytest.warns(RuntimeWarning, match="skipped"):
        xs, _ = optimizer_path(F, [0.1, 0.0], lambda p: ECD(p, **hp), 3, shifts=shifts)
    path = ecd_path(F, [0.1, 0.0], steps=3, shifts=shifts, **hp)
    assert (path.x - xs).abs().max() < 1e-13
    assert torch.equal(path.x[1], path.x[0]) and torch.equal(path.v[0], path.v[1])
    g = 2 * (path.x[0] + shifts[1])  # step 2's gradient
    assert torch.allclose(path.v[0], -g / g.norm())


def test_radial_start_on_the_sombrero_never_turns():
    """v0 = -g/|g| is radial, the angular momentum stays zero and the path is a straight line."""
    p = ecd_path(sombrero, [1.2, 0.9], lr=0.05, eta=2.0, F0=-0.2, steps=300)
    assert angular_momentum(p.x[:100], p.v[:100]).abs().max() < 1e-12
    direction = p.x[-1] / p.x[-1].norm()
    off_line = angular_momentum(p.x, direction.expand_as(p.x)) / p.x.norm(dim=1)
    assert off_line.abs().max() < 1e-8  # every iterate on one line through the centre
    assert p.F[-1] > 1e3  # it ran off
    shifts = 0.05 * torch.randn(300, 2, generator=torch.Generator().manual_seed(0), dtype=F64)
    q = ecd_path(sombrero, [1.2, 0.9], lr=0.05, eta=2.0, F0=-0.2, steps=300, shifts=shifts)
    assert q.F[-100:].max() < 10


def test_ecd_conserves_L_over_E_to_first_order():
    """On the sombrero, ell (F - F0)^(-kappa) = L / E is conserved by the flow."""
    drifts = []
    for lr in (0.02, 0.01):
        dt = lr / math.sqrt(2.0)
        p = ecd_path(sombrero, [1.5, 0.0], lr=lr, eta=2.0, F0=-1.0, steps=round(2.0 / dt),
                     v0=[-1.0, 0.6])
        ratio = angular_momentum(p.x, p.v) * (sombrero(p.x) + 1.0) ** -ecd_kappa(2.0, 2)
        drifts.append(((ratio - ratio[0]).abs().max() / ratio[0].abs()).item())
    assert 1.6 < drifts[0] / drifts[1] < 2.5


def test_chaos_is_reproducible_and_steps_below_F0_are_skipped():
    hp = dict(lr=0.05, eta=2.0, F0=-1.0, steps=20, nu=0.5)
    a = ecd_path(multiwell, [1.3, 1.4], generator=torch.Generator().manual_seed(3), **hp)
    b = ecd_path(multiwell, [1.3, 1.4], generator=torch.Generator().manual_seed(3), **hp)
    c = ecd_path(multiwell, [1.3, 1.4], generator=torch.Generator().manual_seed(4), **hp)
    assert torch.equal(a.x, b.x) and not torch.equal(a.x, c.x)
    stuck = ecd_path(sombrero, [1.2, 0.9], lr=0.05, eta=2.0, F0=100.0, steps=5)
    assert (stuck.x == stuck.x[0]).all()


def test_ecd_path_validates():
    with pytest.raises(ValueError, match="shifts"):
        ecd_path(sombrero, [1.0, 1.0], lr=0.1, eta=1.0, F0=-1.0, steps=3,
                 shifts=torch.zeros(2, 2, dtype=F64))
    with pytest.raises(ValueError, match="v0"):
        ecd_path(sombrero, [1.0, 1.0], lr=0.1, eta=1.0, F0=-1.0, steps=3, v0=[1.0])
    with pytest.raises(ValueError, match="zero"):
        ecd_path(sombrero, [0.6, 0.8], lr=0.1, eta=1.0, F0=-1.0, steps=3)  # zero gradient
    with pytest.raises(ValueError, match="at least one step"):
        ecd_path(sombrero, [1.0, 1.0], lr=0.1, eta=1.0, F0=-1.0, steps=0)


@pytest.mark.parametrize("bad, match", [
    (dict(eta=0.0), r"eta must be finite and > 0"),
    (dict(eta=-1.0), r"eta must be finite and > 0"),
    (dict(nu=-0.1), r"nu must be finite and >= 0"),
    (dict(F0=float("nan")), r"F0 must be a finite real number, got nan"),
    (dict(F0=-math.inf), r"F0 must be a finite real number"),
    (dict(eta="0.5"), r"eta must be finite and > 0, got '0.5'"),  # float() would take it
    (dict(nu=True), r"nu must be finite and >= 0, got True"),
    (dict(F0="1"), r"F0 must be a finite real number, got '1'"),
])
def test_ecd_path_validates_hyperparameters(bad, match):
    hp = dict(lr=0.1, eta=1.0, F0=-1.0, steps=3) | bad
    with pytest.raises(ValueError, match=match):
        ecd_path(sombrero, [1.0, 1.0], **hp)


def test_ecd_path_raises_on_a_non_finite_loss():
    def F(x):  # NaN for x_1 < 0, where the path goes
        return torch.log(x[0]) ** 2 + x[1] ** 2

    with pytest.raises(FloatingPointError, match="step 2 .* not finite"):
        ecd_path(F, [0.05, 1.0], lr=1.0, eta=10.0, F0=0.0, steps=6, v0=[-1.0, 0.0])


def test_optimizer_path_with_gradient_descent():
    xs, losses = optimizer_path(lambda x: 0.5 * (x * x).sum(), [1.0, -2.0],
                                lambda p: torch.optim.SGD(p, lr=0.1), 5)
    assert xs.shape == (6, 2) and losses.shape == (5,)
    path = optimizer_path(lambda x: 0.5 * (x * x).sum(), [1.0, -2.0],
                          lambda p: torch.optim.SGD(p, lr=0.1), 5)
    assert torch.equal(path.x, xs) and torch.equal(path.F, losses)  # as ecd_path's fields
    assert torch.allclose(xs[-1], torch.tensor([1.0, -2.0], dtype=F64) * 0.9**5)
    assert losses[0] == pytest.approx(2.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning about converting tensors that need grad
        optimizer_path(rosenbrock, [0.0, 0.0], lambda p: torch.optim.SGD(p, lr=1e-3), 2)
