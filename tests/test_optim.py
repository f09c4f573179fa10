"""ECD follows its update equations; the fast path equals the reference; resume is exact."""
import functools
import io
import math
import os
import tempfile
import warnings

import pytest
import torch
from torch import nn

from gaugebook import ecd_kernels
from gaugebook.baselines import MultiOptimizer
from gaugebook.optim import ECD, ecd_dt, ecd_kappa, make_optimizer

DT = torch.float64


def test_ecd_kappa_and_dt():
    assert ecd_kappa(2.0, 2) == 2.0
    assert ecd_kappa(100.0, 101) == pytest.approx(50.5)
    with pytest.raises(ValueError, match="d >= 2"):
        ecd_kappa(1.0, 1)
    assert ecd_dt(0.3, 9.0) == pytest.approx(0.1)


def test_an_ecd_step_is_dt_v_plus_a_gradient_step():
    """theta' - theta = dt v - (lr^2/2) d/(d-1) g_perp/(F - F0), eta only in dt: the drift
    uses the kicked velocity, so a step is at least dt long."""
    A = torch.tensor([1.0, 4.0, 0.25], dtype=torch.float64)
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64))
    lr, eta, F0, d = 1.0, 100.0, -1.0, 3  # the paper's lr and eta
    opt = ECD([w], lr=lr, eta=eta, F0=F0)

    def closure():
        opt.zero_grad()
        loss = (A * w ** 2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    lengths = []
    for _ in range(6):
        theta, v = w.detach().clone(), opt.state[w]["velocity"].clone()
        F = (A * theta ** 2).sum()
        g = 2 * A * theta
        g_perp = g - v * (v @ g)
        predicted = theta + ecd_dt(lr, eta) * v - lr ** 2 / 2 * d / (d - 1) * g_perp / (F - F0)
        opt.step(closure)
        assert torch.allclose(w.detach(), predicted, rtol=0, atol=1e-13)
        lengths.append((w.detach() - theta).norm().item() / ecd_dt(lr, eta))
    assert min(lengths) >= 1 - 1e-12 and max(lengths) > 2  # as F nears F0, up to 8 dt here


def mlp(seed=0, dtype=DT):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2)).to(dtype)


def data(seed=1, dtype=DT):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(16, 4, generator=g, dtype=dtype),
            torch.randn(16, 2, generator=g, dtype=dtype))


def closure_for(model, opt, x, y, shift=0.0):
    def closure():
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean() + shift
        loss.backward()
        return loss
    return closure


def run(model, opt, steps, x, y, shift=0.0):
    closure = closure_for(model, opt, x, y, shift)
    for _ in range(steps):
        opt.step(closure)


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


# ---------- an independent implementation of the equations, on one flat vector ----------

def equations(model, x, y, steps, *, lr, eta, F0, weight_decay=0.0, projection="global"):
    """theta after each step, from the ECD equations written out on a flat parameter vector."""
    shapes = [p.shape for p in model.parameters()]
    sizes = [p.numel() for p in model.parameters()]
    names = [n for n, _ in model.named_parameters()]
    theta = flat(model).clone()
    d = theta.numel()
    dt, kappa = lr / math.sqrt(eta), eta / 2 * d / (d - 1)

    def F_and_g(theta):
        theta = theta.detach().requires_grad_(True)
        values = {n: t.view(s) for n, t, s in zip(names, theta.split(sizes), shapes)}
        out = torch.func.functional_call(model, values, (x,))
        F = ((out - y) ** 2).mean() + weight_decay / 2 * theta.square().sum()
        (g,) = torch.autograd.grad(F, theta)
        return F.item(), g

    v, trajectory = None, []
    for _ in range(steps):
        F, g = F_and_g(theta)
        if v is None:
            v = -g / g.norm()
        v = v / v.norm()
        if projection == "global":
            perp = g - v * (v @ g)
        else:
            perp = torch.cat([gi - vi * (vi @ gi)
                              for vi, gi in zip(v.split(sizes), g.split(sizes))])
        v = v - kappa * dt * perp / (F - F0)
        theta = theta + dt * v
        trajectory.append(theta.clone())
    return trajectory


@pytest.mark.parametrize("projection", ["global", "per_tensor"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.3])
@pytest.mark.parametrize("foreach", [False, True])
def test_trajectory_follows_the_equations(projection, weight_decay, foreach):
    x, y = data()
    hp = dict(lr=0.3, eta=4.0, F0=-0.5, weight_decay=weight_decay)
    expected = equations(mlp(), x, y, 12, projection=projection, **hp)
    model = mlp()
    opt = ECD(model.parameters(), projection=projection, foreach=foreach, **hp)
    closure = closure_for(model, opt, x, y)
    for step, theta in enumerate(expected):
        opt.step(closure)
        assert (flat(model) - theta).abs().max() < 1e-12, f"step {step + 1}"


def test_fast_path_when_the_one_pass_kick_degenerates():
    """The fast path forms the kicked velocity a v - c g as (a - c) lerp(v, g, -c/(a - c)). On
    the first step (v = -g/|g|) an F0 with c = 1/(1 + |g|) makes a - c = 0: the two-pass branch
    must then give the same trajectory."""
    x, y = data()
    lr, eta = 0.3, 4.0
    model = mlp()
    loss = ((model(x) - y) ** 2).mean()
    g_norm = torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, model.parameters())]).norm()
    d = sum(p.numel() for p in model.parameters())
    kick_dt = eta / 2 * d / (d - 1) * lr / math.sqrt(eta)  # c = kick_dt / (F - F0)
    F0 = loss.item() - kick_dt * (1 + g_norm.item())
    expected = equations(mlp(), x, y, 4, lr=lr, eta=eta, F0=F0)
    opt = ECD(model.parameters(), lr=lr, eta=eta, F0=F0, foreach=True)
    closure = closure_for(model, opt, x, y)
    for step, theta in enumerate(expected):
        opt.step(closure)
        assert (flat(model) - theta).abs().max() < 1e-12, f"step {step + 1}"


