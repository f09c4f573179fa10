"""Noether charges under Hamiltonian integrators and the invariants of gradient flow."""
import pytest
import torch

from gaugebook.attention import MultiHeadAttention
from gaugebook.gpt import GPT, GPTConfig
from gaugebook.mechanics import Sectors, antisym, charges, flow_invariants, largest_norms, \
    qk_charge, qk_flow_invariant, vo_charge, vo_flow_invariant

F64 = torch.float64
D, DK = 5, 3


def attention(seed=0, **kw):
    kw = {"n_heads": 1, "d_head": DK, **kw}
    return MultiHeadAttention(D, kw.pop("n_heads"), kw.pop("d_head"), dtype=F64,
                              generator=torch.Generator().manual_seed(seed), **kw)


class Problem:
    """``L(theta) = |f(x) - y|^2 / (2 n)`` for an attention layer ``f`` on fixed data; the state
    is the layer's parameters (updated in place) and a momentum per parameter."""

    def __init__(self, model, query_shift=None, seed=1):
        g = torch.Generator().manual_seed(seed)
        self.model, self.query_shift = model, query_shift
        self.x = torch.randn(4, 6, D, generator=g, dtype=F64)
        self.y = torch.randn(4, 6, D, generator=g, dtype=F64)
        self.params = dict(model.named_parameters())
        self.p = {n: 0.5 * torch.randn(q.shape, generator=g, dtype=F64)
                  for n, q in self.params.items()}

    def loss(self):
        out = self.model(self.x, query_shift=self.query_shift)
        return 0.5 * ((out - self.y) ** 2).mean()

    def grad(self):
        self.model.zero_grad()
        self.loss().backward()
        return {n: q.grad.detach().clone() for n, q in self.params.items()}

    def energy(self):
        with torch.no_grad():
            return self.loss().item() + sum(0.5 * (p**2).sum().item() for p in self.p.values())

    @torch.no_grad()
    def drift(self, h):
        for n, q in self.params.items():
            q += h * self.p[n]

    def kick(self, h, g):
        for n in self.p:
            self.p[n] = self.p[n] - h * g[n]

    def leapfrog(self, h, steps):
        for _ in range(steps):
            self.kick(h / 2, self.grad())
            self.drift(h)
            self.kick(h / 2, self.grad())

    def explicit_euler(self, h, steps):
        for _ in range(steps):
            g = self.grad()
            self.drift(h)  # uses the old momentum
            self.kick(h, g)  # uses the old position's gradient

    @torch.no_grad()
    def gradient_descent(self, lr, steps):
        for _ in range(steps):
            with torch.enable_grad():
                g = self.grad()
            for n, q in self.params.items():
                q -= lr * g[n]

    def charges(self) -> Sectors:
        return charges(self.model, self.p)[""]


def relative_change(before, after):
    return ((after - before).norm() / before.norm()).item()


# --- exact conservation under a symplectic integrator ----------------------------------------

@pytest.mark.parametrize("kw", [dict(), dict(bias=True), dict(n_heads=2, n_kv_heads=1),
                                dict(d_head=4, rope=True, bias=True)])
def test_leapfrog_conserves_the_charges(kw):
    problem = Problem(attention(**kw))
    theta0 = torch.cat([q.detach().flatten().clone() for q in problem.params.values()])
    J0, E0 = problem.charges(), problem.energy()
    problem.leapfrog(0.05, 200)
    J1 = problem.charges()
    theta1 = torch.cat([q.detach().flatten() for q in problem.params.values()])
    assert relative_change(theta0, theta1) > 0.3  # the weights moved a lot
    assert abs(problem.energy() - E0) / E0 < 1e-2  # leapfrog keeps the energy close
    assert J0.qk.norm() > 0.1 and J0.vo.norm() > 0.1
    assert relative_change(J0.qk, J1.qk) < 1e-12
    assert relative_change(J0.vo, J1.vo) < 1e-12


def test_gqa_conserves_the_group_charge_not_the_head_terms():
    """The heads of a key/value group share their group element: only the sum is conserved."""
    problem = Problem(attention(n_heads=2, n_kv_heads=1))
    a = problem.model

    def head_term():  # antisym(W_Q[0]^T P_Q[0]), one query head's share of J_QK
        return antisym(a.W_Q[0].detach().T @ problem.p["W_Q"][0])

    before, J0 = head_term(), problem.charges().qk
    problem.leapfrog(0.05, 100)
    assert relative_change(before, head_term()) > 1e-2
    assert relative_change(J0, problem.charges().qk) < 1e-12


