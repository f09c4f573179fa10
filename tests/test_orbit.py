import math

import pytest
import torch

from gaugebook.attention import MultiHeadAttention
from gaugebook.gauge import (GaugeElement, KeyBiasShift, QKTransform, ValueBiasShift,
                             VOTransform, invariance_error, qk_algebra, random_element)
from gaugebook.gpt import GPT, GPTConfig
from gaugebook.gpt_redundancy import LogProbabilities, make_generic_
from gaugebook.mechanics import flow_invariants
from gaugebook.orbit import balancing_element, orbit_dimension, orbit_tangents
from gaugebook.redundancy import jacobian, predicted_redundancy

DTYPE = torch.float64

# (d_model, n_heads, d_head, kwargs, stabiliser dimension at generic weights)
LAYERS = {
    "mha": (6, 3, 4, dict(), 0),
    "gqa-bias": (6, 4, 4, dict(n_kv_heads=2, bias=True), 0),
    "rope-bias-gqa": (6, 4, 4, dict(rope=True, n_kv_heads=2, bias=True), 0),
    "partial-rope-bias": (6, 3, 4, dict(rope=True, rotary_dim=2, bias=True), 0),
    "gated-rope": (6, 3, 4, dict(rope="gated", bias=True), 0),
    "wide-head": (3, 2, 5, dict(d_value=2), 2 * (5 - 3) ** 2),
    "wide-value-bias": (3, 2, 2, dict(d_value=5, bias=True), 2 * (5 - 3) ** 2),
}


def layer(name, generator):
    D, H, dk, kwargs, _ = LAYERS[name]
    return MultiHeadAttention(D, H, dk, dtype=DTYPE, generator=generator, **kwargs)


def flat(m):
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


def test_tangents_are_derivatives_of_the_library_action(generator):
    m = MultiHeadAttention(5, 4, 3, n_kv_heads=2, bias=True, dtype=DTYPE, generator=generator)
    T = orbit_tangents(m)
    per_group = T.shape[1] // m.n_kv_heads  # 9 (QK) + 9 (VO) + 3 (b_K) + 3 (b_V)
    assert per_group == 2 * 9 + 2 * 3
    a = torch.randn(T.shape[1], generator=generator, dtype=DTYPE)
    blocks = a.view(m.n_kv_heads, per_group)
    X, Y = blocks[:, :9].reshape(-1, 3, 3), blocks[:, 9:18].reshape(-1, 3, 3)
    t_K, t_V = blocks[:, 18:21], blocks[:, 21:]

    def moved(s):  # the library's finite action along the Lie-algebra direction a
        eye = torch.eye(3, dtype=DTYPE)
        g = GaugeElement([QKTransform(eye + s * X), VOTransform(eye + s * Y),
                          KeyBiasShift(s * t_K), ValueBiasShift(s * t_V)])
        return flat(g.act(m))

    s = 1e-5
    finite_difference = (moved(s) - moved(-s)) / (2 * s)
    error = (finite_difference - T @ a).abs().max() / (T @ a).abs().max()
    assert error < 1e-8


@pytest.mark.parametrize("name", LAYERS)
def test_orbit_is_in_the_jacobian_null_space(name, generator):
    m = layer(name, generator)
    x = torch.randn(4, 10, m.d_model, generator=generator, dtype=DTYPE)
    J, T = jacobian(m, x), orbit_tangents(m)
    assert T.shape[0] == J.shape[1] == sum(p.numel() for p in m.parameters())
    assert (J @ T).norm() < 1e-12 * J.norm() * T.norm()


@pytest.mark.parametrize("name", LAYERS)
def test_generic_orbit_dimension(name, generator):
    m = layer(name, generator)
    o = orbit_dimension(m)
    assert o.stabiliser == LAYERS[name][-1]
    assert o.orbit == o.lie - o.stabiliser == predicted_redundancy(m)
    assert o.free == (o.stabiliser == 0) and o.gap > 1e8
    kept = o.singular_values[o.orbit - 1] if o.orbit else math.inf  # the rank's tolerance
    assert (o.singular_values > o.tolerance).sum() == o.orbit and o.tolerance < kept


@pytest.mark.parametrize("kw", [dict(), dict(n_layer=2, activation="prelu", bias=False),
                                dict(n_embd=8, rope="gated")])
@pytest.mark.parametrize("output", ["log_probs", "logits"])
def test_the_orbit_of_a_gpt_takes_every_declared_symmetry(kw, output):
    """At generic weights all continuous symmetries of a GPT (attention, LayerNorm, residual,
    MLP, embeddings) act freely together: one orbit direction per generator, as many as the
    predicted redundancy."""
    g = torch.Generator().manual_seed(0)
    config = GPTConfig(**{**dict(vocab_size=11, block_size=6, n_layer=1, n_head=2, n_embd=6),
                          **kw})
    gpt = make_generic_(GPT(config), generator=g).double()
    model = LogProbabilities(gpt) if output == "log_probs" else gpt
    o = orbit_dimension(model)
    assert o.free and o.orbit == o.lie == predicted_redundancy(model) and o.gap > 1e8
    assert orbit_tangents(model).shape == (gpt.num_params(), o.lie)
    gpt.blocks[0].attn.requires_grad_(False)  # the orbit is the weights', trained or not
    assert orbit_dimension(model).orbit == o.orbit


