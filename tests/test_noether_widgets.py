"""The Noether-charge explorer of chapter 14: its problem, its grid, its widget and its figure."""
import pytest
import torch
from matplotlib.figure import Figure

from gaugebook.attention import MultiHeadAttention
from gaugebook.mechanics import charges
from gaugebook.noether_widgets import (ChargeDriftExplorer, HeadProblem, charge_drift_figure,
                                       charge_drift_grid, probe_head, protocol_shifts,
                                       stabiliser_projection)

F64 = torch.float64


@pytest.fixture(scope="module")
def problem():
    return probe_head(d_model=5, d_head=3, batch=2, length=6, seed=1)


@pytest.fixture(scope="module")
def grid(problem):
    return charge_drift_grid(problem, scales=(0.0, 1.0), spreads=(0.0, 1.0), h=0.05, steps=40)


def test_the_grid_leaves_the_global_generator_alone(problem):
    torch.manual_seed(3)
    expected = torch.rand(1)
    torch.manual_seed(3)
    charge_drift_grid(problem, scales=(1.0,), spreads=(0.0,), steps=2)
    assert torch.equal(torch.rand(1), expected)


def test_problem_gradients_and_charge(problem):
    theta = problem.parameters()
    g = problem.grad(theta)
    model = problem.model
    model.zero_grad()
    (0.5 * ((model(problem.x) - problem.y) ** 2).mean()).backward()
    for a, p in zip(g, model.parameters()):
        assert torch.allclose(a, p.grad, rtol=1e-12, atol=1e-15)
    shifts = protocol_shifts(3, 2, generator=torch.Generator().manual_seed(0))
    batched = problem.batched_grad([t.expand(2, *t.shape) for t in theta], shifts)
    for i in range(2):
        single = problem.grad(theta, shifts[i])
        assert all(torch.allclose(b[i], s, rtol=1e-10, atol=1e-14) for b, s in zip(batched, single))
    J = problem.charge(theta, problem.p0)
    expected = charges(model, dict(zip(problem.names, problem.p0)))[""].qk[0]
    assert torch.allclose(J, expected, atol=1e-14) and torch.allclose(J, -J.T)


def test_problem_needs_a_single_plain_head():
    x = torch.zeros(1, 2, 4, dtype=F64)
    for kw in (dict(n_heads=2), dict(bias=True), dict(rope=True)):
        n_heads = kw.pop("n_heads", 1)
        m = MultiHeadAttention(4, n_heads, 2, dtype=F64, **kw)
        with pytest.raises(ValueError, match="one head"):
            HeadProblem(m, x, x, [])


def test_stabiliser_projection():
    b = torch.tensor([[1.0, 2.0, 2.0], [0.0, 0.0, 0.0]], dtype=F64)
    P = stabiliser_projection(b)
    assert torch.allclose(b[0] @ P[0], torch.zeros(3, dtype=F64), atol=1e-15)
    assert torch.allclose(P[0] @ P[0], P[0]) and torch.allclose(P[0], P[0].T)
    assert torch.equal(P[1], torch.eye(3, dtype=F64))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_stabiliser_projection_stays_on_the_device():
    b = torch.tensor([1.0, 2.0, 2.0], dtype=F64, device="cuda")
    assert stabiliser_projection(b).is_cuda


def test_protocol_shifts():
    g = torch.Generator().manual_seed(0)
    assert torch.equal(protocol_shifts(4, 3, spread=0.0, generator=g), torch.full((3, 4), 0.5,
                                                                                 dtype=F64))
    s = protocol_shifts(4, 20000, scale=0.0, generator=g)
    assert torch.allclose(s.std(0), torch.linspace(0.05, 0.15, 4, dtype=F64), rtol=0.05)
    with pytest.raises(ValueError, match="non-negative"):
        protocol_shifts(4, 3, scale=-1.0)


def test_grid_shows_which_charge_survives(grid):
    assert grid.J.shape == grid.PJP.shape == grid.weights.shape == (2, 2)
    assert grid.J[0, 0] < 1e-12  # no bias: J conserved
    assert grid.J[1, 0] > 1e-4 and grid.PJP[1, 0] < 1e-12  # fixed bias: only P J P
    assert (grid.PJP[:, 1] > 1e-6).all()  # redrawn bias: nothing
    assert (grid.weights > 0.05).all()
    assert grid.lookup(1.0, 0.0)["PJP"] == grid.PJP[1, 0].item()
    with pytest.raises(ValueError, match="not on the grid"):
        grid.lookup(0.5, 0.0)
    with pytest.raises(ValueError, match="at least one"):
        charge_drift_grid(scales=(), spreads=(0.0,))


def test_explorer_looks_up_the_grid(grid):
    explorer = ChargeDriftExplorer(grid, scale=1.0, spread=0.0)
    assert "a fixed shift" in explorer.readout.value
    assert explorer.readout.value.count("conserved (round-off)") == 1  # P J P only
    explorer.spread.value = 1.0
    assert "redrawn every step" in explorer.readout.value
    assert "conserved (round-off)" not in explorer.readout.value
    explorer.scale.value = 0.0
    explorer.spread.value = 0.0
    assert explorer.readout.value.count("conserved (round-off)") == 2
    assert explorer.scale in explorer.children[0].children and explorer.readout in explorer.children
    with pytest.raises(ValueError, match="not on the grid"):
        ChargeDriftExplorer(grid, scale=3.0)


def test_static_figure(grid):
    fig = charge_drift_figure(grid)
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    assert all(ax.get_yscale() == "log" for ax in fig.axes)