def test_rope_conserves_only_the_commutant_part():
    problem = Problem(attention(d_head=4, rope=True))
    a = problem.model

    def raw():
        return qk_charge(a.W_Q.detach(), a.W_K.detach(), problem.p["W_Q"], problem.p["W_K"])

    raw0, J0 = raw(), problem.charges().qk
    problem.leapfrog(0.05, 100)
    assert relative_change(raw0, raw()) > 1e-2
    assert relative_change(J0, problem.charges().qk) < 1e-12


def test_explicit_euler_drift_shrinks_with_the_step():
    """Explicit Euler changes J by ``-h^2 J(p, grad L)`` per step: over a fixed time ``O(h)``."""
    drifts = []
    for h in (0.04, 0.02, 0.01):
        problem = Problem(attention())
        J0 = problem.charges().qk
        problem.explicit_euler(h, round(2.0 / h))
        drifts.append(relative_change(J0, problem.charges().qk))
    assert drifts[-1] > 1e-5  # not conserved
    for coarse, fine in zip(drifts, drifts[1:]):
        assert 1.6 < coarse / fine < 2.5  # first order in h


# --- gradient flow ---------------------------------------------------------------------------

def one_gd_step(problem, lr):
    """Flow invariants before and after one GD step, and the gradient used."""
    before = flow_invariants(problem.model)[""]
    G = problem.grad()
    with torch.no_grad():
        for n, q in problem.params.items():
            q -= lr * G[n]
    return before, flow_invariants(problem.model)[""], G


def stacked_queries(a, W_Q, b_Q):
    """``[W_Q[h]; b_Q[h]]`` of the heads of each group stacked: ``[n_kv, G (D + b), dk]``."""
    W = torch.cat([W_Q, b_Q[:, None, :]], dim=1) if a.has_bias else W_Q
    return W.reshape(a.n_kv_heads, -1, a.d_head)


@pytest.mark.parametrize("kw", [dict(), dict(bias=True, n_heads=2, n_kv_heads=1)])
def test_one_gd_step_changes_the_invariants_only_at_second_order(kw):
    """``(W - lr G)^T (W - lr G) - W^T W = -lr (G^T W + W^T G) + lr^2 G^T G``; invariance makes the
    first-order terms cancel between Q and K (V and O), so ``Delta C = lr^2 C(G)`` exactly."""
    problem, lr = Problem(attention(**kw)), 0.01
    a = problem.model
    W_Q = stacked_queries(a, a.W_Q.detach().clone(), a.b_Q.detach().clone() if a.has_bias else None)
    before, after, G = one_gd_step(problem, lr)
    G_Q = stacked_queries(a, G["W_Q"], G.get("b_Q"))
    aug = (lambda W, b: torch.cat([W, b[:, None]], dim=1)) if a.has_bias else (lambda W, b: W)
    G_K, G_V = aug(G["W_K"], G.get("b_K")), aug(G["W_V"], G.get("b_V"))
    G_O = G["W_O"].view(a.n_kv_heads, a.group_size, a.d_value, D).transpose(1, 2) \
        .reshape(a.n_kv_heads, a.d_value, -1)
    assert relative_change(after.qk - before.qk, lr**2 * qk_flow_invariant(G_Q, G_K)) < 1e-9
    assert relative_change(after.vo - before.vo, lr**2 * vo_flow_invariant(G_V, G_O)) < 1e-9
    # a first-order term that failed to cancel would be this large
    first_order = lr * (G_Q.mT @ W_Q).norm()
    assert (after.qk - before.qk).norm() < 0.1 * first_order


def test_gradient_flow_invariants_drift_as_lr():
    """Over a fixed time the ``O(lr^2)`` per-step changes add up to ``O(lr)``, while ``W_Q^T W_Q``
    itself changes by ``O(1)``."""
    drifts, moves = [], []
    for lr in (0.1, 0.05):
        problem = Problem(attention())
        a = problem.model
        C0, gram0 = flow_invariants(a)[""], a.W_Q.detach().mT @ a.W_Q.detach()
        problem.gradient_descent(lr, round(4.0 / lr))
        C1 = flow_invariants(a)[""]
        drifts.append(max(relative_change(C0.qk, C1.qk), relative_change(C0.vo, C1.vo)))
        moves.append(relative_change(gram0, a.W_Q.detach().mT @ a.W_Q.detach()))
    assert 1.7 < drifts[0] / drifts[1] < 2.6
    assert drifts[1] < 0.1 * moves[1]


# --- a fixed query bias breaks the QK charge down to its stabiliser --------------------------

def projector(b):
    return torch.eye(len(b), dtype=F64) - torch.outer(b, b) / b.dot(b)