def test_velocity_has_unit_norm_after_every_step():
    x, y = data()
    model = mlp()
    opt = ECD(model.parameters(), lr=0.5, eta=2.0, F0=-1.0, nu=0.5, weight_decay=0.1)
    closure = closure_for(model, opt, x, y)
    for _ in range(15):
        opt.step(closure)
        v = torch.cat([opt.state[p]["velocity"].reshape(-1) for p in model.parameters()])
        assert abs(v.norm().item() - 1) < 1e-12


def test_foreach_equals_reference():
    """Two groups (different lr and weight decay), chaos on: the paths agree to round-off."""
    x, y = data()
    models, opts = [], []
    for foreach in (False, True):
        model = mlp()
        torch.manual_seed(123)  # seeds the chaos generator
        groups = [{"params": model[0].parameters(), "lr": 0.2, "weight_decay": 0.05},
                  {"params": model[2].parameters()}]
        opts.append(ECD(groups, lr=0.4, eta=3.0, F0=-0.2, nu=0.3, foreach=foreach))
        models.append(model)
    for _ in range(10):
        for model, opt in zip(models, opts):
            opt.step(closure_for(model, opt, x, y))
    assert (flat(models[0]) - flat(models[1])).abs().max() < 1e-14
    for p, q in zip(models[0].parameters(), models[1].parameters()):
        diff = (opts[0].state[p]["velocity"] - opts[1].state[q]["velocity"]).abs().max()
        assert diff < 1e-14


def test_mixed_dtypes(nu=0.1):
    """Velocities live in one flat buffer per dtype; both paths handle several dtypes."""
    x, y = data(dtype=torch.float32)
    trajectories = []
    for foreach in (False, True):
        model = mlp(dtype=torch.float32)
        model[2].double()
        torch.manual_seed(5)
        opt = ECD([{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": 0.1}],
                  lr=0.3, eta=2.0, F0=-1.0, nu=nu, weight_decay=0.01, foreach=foreach)

        def closure():
            opt.zero_grad()
            loss = ((model[2](model[1](model[0](x)).double()) - y.double()) ** 2).mean()
            loss.backward()
            return loss
        for _ in range(6):
            opt.step(closure)
        v = torch.cat([opt.state[p]["velocity"].double().reshape(-1) for p in model.parameters()])
        assert abs(v.norm().item() - 1) < 1e-6
        assert {t.dtype for t in opt._flat.values()} == {torch.float32, torch.float64}
        trajectories.append(flat(model.double()))
    assert (trajectories[0] - trajectories[1]).abs().max() < 1e-5  # float32 round-off


def test_state_is_half_of_adamw():
    model = nn.Sequential(nn.Embedding(50, 16), nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 50))
    idx = torch.randint(0, 50, (4, 8))

    def state_bytes_after_one_step(opt):
        def closure():
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(idx).flatten(0, 1), idx.flatten())
            loss.backward()
            return loss
        opt.step(closure)
        return sum(t.numel() * t.element_size() for s in opt.state.values()
                   for t in s.values() if torch.is_tensor(t))

    ecd = state_bytes_after_one_step(ECD(model.parameters(), lr=0.1, eta=10.0, F0=0.0))
    adamw = state_bytes_after_one_step(torch.optim.AdamW(model.parameters()))
    assert ecd == sum(p.numel() * p.element_size() for p in model.parameters())  # one velocity
    assert 0.49 < ecd / adamw <= 0.5  # AdamW: two moments (+ a step counter per tensor)


def test_resume_is_exact():
    """10 steps == 5 steps, save, load into fresh objects, 5 steps (chaos and skipped steps on)."""
    x, y = data()

    def fresh():
        model = mlp()
        torch.manual_seed(7)
        return model, ECD(model.parameters(), lr=0.4, eta=2.0, F0=0.05, nu=0.2, weight_decay=0.01)

    model, opt = fresh()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        run(model, opt, 10, x, y)
        straight = flat(model).clone()

        model, opt = fresh()
        run(model, opt, 5, x, y)
        buffer = io.BytesIO()
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buffer)
        buffer.seek(0)
        saved = torch.load(buffer, weights_only=False)
        model, opt = fresh()
        torch.manual_seed(999)  # the global generator must not matter after loading
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        assert opt.steps + opt.skipped_steps == 5
        run(model, opt, 5, x, y)
    assert torch.equal(flat(model), straight)


def test_skipped_steps_warn_once_and_are_counted():
    x, y = data()
    model = mlp()
    before = flat(model).clone()
    opt = ECD(model.parameters(), lr=0.1, eta=1.0, F0=100.0)
    with pytest.warns(RuntimeWarning, match="Lower F0") as record:
        run(model, opt, 3, x, y)
    assert len([w for w in record if "F0" in str(w.message)]) == 1
    assert opt.skipped_steps == 3 and opt.steps == 0
    assert torch.equal(flat(model), before)
    assert opt.state_dict()["ecd"]["skipped_steps"] == 3


