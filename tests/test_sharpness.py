import pytest
import torch

from gaugebook.attention import MultiHeadAttention
from gaugebook.gauge import GaugeElement, QKTransform, VOTransform, random_element
from gaugebook.sharpness import (FlatLoss, hessian, hessian_vector_product, hutchinson_trace,
                                 minimise_over_orbit, top_eigenvalue)

DTYPE = torch.float64



@pytest.fixture(scope="module")
def problem():
    """A small attention layer fitted (to a stationary point) to a noisy teacher."""
    gen = torch.Generator().manual_seed(0)
    teacher = MultiHeadAttention(4, 2, 2, dtype=DTYPE, generator=gen)
    x = torch.randn(16, 5, 4, generator=gen, dtype=DTYPE)
    with torch.no_grad():
        y = teacher(x) + 0.1 * torch.randn(16, 5, 4, generator=gen, dtype=DTYPE)
    student = MultiHeadAttention(4, 2, 2, dtype=DTYPE, generator=gen)

    def mse(out):
        return ((out - y) ** 2).mean()

    opt = torch.optim.LBFGS(student.parameters(), max_iter=1000, tolerance_grad=1e-11,
                            tolerance_change=1e-16, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = mse(student(x))
        loss.backward()
        return loss

    opt.step(closure)
    return student, mse, x


def dense_top(model, loss, x):
    L = FlatLoss(model, loss, x)
    return torch.linalg.eigvalsh(hessian(L, L.theta))[-1].item()


def test_flat_loss_round_trip(problem):
    model, loss, x = problem
    L = FlatLoss(model, loss, x)
    assert torch.equal(L.flatten(L.unflatten(L.theta)), L.theta)
    batch = torch.stack([L.theta, 2 * L.theta])
    assert torch.equal(L.flatten(L.unflatten(batch)), batch)
    assert abs(L(L.theta).item() - loss(model(x)).item()) < 1e-15
    with pytest.raises(ValueError, match="length"):
        L.unflatten(L.theta[:-1])
    with pytest.raises(ValueError, match="scalar"):
        FlatLoss(model, lambda out: out, x)(L.theta)


def test_hvp_matches_dense_hessian(problem):
    model, loss, x = problem
    L = FlatLoss(model, loss, x)
    H = hessian(L, L.theta)
    assert torch.allclose(H, H.T, atol=1e-12)
    v = torch.randn(L.theta.shape, generator=torch.Generator().manual_seed(1), dtype=DTYPE)
    assert torch.allclose(hessian_vector_product(L, L.theta, v), H @ v, atol=1e-12)


def test_power_iteration_and_hutchinson(problem):
    model, loss, x = problem
    L = FlatLoss(model, loss, x)
    eigenvalues = torch.linalg.eigvalsh(hessian(L, L.theta))
    top = top_eigenvalue(L, L.theta, generator=torch.Generator().manual_seed(2))
    assert abs(top.value - eigenvalues.abs().max().item()) < 1e-6 * eigenvalues.abs().max()
    trace = hutchinson_trace(L, L.theta, 200, generator=torch.Generator().manual_seed(3))
    assert abs(trace.value - eigenvalues.sum().item()) < 4 * trace.stderr
    with pytest.raises(ValueError):
        hutchinson_trace(L, L.theta, 1)


def test_top_eigenvalue_checks_its_start_vector(problem):
    """A zero v0 used to give NaN after max_iter products, a wrong shape or dtype an error deep
    in torch.func."""
    model, loss, x = problem
    L = FlatLoss(model, loss, x)
    ones = top_eigenvalue(L, L.theta, max_iter=5, v0=torch.ones_like(L.theta))
    cast = top_eigenvalue(L, L.theta, max_iter=5, v0=torch.ones(L.theta.shape))  # float32
    assert cast.value == ones.value and cast.vector.dtype == DTYPE
    nan = torch.ones_like(L.theta)
    nan[0] = float("nan")
    for v0, match in ((torch.zeros_like(L.theta), "v0 must be finite and non-zero"),
                      (nan, "v0 must be finite and non-zero"),
                      (torch.ones(3, dtype=DTYPE), "v0 must be a real vector of theta's shape"),
                      (torch.ones_like(L.theta, dtype=torch.complex128), "v0 must be a real")):
        with pytest.raises(ValueError, match=match):
            top_eigenvalue(L, L.theta, v0=v0)
    # the default start is the Gaussian draw of the CPU generator
    drawn = top_eigenvalue(L, L.theta, max_iter=3, generator=torch.Generator().manual_seed(7))
    v0 = torch.randn(L.theta.shape, generator=torch.Generator().manual_seed(7), dtype=DTYPE)
    assert drawn.value == top_eigenvalue(L, L.theta, max_iter=3, v0=v0).value


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_random_vectors_follow_theta_to_its_device():
    """The random start of top_eigenvalue and the probes of hutchinson_trace used to stay on
    the CPU; they are drawn there (the same numbers) and moved to theta's device."""
    import copy

    gen = torch.Generator().manual_seed(0)
    model = MultiHeadAttention(4, 2, 2, dtype=DTYPE, generator=gen)
    x = torch.randn(3, 5, 4, generator=gen, dtype=DTYPE)

    def loss(out):
        return ((out - 0.5) ** 2).mean()

    cpu = FlatLoss(model, loss, x)
    gpu = FlatLoss(copy.deepcopy(model).cuda(), loss, x.cuda())
    assert gpu.theta.is_cuda
    tops = [top_eigenvalue(L, L.theta, max_iter=20, generator=torch.Generator().manual_seed(1))
            for L in (cpu, gpu)]
    assert tops[1].vector.is_cuda
    assert abs(tops[1].value - tops[0].value) < 1e-9 * abs(tops[0].value)
    traces = [hutchinson_trace(L, L.theta, 4, generator=torch.Generator().manual_seed(2))
              for L in (cpu, gpu)]
    assert abs(traces[1].value - traces[0].value) < 1e-9 * abs(traces[0].value)
    start = top_eigenvalue(gpu, gpu.theta, max_iter=5, v0=torch.ones(gpu.theta.shape))
    assert start.vector.is_cuda


def test_sharpness_changes_along_the_orbit_but_loss_does_not(problem):
    model, loss, x = problem
    base_loss, base_top = loss(model(x)).item(), dense_top(model, loss, x)
    eye = torch.eye(2, dtype=DTYPE).expand(2, 2, 2)
    for alpha in (0.1, 10.0):
        g = GaugeElement([QKTransform(alpha * eye), VOTransform(alpha * eye)])
        moved = g.act(model)
        assert abs(loss(moved(x)).item() - base_loss) < 1e-13 * base_loss
        assert dense_top(moved, loss, x) > 10 * base_top  # about alpha^2 or alpha^-2 times
    # orthogonal matrices and head permutations act isometrically: the spectrum stays
    rotation = random_element(model, cond=1.0, generator=torch.Generator().manual_seed(4))
    assert abs(dense_top(rotation.act(model), loss, x) - base_top) < 1e-9 * base_top


def test_minimum_over_orbit_is_gauge_invariant(problem):
    model, loss, x = problem
    found = minimise_over_orbit(model, loss, x, steps=100, rounds=3)
    assert found.sharpness < found.initial
    assert found.sharpness == min(found.history)
    flattest = found.element.act(model)
    assert abs(dense_top(flattest, loss, x) - found.sharpness) < 1e-8 * found.sharpness
    assert abs(loss(flattest(x)).item() - loss(model(x)).item()) < 1e-12
    # from another point of the orbit (ill-conditioned, permuted) the same minimum
    g = random_element(model, cond=30.0, generator=torch.Generator().manual_seed(5))
    other = minimise_over_orbit(g.act(model), loss, x, steps=100, rounds=3)
    assert other.initial > 2 * found.initial
    assert abs(other.sharpness - found.sharpness) < 2e-3 * found.sharpness


def test_hvp_method_agrees_with_dense(problem):
    model, loss, x = problem
    dense = minimise_over_orbit(model, loss, x, steps=6, rounds=1, method="dense")
    hvp = minimise_over_orbit(model, loss, x, steps=6, rounds=1, method="hvp", max_restarts=60,
                              rtol=1e-6, generator=torch.Generator().manual_seed(6))
    assert abs(hvp.initial - dense.initial) < 1e-5 * dense.initial
    assert hvp.sharpness < hvp.initial
    assert abs(hvp.sharpness - dense.sharpness) < 0.05 * dense.sharpness
    assert (dense.method, hvp.method) == ("dense", "hvp")
    chosen = minimise_over_orbit(model, loss, x, steps=1, rounds=1, dense_limit=1)  # "auto"
    assert chosen.method == "hvp"


def test_orbit_minimisation_shows_progress_on_request(problem, capsys):
    model, loss, x = problem
    quiet = minimise_over_orbit(model, loss, x, steps=3, rounds=2, method="dense")
    assert capsys.readouterr().err == ""
    shown = minimise_over_orbit(model, loss, x, steps=3, rounds=2, method="dense",
                                progress=True)
    bar = capsys.readouterr().err
    assert "orbit minimum (dense)" in bar and "/8 " in bar  # rounds * (steps + 1)
    assert shown.history == quiet.history  # the bar changes nothing


def test_orbit_minimisation_errors(problem):
    model, loss, x = problem
    with pytest.raises(ValueError, match="method"):
        minimise_over_orbit(model, loss, x, method="newton")
    with pytest.raises(ValueError, match="steps"):
        minimise_over_orbit(model, loss, x, steps=0)
    for kw, name in ((dict(steps=2.5), "steps"), (dict(max_restarts=0), "max_restarts"),
                     (dict(lr=float("nan")), "lr")):  # a TypeError, or scipy's, or silence
        with pytest.raises(ValueError, match=name):
            minimise_over_orbit(model, loss, x, **kw)
    rope = MultiHeadAttention(4, 2, 2, rope=True, dtype=DTYPE)
    with pytest.raises(ValueError, match="RoPE"):
        minimise_over_orbit(rope, lambda out: (out ** 2).mean(), x)
    frozen = MultiHeadAttention(4, 2, 2, dtype=DTYPE)
    frozen.W_O.requires_grad_(False)
    with pytest.raises(ValueError, match="frozen"):
        minimise_over_orbit(frozen, lambda out: (out ** 2).mean(), x)


def test_power_iteration_reports_the_vector_it_measured(problem):
    model, loss, x = problem
    L = FlatLoss(model, loss, x)
    H = hessian(L, L.theta)
    top = top_eigenvalue(L, L.theta, max_iter=3, generator=torch.Generator().manual_seed(7))
    v = top.vector
    assert abs(torch.dot(v, H @ v).item() - top.value) < 1e-12 * abs(top.value)
    residual = ((H @ v - top.value * v).norm() / abs(top.value)).item()
    assert abs(residual - top.residual) < 1e-12


def test_hvp_sharpness_is_converged_at_the_returned_element(problem):
    # power iteration with 30 products per step used to report 3-6 % below the true value
    model, loss, x = problem
    found = minimise_over_orbit(model, loss, x, steps=10, rounds=1, method="hvp",
                                generator=torch.Generator().manual_seed(0))
    true = dense_top(found.element.act(model), loss, x)
    assert abs(found.sharpness - true) < 1e-6 * true
    assert found.sharpness == min(found.history)


def test_hvp_minimises_the_largest_not_the_most_negative_eigenvalue():
    # an indefinite Hessian whose most negative eigenvalue has the largest magnitude
    gen = torch.Generator().manual_seed(0)
    model = MultiHeadAttention(4, 2, 2, dtype=DTYPE, generator=gen)
    x = torch.randn(16, 5, 4, generator=gen, dtype=DTYPE)
    y = torch.randn(16, 5, 4, generator=gen, dtype=DTYPE)

    def loss(out):
        return ((out - y) ** 2).mean() - 3 * (out ** 2).mean()

    dense = minimise_over_orbit(model, loss, x, steps=5, rounds=1, method="dense")
    hvp = minimise_over_orbit(model, loss, x, steps=5, rounds=1, method="hvp",
                              generator=torch.Generator().manual_seed(0))
    assert dense.initial > 0
    assert abs(hvp.initial - dense.initial) < 1e-8 * dense.initial
    assert abs(hvp.sharpness - dense.sharpness) < 1e-6 * dense.sharpness


def test_orbit_minimisation_refuses_symmetry_breaking_models():
    from gaugebook.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(11, 8, 1, 2, 4, symmetry_breaking="bq")).double()
    idx = torch.randint(0, 11, (2, 6))
    with pytest.raises(ValueError, match="symmetry-breaking biases.*chapter 16"):
        minimise_over_orbit(model.eval(), lambda out: out[1], idx, idx, steps=1, rounds=1)


def test_flat_loss_is_deterministic_for_a_model_in_train_mode():
    from gaugebook.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(11, 8, 1, 2, 4, symmetry_breaking="bq")).double().train()
    idx = torch.randint(0, 11, (2, 6))
    L = FlatLoss(model, lambda out: out[1], idx, idx)
    assert L(L.theta).item() == L(L.theta).item() == model.eval()(idx, idx)[1].item()