def test_fixed_query_bias_conserves_only_the_stabiliser_part():
    b = torch.tensor([0.5, 0.55, 0.6], dtype=F64)
    P = projector(b)
    problem = Problem(attention(), query_shift=b)
    J0 = problem.charges()
    problem.leapfrog(0.05, 200)
    J1 = problem.charges()
    assert relative_change(J0.qk, J1.qk) > 1e-2
    assert relative_change(P @ J0.qk @ P, P @ J1.qk @ P) < 1e-12
    assert relative_change(J0.vo, J1.vo) < 1e-12  # the VO sector is untouched by b_Q


def test_fixed_query_bias_breaks_the_flow_invariant():
    """With a fixed ``b`` only the stabiliser's invariant ``P C P`` changes at second order; the
    rest of ``C_QK`` drifts at first order and does not shrink with ``lr`` over a fixed time."""
    b = torch.tensor([0.5, 0.55, 0.6], dtype=F64)
    P = projector(b)
    lr = 0.01
    before, after, G = one_gd_step(Problem(attention(), query_shift=b), lr)
    second_order = lr**2 * qk_flow_invariant(G["W_Q"], G["W_K"])
    assert relative_change(P @ (after.qk - before.qk) @ P, P @ second_order @ P) < 1e-9
    assert (after.qk - before.qk - second_order).norm() > 10 * second_order.norm()
    full, projected = [], []
    for lr in (0.05, 0.025):
        problem = Problem(attention(), query_shift=b)
        C0 = flow_invariants(problem.model)[""].qk
        problem.gradient_descent(lr, round(4.0 / lr))
        C1 = flow_invariants(problem.model)[""].qk
        full.append(relative_change(C0, C1))
        projected.append(relative_change(P @ C0 @ P, P @ C1 @ P))
    assert 1.7 < projected[0] / projected[1] < 2.6
    assert full[1] > 10 * projected[1] and full[0] / full[1] < 1.3


# --- the per-head formulas and the model-level helpers ----------------------------------------

def test_charge_is_the_momentum_map():
    """``<p, delta theta> = <J, A> / 2`` for the action ``W_Q -> W_Q A``, ``W_K -> W_K A`` and
    ``W_V -> W_V B``, ``W_O -> -B W_O`` with antisymmetric ``A``, ``B``."""
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=F64)

    W_Q, W_K, P_Q, P_K, W_V, P_V = (r(D, DK) for _ in range(6))
    W_O, P_O = r(DK, D), r(DK, D)
    A, B = antisym(r(DK, DK)), antisym(r(DK, DK))
    pairing_qk = (P_Q * (W_Q @ A)).sum() + (P_K * (W_K @ A)).sum()
    pairing_vo = (P_V * (W_V @ B)).sum() + (P_O * (-B @ W_O)).sum()
    assert torch.allclose(pairing_qk, (qk_charge(W_Q, W_K, P_Q, P_K) * A).sum() / 2)
    assert torch.allclose(pairing_vo, (vo_charge(W_V, W_O, P_V, P_O) * B).sum() / 2)
    assert torch.allclose(qk_flow_invariant(W_Q, W_K), W_Q.T @ W_Q - W_K.T @ W_K)
    assert torch.allclose(vo_flow_invariant(W_V, W_O), W_V.T @ W_V - W_O @ W_O.T)


def test_model_level_charges_sum_heads_of_a_group_and_include_biases():
    a = attention(n_heads=4, n_kv_heads=2, bias=True)
    g = torch.Generator().manual_seed(1)
    p = {n: torch.randn(q.shape, generator=g, dtype=F64) for n, q in a.named_parameters()}
    J = charges(a, p)[""]
    W = {n: q.detach() for n, q in a.named_parameters()}
    for group, heads in enumerate([(0, 1), (2, 3)]):
        qk = sum(qk_charge(torch.cat([W["W_Q"][h], W["b_Q"][h, None]]), torch.zeros(1, DK),
                           torch.cat([p["W_Q"][h], p["b_Q"][h, None]]), torch.zeros(1, DK))
                 for h in heads)
        qk = qk + qk_charge(torch.zeros(1, DK), torch.cat([W["W_K"][group], W["b_K"][group, None]]),
                            torch.zeros(1, DK), torch.cat([p["W_K"][group], p["b_K"][group, None]]))
        vo = antisym(torch.cat([W["W_V"][group], W["b_V"][group, None]]).T
                     @ torch.cat([p["W_V"][group], p["b_V"][group, None]]))
        vo = vo - sum(antisym(p["W_O"][h] @ W["W_O"][h].T) for h in heads)
        assert torch.allclose(J.qk[group], qk) and torch.allclose(J.vo[group], vo)
    assert J.qk_norm.shape == J.vo_norm.shape == (2,)
    # a sequence aligned with parameters() gives the same charges
    assert torch.equal(charges(a, list(p.values()))[""].qk, J.qk)