def test_continuum_limit_is_first_order():
    """As dt -> 0 the steps follow the ray dtheta/ds = v, dv/ds = -kappa P_v g / (F - F0)."""
    from scipy.integrate import solve_ivp

    A = torch.tensor([[3.0, 0.5, 0.0], [0.5, 1.0, 0.2], [0.0, 0.2, 0.3]], dtype=DT)
    theta0, eta, F0, S = torch.tensor([1.0, -0.5, 0.8], dtype=DT), 2.0, -0.5, 0.6
    d = 3
    kappa = eta / 2 * d / (d - 1)

    def F(t):
        return 0.5 * t @ A @ t

    def rhs(_, z):
        t, v = torch.from_numpy(z[:3]), torch.from_numpy(z[3:])
        g = A @ t
        return torch.cat([v, -kappa * (g - v * (v @ g)) / (F(t) - F0)]).numpy()

    g0 = A @ theta0
    z0 = torch.cat([theta0, -g0 / g0.norm()]).numpy()
    exact = solve_ivp(rhs, (0, S), z0, rtol=1e-12, atol=1e-12).y[:3, -1]

    errors = []
    for dt in (0.01, 0.005):
        theta = nn.Parameter(theta0.clone())
        opt = ECD([theta], lr=dt * math.sqrt(eta), eta=eta, F0=F0)

        def closure():
            opt.zero_grad()
            loss = F(theta)
            loss.backward()
            return loss
        for _ in range(round(S / dt)):
            opt.step(closure)
        errors.append((theta.detach() - torch.from_numpy(exact)).norm().item())
    assert errors[0] < 0.05
    assert 1.6 < errors[0] / errors[1] < 2.4  # error proportional to dt


def test_global_projection_commutes_with_rotations():
    """Global ECD is O(d)-equivariant; the per-tensor shortcut is not."""
    g = torch.Generator().manual_seed(3)
    A = torch.randn(5, 5, generator=g, dtype=DT)
    A = A @ A.T + torch.eye(5, dtype=DT)
    R = torch.linalg.qr(torch.randn(5, 5, generator=g, dtype=DT))[0]
    theta0 = torch.randn(5, generator=g, dtype=DT)

    def trajectory(rotation, projection):
        a = nn.Parameter((rotation @ theta0)[:3].clone())
        b = nn.Parameter((rotation @ theta0)[3:].clone())
        opt = ECD([a, b], lr=0.3, eta=2.0, F0=-1.0, projection=projection)

        def closure():
            opt.zero_grad()
            t = rotation.T @ torch.cat([a, b])
            loss = 0.5 * t @ A @ t
            loss.backward()
            return loss
        for _ in range(8):
            opt.step(closure)
        return torch.cat([a, b]).detach()

    I = torch.eye(5, dtype=DT)
    for projection, equivariant in (("global", True), ("per_tensor", False)):
        error = (trajectory(R, projection) - R @ trajectory(I, projection)).abs().max().item()
        assert (error < 1e-12) == equivariant, (projection, error)


def _ddp_worker(rank, world_size, init_file, out_file):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world_size)
    x, y = data()
    model = mlp()
    opt = ECD(model.parameters(), lr=0.3, eta=2.0, F0=-0.5)
    run(model, opt, 4, x, y, shift=float(rank))  # same gradient, losses differ by the rank
    if rank == 0:
        torch.save(flat(model), out_file)
    dist.destroy_process_group()


def test_ddp_averages_the_loss():
    import torch.multiprocessing as mp

    x, y = data()
    model = mlp()
    opt = ECD(model.parameters(), lr=0.3, eta=2.0, F0=-0.5)
    run(model, opt, 4, x, y, shift=0.5)  # the mean of the shifts 0 and 1
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "theta.pt")
        mp.spawn(_ddp_worker, args=(2, os.path.join(tmp, "init"), out), nprocs=2)
        assert (torch.load(out) - flat(model)).abs().max() < 1e-13


@pytest.mark.parametrize("kwargs, match", [
    (dict(lr=0.0), "lr"), (dict(lr=-1.0), "lr"), (dict(eta=0.0), "eta"),
    (dict(nu=-0.1), "nu"), (dict(weight_decay=-1e-3), "weight_decay"),
    (dict(F0=float("nan")), "F0"), (dict(F0=float("inf")), "F0"), (dict(F0="low"), "F0"),
    (dict(projection="per_layer"), "projection"), (dict(lr="fast"), "lr"),
    (dict(fused="yes"), "fused must be None, True or False"),
    (dict(fused=1), "fused must be None, True or False"),  # 1 == True, yet not a bool
    (dict(foreach=0), "foreach must be None, True or False"),
])
def test_bad_hyperparameters(kwargs, match):
    hp = dict(lr=0.1, eta=1.0, F0=0.0) | kwargs
    with pytest.raises(ValueError, match=match):
        ECD(mlp().parameters(), **hp)