def test_the_orbit_of_a_gpt_with_one_wide_head_has_a_stabiliser():
    """With d_head = n_embd some generators move the weights along the same directions (a
    stabiliser of dimension 1 here, measured), so the action is not free; the orbit still has
    the predicted dimension."""
    g = torch.Generator().manual_seed(0)
    gpt = make_generic_(GPT(GPTConfig(11, 6, n_layer=1, n_head=1, n_embd=6)), generator=g)
    o = orbit_dimension(LogProbabilities(gpt.double()))
    assert o.stabiliser == 1 and o.orbit == predicted_redundancy(LogProbabilities(gpt))
    with pytest.raises(ValueError, match="at eps = 0 the residual-stream scaling"):
        orbit_dimension(GPT(GPTConfig(11, 6, n_layer=1, n_head=2, n_embd=6,
                                      layer_norm_eps=0.0)).double())


def test_rope_bases():
    assert len(qk_algebra(MultiHeadAttention(6, 1, 6, rope=True))) == 6
    assert len(qk_algebra(MultiHeadAttention(6, 1, 6, rope=True, rotary_dim=4))) == 4 + 2**2
    assert len(qk_algebra(MultiHeadAttention(6, 1, 6, rope="gated", rotary_dim=4))) == 2 + 2
    assert len(qk_algebra(MultiHeadAttention(6, 1, 6))) == 36


@pytest.mark.parametrize("r_Q, r_K", [(2, 4), (2, 3), (1, 1), (0, 2)])
def test_stabiliser_of_rank_deficient_qk_pair(r_Q, r_K, generator):
    # X fixes (W_Q, W_K) iff W_Q X = 0 and X W_K^T = 0: (d_k - r_Q)(d_k - r_K) dimensions
    D, dk = 8, 4
    m = MultiHeadAttention(D, 1, dk, dtype=DTYPE, generator=generator)
    with torch.no_grad():
        for W, r in ((m.W_Q, r_Q), (m.W_K, r_K)):
            W[0] = torch.randn(D, r, generator=generator, dtype=DTYPE) @ \
                torch.randn(r, dk, generator=generator, dtype=DTYPE)
    assert orbit_dimension(m).stabiliser == (dk - r_Q) * (dk - r_K)


def test_rejects_other_modules():
    with pytest.raises(TypeError, match="MultiHeadAttention"):
        orbit_tangents(torch.nn.Linear(3, 3))


@pytest.mark.parametrize("kwargs", [dict(), dict(bias=True), dict(n_kv_heads=2, bias=True),
                                    dict(d_value=3)])
def test_balancing_element_reaches_the_balanced_point(kwargs, generator):
    m = MultiHeadAttention(8, 4, 4, dtype=DTYPE, generator=generator, **kwargs)
    m = random_element(m, cond=30.0, generator=generator).act(m)  # far from balance
    g = balancing_element(m)
    balanced = g.act(m)
    x = torch.randn(2, 6, 8, generator=generator, dtype=DTYPE)
    assert invariance_error(g, m, x) < 1e-12
    before, after = flow_invariants(m)[""], flow_invariants(balanced)[""]
    assert before.qk_norm.min() > 1.0 and before.vo_norm.min() > 1.0
    for C0, C in ((before.qk_norm, after.qk_norm), (before.vo_norm, after.vo_norm)):
        assert (C < 1e-12 * C0).all()


def test_a_layer_inside_a_gpt_is_balanced_in_place_of_the_model(generator):
    from gaugebook.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(11, 8, 2, 2, 8)).double()
    moved = random_element(model, cond=30.0, generator=generator).act(model)  # unbalanced
    g = balancing_element(moved.blocks[1].attn, target="blocks.1.attn")
    balanced = g.act(moved)
    assert flow_invariants(balanced)["blocks.1.attn"].qk_norm.max() < 1e-10
    assert flow_invariants(balanced)["blocks.0.attn"].qk_norm.min() > 1.0  # untouched
    idx = torch.randint(0, 11, (2, 8), generator=generator)
    assert (balanced(idx)[0] - moved(idx)[0]).abs().max() < 1e-10


def test_balanced_point_minimises_the_weight_norm(generator):
    # for one head without biases: min over the orbit of |W_Q|^2 + |W_K|^2 is 2 |W_Q W_K^T|_*
    m = MultiHeadAttention(8, 2, 3, dtype=DTYPE, generator=generator)
    balanced = balancing_element(m).act(m)

    def sq_norm(m):
        return (m.W_Q.detach() ** 2).sum((1, 2)) + (m.W_K.detach() ** 2).sum((1, 2))

    nuclear = torch.linalg.matrix_norm(m.W_Q.detach() @ m.W_K.detach().mT, ord="nuc")
    assert torch.allclose(sq_norm(balanced), 2 * nuclear, rtol=1e-12)
    for seed in range(5):
        other = random_element(balanced, cond=3.0,
                               generator=torch.Generator().manual_seed(seed)).act(balanced)
        # compare head by head: the random element may relabel heads
        assert sq_norm(other).sort().values.ge(sq_norm(balanced).sort().values - 1e-12).all()


def test_balancing_rejects_rope_and_rank_deficiency(generator):
    with pytest.raises(ValueError, match="RoPE"):
        balancing_element(MultiHeadAttention(8, 2, 4, rope=True))
    wide = MultiHeadAttention(3, 1, 5, dtype=DTYPE, generator=generator)  # d_head > d_model
    with pytest.raises(ValueError, match="rank deficient"):
        balancing_element(wide)
    broken = MultiHeadAttention(8, 2, 4, dtype=DTYPE, generator=generator)
    with torch.no_grad():
        broken.W_Q[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="W_Q of MultiHeadAttention is not finite"):
        balancing_element(broken)