def test_largest_norms_take_the_worst_group_of_the_worst_layer():
    """Two layers whose largest QK and VO norms sit in different layers and groups."""
    eye = torch.eye(2, dtype=F64)
    by_layer = {"a": Sectors(torch.stack([eye, 5 * eye]), torch.stack([eye, eye])),
                "b": Sectors(torch.stack([2 * eye, eye]), torch.stack([eye, 7 * eye]))}
    qk, vo = largest_norms(by_layer)
    assert qk == pytest.approx(5 * 2 ** 0.5) and vo == pytest.approx(7 * 2 ** 0.5)
    with pytest.raises(ValueError, match="no attention layers"):
        largest_norms({})


def test_charges_validate_their_input():
    a = attention()
    p = {n: torch.zeros_like(q) for n, q in a.named_parameters()}
    with pytest.raises(ValueError, match="no momentum given for"):
        charges(a, {n: t for n, t in p.items() if n != "W_K"})
    with pytest.raises(ValueError, match="shapes differ"):
        charges(a, {**p, "W_Q": torch.zeros(2, 2)})
    with pytest.raises(ValueError, match="got 1 tensors"):
        charges(a, [p["W_Q"]])
    with pytest.raises(TypeError, match="mapping"):
        charges(a, p["W_Q"])


def test_a_model_without_attention_and_mismatched_factors_are_refused():
    linear = torch.nn.Linear(3, 3)
    for compute in (lambda: flow_invariants(linear), lambda: charges(linear, {})):
        with pytest.raises(TypeError, match="Linear contains no MultiHeadAttention"):
            compute()
    with pytest.raises(ValueError, match=r"W_Q \[\.\.\., D, dk\] and W_K .* got shapes "
                                         r"\(4, 16, 4\) and \(4, 16, 3\)"):
        qk_flow_invariant(torch.randn(4, 16, 4), torch.randn(4, 16, 3))
    with pytest.raises(ValueError, match="broadcastable"):
        qk_flow_invariant(torch.randn(4, 16, 4), torch.randn(3, 16, 4))
    with pytest.raises(ValueError, match=r"W_O \[\.\.\., dv, D'\]"):
        vo_flow_invariant(torch.randn(16, 4), torch.randn(3, 16))
    # a query with a bias row beside a key without: rows may differ, one dk x dk per head
    assert qk_flow_invariant(torch.randn(2, 17, 4), torch.randn(2, 16, 4)).shape == (2, 4, 4)
    assert vo_flow_invariant(torch.randn(16, 3), torch.randn(3, 16)).shape == (3, 3)


def test_gradient_of_a_gpt_carries_no_charge_unless_the_symmetry_is_broken():
    """An invariant loss has its gradient orthogonal to every orbit: ``J(theta, grad L) = 0`` in
    every layer. With the (eval-mode, fixed) breaking biases that fails."""
    def grad_charges(symmetry_breaking):
        torch.manual_seed(0)
        kw = dict(symmetry_breaking=symmetry_breaking, mu_v=0.5 if symmetry_breaking else 0.0)
        model = GPT(GPTConfig(37, 8, 2, 2, 16, **kw)).double().eval()
        with torch.no_grad():
            for q in model.parameters():
                q.add_(0.3 * torch.randn_like(q))
        idx = torch.randint(0, 37, (2, 8))
        model(idx, idx)[1].backward()
        grads = {n: q.grad for n, q in model.named_parameters()}
        weights = charges(model, {n: q.detach() for n, q in model.named_parameters()})
        return charges(model, grads), weights

    J, J_self = grad_charges(None)
    assert set(J) == {"blocks.0.attn", "blocks.1.attn"}
    assert all(s.qk.abs().max() < 1e-15 and s.vo.abs().max() < 1e-15 for s in J_self.values())
    scale = max(s.qk.abs().max() for s in grad_charges("bqv")[0].values())
    assert scale > 1e-6
    assert all(s.qk.abs().max() < 1e-10 * scale and s.vo.abs().max() < 1e-10 * scale
               for s in J.values())