def test_clear_errors():
    x, y = data()
    model = mlp()
    opt = ECD(model.parameters(), lr=0.1, eta=1.0, F0=-1.0)
    with pytest.raises(ValueError, match="closure"):
        opt.step()
    with pytest.raises(FloatingPointError, match="loss"):
        run(model, opt, 1, x, y, shift=float("nan"))
    hook = model[2].weight.register_hook(lambda g: g * float("nan"))  # finite loss, NaN gradient
    with pytest.raises(FloatingPointError, match=r"gradient of parameter 2 \(shape \(2, 6\)\)"):
        run(model, opt, 1, x, y)
    hook.remove()
    for lr in (1e15, 1e30):  # |v'|^2 cancels to 0 or below: ZeroDivisionError, math domain error
        huge = ECD(model.parameters(), lr=lr, eta=1.0, F0=-1.0)
        with pytest.raises(FloatingPointError, match="squared norm came out .* lower lr"):
            run(model, huge, 3, x, y)
    with pytest.raises(ValueError, match="shared"):
        ECD([{"params": model[0].parameters(), "eta": 2.0}, {"params": model[2].parameters()}],
            lr=0.1, eta=1.0, F0=0.0)
    with pytest.raises(ValueError, match="at least 2"):
        ECD([nn.Parameter(torch.ones(1))], lr=0.1, eta=1.0, F0=0.0)
    w = nn.Parameter(torch.zeros(3))
    flat_loss = ECD([w], lr=0.1, eta=1.0, F0=-1.0)

    def closure():
        flat_loss.zero_grad()
        loss = (w * 0).sum() + 1
        loss.backward()
        return loss
    with pytest.raises(ValueError, match="gradient is exactly zero"):
        flat_loss.step(closure)
    u = nn.Parameter(torch.ones(3))
    with pytest.raises(ValueError, match=r"no parameter has a gradient; the closure must call "
                       r"loss.backward\(\)"):  # was reported as an exactly zero gradient
        ECD([u], lr=0.1, eta=1.0, F0=-1.0).step(lambda: (u ** 2).sum().detach() + 1)


def test_make_optimizer_builds_the_baselines():
    x, y = data(dtype=torch.float32)
    for name, hp in [("ecd", dict(lr=0.1, eta=10.0, F0=0.0)), ("adamw", dict(lr=1e-3)),
                     ("sgdm", dict(lr=1e-2)), ("muon", dict(lr=1e-3)), ("soap", dict(lr=1e-3))]:
        model = mlp(dtype=torch.float32)
        before = flat(model).clone()
        params = model.named_parameters() if name == "muon" else model.parameters()
        opt = make_optimizer(name, params, **hp)
        for _ in range(2):
            opt.step(closure_for(model, opt, x, y))
        assert not torch.equal(flat(model), before), name
    sgd = make_optimizer("sgdm", mlp().parameters(), lr=0.1)
    assert sgd.defaults["nesterov"] and sgd.defaults["momentum"] == 0.95
    assert make_optimizer("adamw", mlp().parameters(), lr=0.1).defaults["fused"] is True
    assert not make_optimizer("adamw", mlp().parameters(), lr=0.1, foreach=True).defaults["fused"]
    with pytest.raises(ValueError, match="valid names: ecd, adamw, sgdm, muon, soap"):
        make_optimizer("adam", mlp().parameters(), lr=0.1)
    with pytest.raises(ValueError, match="lr"):
        make_optimizer("adamw", mlp().parameters())


def test_muon_gets_the_matrices_adamw_the_rest():
    model = nn.ModuleDict({"wte": nn.Embedding(10, 4), "fc": nn.Linear(4, 4),
                           "ln": nn.LayerNorm(4)})
    opt = make_optimizer("muon", model.named_parameters(), lr=1e-3)
    assert isinstance(opt, MultiOptimizer)
    muon, adamw = opt.optimizers
    assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    assert [p for g in muon.param_groups for p in g["params"]] == [model["fc"].weight]
    assert len([p for g in adamw.param_groups for p in g["params"]]) == 4  # wte, fc.bias, ln x2
    with pytest.raises(ValueError, match="named_parameters"):
        make_optimizer("muon", model.parameters(), lr=1e-3)


def test_muon_routes_a_gpt_by_role():
    """Per-head attention weights go to Muon one head at a time, per-head biases [H, d] to
    AdamW (the old rule, ``ndim == 2``, did the opposite); a step moves every matrix as Muon."""
    from gaugebook.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(20, 8, 1, 2, 8, activation="prelu"))
    opt = make_optimizer("muon", model.named_parameters(), lr=0.02)
    muon, adamw = opt.optimizers
    names = {id(p): n for n, p in model.named_parameters()}
    to_adamw = {names[id(p)] for g in adamw.param_groups for p in g["params"]}
    to_muon = {names[id(p)] for p, _ in muon.pairs}
    attn = "blocks.0.attn."
    assert {attn + w for w in ("W_Q", "W_K", "W_V", "W_O")} | {"blocks.0.mlp.c_fc.weight",
                                                               "blocks.0.mlp.c_proj.weight"} \
        == to_muon
    assert {attn + b for b in ("b_Q", "b_K", "b_V", "b_O")} <= to_adamw and "wte.weight" in to_adamw
    idx = torch.randint(0, 20, (2, 8))
    before = model.blocks[0].attn.W_Q.detach().clone()
    opt.zero_grad()
    model(idx, idx)[1].backward()
    grad = model.blocks[0].attn.W_Q.grad.clone()
    opt.step()
    delta = model.blocks[0].attn.W_Q.detach() - before  # [H, D, dk]: one orthogonalised step per head
    reference = torch.optim.Muon([nn.Parameter(before[1].clone())], lr=0.02, weight_decay=0.1,
                                 adjust_lr_fn="match_rms_adamw")
    reference.param_groups[0]["params"][0].grad = grad[1]
    reference.step()
    assert torch.allclose(before[1] + delta[1], reference.param_groups[0]["params"][0], atol=1e-6)
    schedulers = [torch.optim.lr_scheduler.LambdaLR(o, lambda step: 0.5) for o in opt.optimizers]
    assert all(g["lr"] == 0.01 for g in opt.param_groups) and len(schedulers) == 2


@pytest.mark.parametrize("foreach", [True, False])
def test_float16_dot_products_do_not_overflow(foreach):
    w = nn.Parameter(torch.zeros(4000, dtype=torch.float16))  # g.g = 4000 * 25 > 65504
    opt = ECD([w], lr=0.1, eta=1.0, F0=-1e3, foreach=foreach)

    def closure():
        opt.zero_grad()
        loss = (w.float() * 5).sum() + 10  # gradient 5 in float16
        loss.backward()
        return loss
    for _ in range(2):
        opt.step(closure)
    v = opt.state[w]["velocity"].float()
    assert torch.isfinite(w).all() and v.norm().item() == pytest.approx(1.0, abs=1e-2)


def test_muon_refuses_parameter_groups():
    with pytest.raises(ValueError, match="not parameter groups"):
        make_optimizer("muon", [{"params": list(mlp().parameters())}], lr=1e-3)


def test_load_state_dict_moves_the_generator_state_to_the_cpu():
    """A checkpoint loaded onto an accelerator holds the chaos generator's state there;
    ``Generator.set_state`` takes CPU bytes only (simulated: ``.cpu()`` gives the tensor)."""
    class OffCPU:
        def __init__(self, tensor):
            self.tensor = tensor

        def cpu(self):
            return self.tensor

    opt = ECD(mlp().parameters(), lr=0.1, eta=1.0, F0=0.0, nu=0.1)
    state = opt.state_dict()
    expected = torch.randn(3, generator=opt._generators[0])  # drawn after the state was saved
    state["ecd"] = {**state["ecd"], "generators": [OffCPU(state["ecd"]["generators"][0])]}
    opt.load_state_dict(state)
    assert torch.equal(torch.randn(3, generator=opt._generators[0]), expected)


# ---------- members: R stacked models, each on its own trajectory ----------

def stacked(models):
    """``models`` as one set of stacked leaf parameters ``[R, ...]`` and a batched loss."""
    from torch.func import functional_call, stack_module_state, vmap

    params, _ = stack_module_state(models)
    params = {n: nn.Parameter(p) for n, p in params.items()}

    def losses(x, y):  # x [R, B, 4], y [R, B, 2] -> [R]
        def one(p, x, y):
            return ((functional_call(models[0], p, (x,)) - y) ** 2).mean()
        return vmap(one)(params, x, y)
    return params, losses


@pytest.mark.parametrize("projection", ["global", "per_tensor"])
@pytest.mark.parametrize("foreach", [False, True])
def test_members_follow_their_own_trajectories(projection, foreach, nu=0.2):
    """Three stacked models (own data, own chaos) follow, to 1e-10 over 50 steps, the runs of
    the same models alone; one member starts above F0 only later (its first steps skipped)."""
    R, steps = 3, 50
    data_r = [data(seed=10 + r) for r in range(R)]
    shifts = [0.0, 0.0, 0.0]
    hp = dict(lr=0.2, eta=4.0, F0=-0.5, nu=nu, weight_decay=0.1, projection=projection,
              foreach=foreach)
    blocks = lambda m: [[m[0].weight, m[2].weight]] if projection == "per_tensor" else None  # noqa: E731
    alone = []
    for r in range(R):
        model = mlp(seed=r)
        opt = ECD(model.parameters(), blocks=blocks(model), chaos_seeds=[100 + r], **hp)
        trajectory = []
        for _ in range(steps):
            opt.step(closure_for(model, opt, *data_r[r], shift=shifts[r]))
            trajectory.append(flat(model).clone())
        alone.append(trajectory)
    models = [mlp(seed=r) for r in range(R)]
    params, losses = stacked(models)
    x = torch.stack([d[0] for d in data_r])
    y = torch.stack([d[1] for d in data_r])
    p = list(params.values())
    opt = ECD(p, members=R, blocks=[[params["0.weight"], params["2.weight"]]]
              if projection == "per_tensor" else None, chaos_seeds=[100, 101, 102], **hp)

    def closure():
        opt.zero_grad()
        loss = losses(x, y)
        loss.sum().backward()
        return loss
    for step in range(steps):
        opt.step(closure)
        for r in range(R):
            mine = torch.cat([q[r].detach().reshape(-1) for q in p])
            assert (mine - alone[r][step]).abs().max() < 1e-10, (step, r)
    assert opt.steps == [steps] * R and opt.skipped_steps == [0] * R


def test_members_skip_on_their_own():
    """A member whose F is below F0 is frozen and counted; the others move."""
    models = [mlp(seed=r) for r in range(2)]
    params, losses = stacked(models)
    x, y = data()
    x, y = torch.stack([x, x]), torch.stack([y, y])
    opt = ECD(list(params.values()), lr=0.1, eta=1.0, F0=0.0, members=2)
    offset = torch.tensor([1.0, -100.0], dtype=DT)  # member 1: F < F0

    def closure():
        opt.zero_grad()
        loss = losses(x, y) + offset
        loss.sum().backward()
        return loss
    before = {n: q.detach().clone() for n, q in params.items()}
    with pytest.warns(RuntimeWarning, match="Lower F0"):
        for _ in range(3):
            opt.step(closure)
    assert opt.steps == [3, 0] and opt.skipped_steps == [0, 3]
    for n, q in params.items():
        assert torch.equal(q[1], before[n][1]) and not torch.equal(q[0], before[n][0])
    state = opt.state_dict()
    again = ECD(list(params.values()), lr=0.1, eta=1.0, F0=0.0, members=2)
    again.load_state_dict(state)
    assert again.steps == [3, 0] and again._started == [True, False]