def test_charges_work_under_inference_mode_and_equal_the_closed_forms_with_rope():
    """The model-level charges come from differentiating the gauge action (a momentum map);
    with partial RoPE they are the closed forms projected onto the QK commutant, and a caller
    under ``torch.inference_mode`` gets the same numbers."""
    from gaugebook.gauge import grouped_weights, qk_algebra
    from gaugebook.lie import project
    a = attention(n_heads=4, n_kv_heads=2, bias=True, rope=True, rotary_dim=2)
    g = torch.Generator().manual_seed(2)
    p = {n: torch.randn(q.shape, generator=g, dtype=F64) for n, q in a.named_parameters()}
    J = charges(a, p)[""]
    W = grouped_weights(a)
    aug = {s: torch.cat([p[f"W_{s}"], p[f"b_{s}"][:, None]], 1) for s in "QKV"}  # momenta, grouped
    PQ, PK, PV = aug["Q"].reshape(2, -1, DK), aug["K"], aug["V"]
    PO = p["W_O"].reshape(2, 2, DK, D).transpose(1, 2).reshape(2, DK, 2 * D)
    qk = project(qk_charge(W["Q"], W["K"], PQ, PK), qk_algebra(a))
    vo = antisym(W["V"].mT @ PV - PO @ W["O"].mT)
    assert torch.allclose(J.qk, qk, atol=1e-13) and torch.allclose(J.vo, vo, atol=1e-13)
    with torch.inference_mode():
        again = charges(a, {n: t.clone() for n, t in p.items()})[""]
    assert torch.equal(again.qk, J.qk) and torch.equal(again.vo, J.vo)


# --- the flow invariant of any declared family -------------------------------------------------

def test_flow_invariant_of_a_declared_family_is_the_attention_one_and_the_unit_balance():
    from gaugebook.gauge import QKTransform, VOTransform
    from gaugebook.gpt_gauge import HiddenRescaling
    from gaugebook.mechanics import flow_invariant

    a = attention(n_heads=2, n_kv_heads=1, bias=True)
    C = flow_invariants(a)[""]
    assert torch.allclose(flow_invariant(a, QKTransform), C.qk, rtol=0, atol=1e-12)
    assert torch.allclose(flow_invariant(a, VOTransform), C.vo, rtol=0, atol=1e-12)
    gpt = GPT(GPTConfig(11, 6, 1, 2, 8, activation="prelu")).double()
    mlp = gpt.blocks[0].mlp
    balance = (mlp.c_fc.weight.square().sum(1) + mlp.c_fc.bias.square()
               - mlp.c_proj.weight.square().sum(0)).detach()
    assert torch.allclose(flow_invariant(gpt, HiddenRescaling, "blocks.0.mlp"), balance,
                          rtol=0, atol=1e-12)


@pytest.mark.parametrize("family, target, options, config, order", [
    ("HiddenRescaling", "blocks.0.mlp", {}, {}, 2),
    ("LayerNormScale", "blocks.0", {"which": "ln_2"}, {}, 2),
    ("QKTransform", "blocks.0.attn", {}, {"rope": True}, 2),  # the commutant's part
    ("KeyBiasShift", "blocks.0.attn", {}, {"rope": True, "n_embd": 12}, 0),  # unrotated only
    ("EmbeddingShift", "", {}, {"rope": True}, 0),
    ("LayerNormShift", "blocks.0", {"which": "ln_1"}, {}, 1),  # b along the readers' rows
])
def test_a_gd_step_changes_a_flow_invariant_at_the_order_its_docstring_says(
        family, target, options, config, order):
    """A step ten times smaller changes a conserved invariant about a hundred times less (order
    2), a fixed translation's not at all (0), and one whose direction other parameters set
    about ten times less (1)."""
    import gaugebook.gauge as gauge
    import gaugebook.gpt_gauge as gpt_gauge
    from gaugebook.gpt_redundancy import make_generic_
    from gaugebook.mechanics import flow_invariant

    family = getattr(gpt_gauge, family, None) or getattr(gauge, family)
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 11, (4, 6), generator=g)
    changes = []
    for lr in (1e-2, 1e-3):
        torch.manual_seed(0)
        size = {"n_embd": 8, **config}
        gpt = GPT(GPTConfig(11, 6, 1, 2, activation="prelu", **size))
        gpt = make_generic_(gpt, generator=torch.Generator().manual_seed(1)).double()  # biases != 0
        before = flow_invariant(gpt, family, target, **options)
        _, loss = gpt(idx, idx)
        loss.backward()
        with torch.no_grad():
            for p in gpt.parameters():
                p -= lr * p.grad
        changes.append((flow_invariant(gpt, family, target, **options) - before).norm().item())
    if order == 0:
        assert max(changes) < 1e-12
    else:
        assert 0.7 * 10**order < changes[0] / changes[1] < 1.3 * 10**order, changes