def test_per_tensor_blocks_follow_the_equations():
    """A block of two tensors takes one dot product over both (written out on a flat vector)."""
    x, y = data()
    model = mlp()
    hp = dict(lr=0.3, eta=4.0, F0=-0.5)
    params = list(model.parameters())
    sizes = [q.numel() for q in params]
    theta, d = flat(model).clone(), sum(sizes)
    dt, kappa = hp["lr"] / math.sqrt(hp["eta"]), hp["eta"] / 2 * d / (d - 1)
    block_of = [0, 1, 0, 2]  # weights together, biases alone
    opt = ECD(params, projection="per_tensor", blocks=[[params[0], params[2]]], **hp)
    closure = closure_for(model, opt, x, y)
    v = None
    for step in range(10):
        reference = mlp()
        torch.nn.utils.vector_to_parameters(theta, reference.parameters())
        loss = ((reference(x) - y) ** 2).mean()
        g = torch.cat([t.reshape(-1) for t in torch.autograd.grad(loss, reference.parameters())])
        v = -g / g.norm() if v is None else v / v.norm()
        vs, gs = v.split(sizes), g.split(sizes)
        vg = [sum(float(vs[j] @ gs[j]) for j in range(4) if block_of[j] == block_of[i])
              for i in range(4)]
        perp = torch.cat([gs[i] - vs[i] * vg[i] for i in range(4)])
        v = v - kappa * dt * perp / (loss.item() - hp["F0"])
        theta = theta + dt * v
        opt.step(closure)
        assert (flat(model) - theta).abs().max() < 1e-12, f"step {step + 1}"


def test_gpt2_blocks_are_tensors_not_names():
    """The docstring's GPT-2 partition works; the names of gpt2_tensors get an error that says
    how to turn them into tensors."""
    from gaugebook.gpt import GPT, GPTConfig
    model = GPT(GPTConfig(20, 8, 1, 2, 8))
    params = dict(model.named_parameters())
    hp = dict(lr=0.1, eta=1.0, F0=0.0, projection="per_tensor")
    blocks = [[params[n] for n in names] for names in model.gpt2_tensors()]
    ECD(model.parameters(), blocks=blocks, **hp)
    with pytest.raises(TypeError, match=r"block 0 holds a str; pass tensors, e\.g\. "
                                        r"\[\[params\[n\] for n in names\]"):
        ECD(model.parameters(), blocks=model.gpt2_tensors(), **hp)


@pytest.mark.filterwarnings("ignore:optimizer contains a parameter group with duplicate")
def test_contract_errors():
    model = mlp()
    w = list(model.parameters())
    with pytest.raises(ValueError, match="listed twice"):
        ECD([w[0], w[0], w[1]], lr=0.1, eta=1.0, F0=0.0)
    with pytest.raises(ValueError, match="projection='per_tensor'"):
        ECD(w, lr=0.1, eta=1.0, F0=0.0, blocks=[[w[0]]])
    with pytest.raises(ValueError, match="two blocks"):
        ECD(w, lr=0.1, eta=1.0, F0=0.0, projection="per_tensor", blocks=[[w[0]], [w[0]]])
    with pytest.raises(ValueError, match="leading dimension of 3"):
        ECD(w, lr=0.1, eta=1.0, F0=0.0, members=3)
    opt = ECD(w, lr=0.1, eta=1.0, F0=-1.0)
    x, y = data()

    def vector_loss():
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean(0)
        loss.sum().backward()
        return loss
    with pytest.raises(ValueError, match="a scalar loss"):
        opt.step(vector_loss)
    adamw = torch.optim.AdamW(w, lr=0.1)
    with pytest.raises(ValueError, match="not written by ECD"):
        opt.load_state_dict(adamw.state_dict())


def test_a_state_of_another_number_of_members_is_refused():
    def stepped(R):
        w = torch.nn.Parameter(torch.randn(R, 5, dtype=torch.float64))
        opt = ECD([w], lr=0.1, eta=2.0, F0=-1.0, members=R, chaos_seeds=list(range(R)))

        def closure():
            opt.zero_grad()
            loss = (w ** 2).sum(1)
            loss.sum().backward()
            return loss
        opt.step(closure)
        return opt

    with pytest.raises(ValueError, match="state is of 3 stacked models.*members=3"):
        stepped(2).load_state_dict(stepped(3).state_dict())


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize("R", [1, 3])
def test_segmented_dot_products_equal_one_dot_per_segment(dtype, R, monkeypatch):
    """The fast path's per-tensor dot products off the CPU (segmented reductions over pieces of
    at most PIECE columns, then over each segment's pieces) equal one dot product per segment,
    member by member, also for segments cut into several pieces and for an empty one."""
    from gaugebook.optim import _segment_dots, _Segments

    monkeypatch.setattr(_Segments, "PIECE", 4)
    assert _Segments.of([10, 4, 0], 1, "cpu").pieces.tolist() == [4, 3, 3, 4, 0]
    torch.manual_seed(0)
    sizes = [7, 1, 30, 0, 12]
    u, g = torch.randn(R, sum(sizes), dtype=dtype), torch.randn(R, sum(sizes), dtype=dtype)
    segments = _Segments.of(sizes, R, "cpu")
    assert segments.counts.tolist() == [2, 1, 8, 1, 3] * R
    segmented = _segment_dots(u, g, segments, segmented=True)
    per_segment = _segment_dots(u, g, segments, segmented=False)
    expected = torch.stack([(a.double() * b.double()).sum(1)
                            for a, b in zip(u.split(sizes, 1), g.split(sizes, 1))], dim=1)
    assert segmented.shape == per_segment.shape == (R, len(sizes))
    assert segmented.dtype == per_segment.dtype == torch.float64
    tol = 1e-12 if dtype == torch.float64 else 1e-4
    for got in (segmented, per_segment):
        assert (got - expected).abs().max() <= tol * expected.abs().max()


def test_per_tensor_dot_products_as_on_a_device_give_the_same_trajectories(monkeypatch):
    """Off the CPU the per-tensor dot products come from segmented reductions over short pieces.
    Forced on the CPU, with pieces of 4 columns (every tensor cut into several), one model
    follows the equations and stacked members follow their runs alone."""
    from gaugebook import optim

    monkeypatch.setattr(optim._Segments, "PIECE", 4)
    monkeypatch.setattr(optim, "_segment_dots",
                        functools.partial(optim._segment_dots, segmented=True))
    test_trajectory_follows_the_equations("per_tensor", 0.3, True)
    test_members_follow_their_own_trajectories("per_tensor", True)


def _force_steps_on_device(monkeypatch, fused: bool = False) -> list:
    """Make ECD take its device steps on the CPU (``fused``: ECD's fused kernels, in Triton's
    interpreter, else its PyTorch operators); the list records each one taken. The fused
    kernels get pieces of 8 columns, in iterations of 4: the tests' small tensors are then
    cut into several pieces, each walked in two iterations."""
    from gaugebook import optim

    step = "_step_fused" if fused else "_step_on_device"
    taken, device_step = [], getattr(optim.ECD, step)
    monkeypatch.setattr(optim, "_on_device", lambda t: True)
    monkeypatch.setattr(optim.ECD, step,
                        lambda self, *args: taken.append(1) or device_step(self, *args))
    if fused:
        monkeypatch.setattr(ecd_kernels, "PIECE", 8)
        monkeypatch.setattr(ecd_kernels, "_BLOCK", 4)
        init = optim.ECD.__init__
        monkeypatch.setattr(optim.ECD, "__init__",
                            lambda self, *args, **hp: init(self, *args, **{"fused": True, **hp}))
    return taken


# the device step both ways: PyTorch operators, and the fused kernels (where Triton is installed)
DEVICE_STEPS = [pytest.param(False, id="operators"),
                pytest.param(True, id="fused", marks=pytest.mark.skipif(
                    not ecd_kernels.AVAILABLE, reason="Triton is not installed"))]


@pytest.mark.parametrize("fused", DEVICE_STEPS)
def test_steps_on_a_device_follow_the_same_trajectories(fused, monkeypatch):
    """Off the CPU a step without chaos, once every member has started, computes its
    coefficients on the device and reads nothing to the host. Forced on the CPU: one model
    follows the equations in both projections, with weight decay and with a partition, and
    stacked members follow their runs alone (float64, the tolerances of the host path)."""
    taken = _force_steps_on_device(monkeypatch, fused)
    for projection in ("global", "per_tensor"):
        for weight_decay in (0.0, 0.3):
            test_trajectory_follows_the_equations(projection, weight_decay, True)
        test_members_follow_their_own_trajectories(projection, True, nu=0.0)
    test_per_tensor_blocks_follow_the_equations()
    test_mixed_dtypes(nu=0.0)  # two groups with their own lr, two dtypes
    assert len(taken) > 100


@pytest.mark.parametrize("fused", DEVICE_STEPS)
@pytest.mark.parametrize("projection", ["global", "per_tensor"])
def test_steps_on_a_device_follow_a_change_of_learning_rate(projection, fused, monkeypatch):
    """Groups with their own lr and a change of lr mid-run (as a scheduler makes it): the device
    path follows the host path (float64, 1e-12)."""
    x, y = data()
    trajectories = []
    for forced in (False, True):
        if forced:
            _force_steps_on_device(monkeypatch, fused)
        model = mlp()
        opt = ECD([{"params": model[0].parameters()}, {"params": model[2].parameters(),
                                                        "lr": 0.1}],
                  lr=0.3, eta=2.0, F0=-1.0, projection=projection)
        closure = closure_for(model, opt, x, y)
        for step in range(8):
            if step == 4:
                for group in opt.param_groups:
                    group["lr"] /= 2
            opt.step(closure)
        trajectories.append(flat(model).clone())
    assert (trajectories[0] - trajectories[1]).abs().max() < 1e-12


@pytest.mark.parametrize("fused", DEVICE_STEPS)
def test_steps_on_a_device_skip_and_count_like_the_host(fused, monkeypatch):
    """A started member whose F falls below F0 keeps its weights and velocity on the device
    path too; the counts, and the warning, come when they are read."""
    def trained(on_device: bool):
        models = [mlp(seed=r) for r in range(2)]
        params, losses = stacked(models)
        x, y = data()
        x, y = torch.stack([x, x]), torch.stack([y, y])
        opt = ECD(list(params.values()), lr=0.1, eta=1.0, F0=0.0, members=2,
                  projection="per_tensor")
        offset = torch.tensor([1.0, 1.0], dtype=DT)

        def closure():
            opt.zero_grad()
            loss = losses(x, y) + offset
            loss.sum().backward()
            return loss
        for step in range(6):
            offset[1] = 1.0 if step < 2 else -100.0  # member 1: F < F0 from step 3 on
            opt.step(closure)
        return params, opt

    with pytest.warns(RuntimeWarning, match="Lower F0"):  # at the step
        host_params, host = trained(False)
    assert host.skipped_steps == [0, 4]
    taken = _force_steps_on_device(monkeypatch, fused)
    params, opt = trained(True)
    assert len(taken) == 5 and opt._pending is not None  # counted later
    with pytest.warns(RuntimeWarning, match="Lower F0"):
        assert opt.steps == [6, 2] and opt.skipped_steps == [0, 4]
    for name, q in params.items():
        assert (q - host_params[name]).abs().max() < 1e-12, name
    for p, q in zip(params.values(), host_params.values()):
        velocity, expected = opt.state[p]["velocity"], host.state[q]["velocity"]
        assert (velocity - expected).abs().max() < 1e-12


def test_the_fused_step_names_what_it_needs(monkeypatch):
    """Without Triton, ``fused=True`` says to install it; on a CPU outside Triton's interpreter
    the kernels cannot run, and the error says how to run them or to leave them out."""
    monkeypatch.setattr(ecd_kernels, "AVAILABLE", False)
    with pytest.raises(ValueError, match="pip install triton"):
        ECD(mlp().parameters(), lr=0.1, eta=1.0, F0=0.0, fused=True)
    monkeypatch.undo()
    if not ecd_kernels.AVAILABLE:
        pytest.skip("Triton is not installed")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    params = [p.detach() for p in mlp().parameters()]
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        ecd_kernels.FusedStep(params, {DT: list(range(len(params)))}, 1)


def test_a_chaotic_step_off_the_cpu_reads_to_the_host_once(monkeypatch):
    """With chaos (``nu > 0``) every step takes the host path, which reads its scalars to the
    host in one ``tolist``; the device counts, never added to, are not read as well."""
    _force_steps_on_device(monkeypatch)
    x, y = data()
    model = mlp()
    opt = ECD(model.parameters(), lr=0.1, eta=1.0, F0=-1.0, nu=0.1)
    closure = closure_for(model, opt, x, y)
    opt.step(closure)
    reads, tolist = [], torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append(t.shape) or tolist(t))
    for _ in range(3):
        opt.step(closure)
    assert len(reads) == 3, reads


@pytest.mark.parametrize("fused", DEVICE_STEPS)
def test_a_non_finite_gradient_on_the_device_path_is_reported_when_counted(fused, monkeypatch):
    _force_steps_on_device(monkeypatch, fused)
    x, y = data()
    model = mlp()
    opt = ECD(model.parameters(), lr=0.1, eta=1.0, F0=-1.0)
    closure = closure_for(model, opt, x, y)
    opt.step(closure)
    x[0, 0] = float("nan")
    opt.step(closure)
    opt.step(closure)
    with pytest.raises(FloatingPointError, match="non-finite loss or gradient at or before step 3"):
        opt.steps


def test_a_group_added_to_ecd_is_checked_before_it_is_kept():
    """A refused group leaves the optimizer as it was; an accepted one joins the partition and
    the count d; a blocks partition, fixed at construction, refuses new groups."""
    a, b = torch.randn(3, requires_grad=True), torch.randn(2, requires_grad=True)
    opt = ECD([a], lr=0.1, eta=1.0, F0=-10.0, projection="per_tensor")
    with pytest.raises(ValueError, match="eta is shared"):
        opt.add_param_group({"params": [b], "eta": 5.0})
    assert len(opt.param_groups) == 1 and opt.dimension == 3
    opt.add_param_group({"params": [b]})
    assert opt.dimension == 5
    (a.sum() + b.square().sum()).backward()
    opt.step(lambda: a.sum() + b.square().sum())  # the per-tensor step covers both tensors
    fixed = ECD([a, b], lr=0.1, eta=1.0, F0=-10.0, projection="per_tensor", blocks=[[a, b]])
    with pytest.raises(ValueError, match="blocks partition was fixed"):
        fixed.add_param_group({"params": [torch.randn(2, requires_grad=True)]})


@pytest.mark.parametrize("foreach", [True, False])
def test_ecd_follows_parameters_whose_storage_was_replaced(foreach):
    # p.data = ... and vector_to_parameters give a parameter new storage; ECD must move that
    x = torch.randn(8, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    models = [nn.Linear(4, 3).double() for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    opts = [ECD(m.parameters(), lr=0.05, eta=1.0, F0=-1.0, foreach=foreach) for m in models]

    def step(k):
        def closure():
            models[k].zero_grad()
            loss = models[k](x).square().mean()
            loss.backward()
            return loss
        opts[k].step(closure)

    step(0), step(1)
    moved = models[0].weight.detach().clone()
    vector = nn.utils.parameters_to_vector(models[0].parameters()).clone()
    nn.utils.vector_to_parameters(vector, models[0].parameters())  # new storage, same values
    for _ in range(3):
        step(0), step(1)
    assert not torch.equal(models[0].weight, moved)
    for p, q in zip(*(m.parameters() for m in models)):
        assert torch.equal(p, q)  # the same trajectory as the untouched twin
    x = x.float()
    for p in models[0].parameters():
        p.data = p.data.float()
    with pytest.raises(ValueError, match=r"parameters \[0, 1\] .* changed dtype.* new ECD"):
        step(0)


def test_ecd_refuses_parameters_that_are_not_contiguous():
    conv = nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)
    with pytest.raises(ValueError, match=r"parameters \[0\] .* not contiguous.*contiguous_format"):
        ECD(conv.parameters(), lr=0.01, eta=1.0, F0=-1.0)
