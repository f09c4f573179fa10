"""gaugebook.lie and gaugebook.rope: tangent and momentum maps with frozen parameters and factor
options, and the one rule for ``rotary_dim`` (a positive even number at most ``d_head``)."""
import pytest
import torch

from gaugebook.attention import MultiHeadAttention
from gaugebook.gauge import ValueBiasShift
from gaugebook.gpt import GPT, GPTConfig
from gaugebook.gpt_gauge import LayerNormScale
from gaugebook.lie import (attention_terms, momentum_map, rope_commutant_basis,
                           rope_plane_breaking_basis, tangent_map)
from gaugebook.redundancy import predicted_redundancy
from gaugebook.rope import check_rotary_dim, rope_frequencies

F64 = torch.float64


def test_tangent_map_reads_frozen_parameters_the_action_needs():
    # b_O moves by -t W_O: with W_O frozen the action still reads it; its rows are left out
    layer = MultiHeadAttention(6, 2, 3, bias=True, dtype=F64,
                               generator=torch.Generator().manual_seed(0))
    full = tangent_map(layer, ValueBiasShift, trainable_only=False)
    layer.W_O.requires_grad_(False)
    frozen = tangent_map(layer, ValueBiasShift)
    keep = torch.cat([torch.full((p.numel(),), p.requires_grad) for p in layer.parameters()])
    assert frozen.shape == (int(keep.sum()), full.shape[1])
    assert torch.equal(frozen, full[keep])


def test_momentum_map_takes_the_factors_options():
    # <mu, X> = <p, T X>: the momentum map of ln_2's scaling is T^T p with T for ln_2
    torch.manual_seed(0)
    block = GPT(GPTConfig(11, 4, 1, 2, 6)).double().blocks[0]
    g = torch.Generator().manual_seed(1)
    momenta = {n: torch.randn(q.shape, generator=g, dtype=F64)
               for n, q in block.named_parameters()}
    mu = momentum_map(block, LayerNormScale, momenta, which="ln_2")
    T = tangent_map(block, LayerNormScale, which="ln_2")  # (n_params, D)
    p = torch.cat([momenta[n].reshape(-1) for n, _ in block.named_parameters()])
    assert torch.allclose(mu, T.T @ p, atol=1e-12)
    assert not torch.allclose(mu, momentum_map(block, LayerNormScale, momenta), atol=1e-6)


@pytest.mark.parametrize("rotary_dim", [0, 3, 6, -2, 2.0, True])
def test_check_rotary_dim_refuses_what_no_head_can_rotate(rotary_dim):
    with pytest.raises(ValueError, match="positive even number at most d_head=4"):
        check_rotary_dim(4, rotary_dim)
    with pytest.raises(ValueError, match="positive even number at most d_head=4"):
        MultiHeadAttention(8, 2, 4, rope=True, rotary_dim=rotary_dim)
    if rotary_dim != 0:  # 0 is "no RoPE" for the commutant basis
        with pytest.raises(ValueError, match="positive even number at most d_head=4"):
            rope_commutant_basis(4, rotary_dim)
        with pytest.raises(ValueError, match="positive even number at most d_head=4"):
            rope_plane_breaking_basis(4, rotary_dim, 0)


def test_attention_terms_default_to_full_rotary_as_the_layer_does():
    for rope in (True, "gated"):
        layer = MultiHeadAttention(8, 2, 4, bias=True, rope=rope)
        counted = attention_terms(d_in=8, d_out=8, n_kv_heads=2, group_size=1, d_head=4,
                                  d_value=4, bias=True, rope=rope)
        assert sum(counted.values()) == predicted_redundancy(layer)
    plain = attention_terms(d_in=8, d_out=8, n_kv_heads=2, group_size=1, d_head=4, d_value=4,
                            bias=True)
    assert sum(plain.values()) == predicted_redundancy(MultiHeadAttention(8, 2, 4, bias=True))
    with pytest.raises(ValueError, match="rope must be"):
        attention_terms(d_in=8, d_out=8, n_kv_heads=2, group_size=1, d_head=4, d_value=4,
                        bias=True, rope="Gated")
    with pytest.raises(ValueError, match="needs rope"):
        attention_terms(d_in=8, d_out=8, n_kv_heads=2, group_size=1, d_head=4, d_value=4,
                        bias=True, rotary_dim=2)


@pytest.mark.parametrize("base", [0.0, -1.0, float("nan"), float("inf")])
def test_rope_frequencies_need_a_positive_finite_base(base):
    with pytest.raises(ValueError, match="positive and finite"):
        rope_frequencies(4, base)


def test_project_onto_an_orthogonal_basis_and_refuse_a_zero_element():
    from gaugebook.lie import project

    basis = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 2.0], [-2.0, 0.0]]],
                         dtype=torch.float64)  # identity and a rotation generator, orthogonal
    X = torch.tensor([[3.0, 5.0], [1.0, 7.0]], dtype=torch.float64)
    # <X, I> / 2 = 5 and <X, J> / 8 = (10 - 2) / 8 = 1: 5 I + 1 J
    assert torch.allclose(project(X, basis), torch.tensor([[5.0, 2.0], [-2.0, 5.0]],
                                                          dtype=torch.float64))
    assert torch.allclose(project(torch.stack([X, 2 * X]), basis)[1], 2 * project(X, basis))
    with pytest.raises(ValueError, match=r"basis elements \[1\] are zero"):
        project(X, torch.stack([basis[0], torch.zeros(2, 2, dtype=torch.float64)]))


def test_momentum_map_reads_the_declared_shape_without_building_the_basis(monkeypatch):
    """The QK basis holds n_kv d^2 matrices of n_kv d^2 entries (19 GB for a GPT-2-small layer)
    only to give its shape; the charges of every attention family come without it."""
    from gaugebook.gauge import ATTENTION_ALGEBRA

    m = MultiHeadAttention(6, 4, 3, n_kv_heads=2, bias=True,
                           generator=torch.Generator().manual_seed(0))
    p = {n: torch.randn(t.shape, dtype=F64) for n, t in m.named_parameters()}
    expected = {f: momentum_map(m, f, p) for f in ATTENTION_ALGEBRA}
    for family in ATTENTION_ALGEBRA:
        monkeypatch.setattr(family, "lie_basis", classmethod(lambda cls, m: 1 / 0))
    for family, mu in expected.items():
        assert torch.equal(momentum_map(m, family, p), mu)
        assert mu.shape == family.shape(m)


def test_momentum_map_refuses_shapes_that_would_broadcast():
    from gaugebook.gauge import KeyBiasShift, QKTransform
    from gaugebook.lie import tangent_map

    m = MultiHeadAttention(6, 2, 3, bias=True, generator=torch.Generator().manual_seed(0))
    p = {n: torch.randn(t.shape, dtype=torch.float64) for n, t in m.named_parameters()}
    assert momentum_map(m, QKTransform, p).shape == (2, 3, 3)  # one matrix per group
    with pytest.raises(ValueError, match=r"one matrix per key/value group.*got \(3, 3\)"):
        momentum_map(m, QKTransform, p, shape=(3, 3))
    with pytest.raises(ValueError, match=r"its parameter's shape; got \{'W_Q': \(6, 3\)\}"):
        momentum_map(m, QKTransform, dict(p, W_Q=p["W_Q"][0]))
    with pytest.raises(ValueError, match=r"one shift per key/value group.*got \(3,\)"):
        tangent_map(m, KeyBiasShift, basis=torch.zeros(2, 3))


def test_a_random_element_of_any_continuous_family():
    """Seeded, validated, near the identity for a small scale; refused where the family has no
    algebra (a GELU MLP has no rescaling) and for a scale that is not positive."""
    from gaugebook.gpt_gauge import HiddenRescaling

    gpt = GPT(GPTConfig(11, 6, 1, 2, 8, activation="prelu"))
    mlp = gpt.blocks[0].mlp
    a, b = (HiddenRescaling.random(mlp, target="blocks.0.mlp",
                                   generator=torch.Generator().manual_seed(1)) for _ in range(2))
    assert torch.equal(a.s, b.s) and a.s.shape == (32,) and (a.s > 0).all()
    small = LayerNormScale.random(gpt.blocks[0], scale=1e-3, which="ln_1")
    assert (small.parameter - 1).abs().max() < 0.01 and small.which == "ln_1"
    with pytest.raises(ValueError, match="HiddenRescaling has no Lie algebra at this MLP"):
        HiddenRescaling.random(GPT(GPTConfig(11, 6, 1, 2, 8)).blocks[0].mlp)
    with pytest.raises(ValueError, match="scale must be finite and > 0"):
        HiddenRescaling.random(mlp, scale=0.0)


def test_attention_terms_under_fixed_draws_take_the_drawn_gauge_and_keep_the_biases():
    from gaugebook.lie import drawn_gauge

    shape = dict(d_in=8, d_out=8, n_kv_heads=2, group_size=2, d_head=3, d_value=4, bias=True)
    plain, drawn = attention_terms(**shape), attention_terms(**shape, draws=(2, 1))
    assert (drawn["qk_gauge"], drawn["vo_gauge"]) == drawn_gauge(
        n_kv_heads=2, d_head=3, d_value=4, d_out=8, r_q=2, r_v=1) == (2 * (9 - 6), 2 * 16 - 8)
    assert (drawn["key_bias"], drawn["value_bias"]) == (plain["key_bias"], plain["value_bias"])
    assert attention_terms(**shape, draws=(0, 0)) == plain  # no draw: the plain count
    with pytest.raises(ValueError, match="without RoPE"):
        attention_terms(**{**shape, "d_head": 4}, rope=True, draws=(1, 0))
    with pytest.raises(ValueError, match="assumes d_head, d_value <= d_in"):
        attention_terms(**{**shape, "d_in": 2}, draws=(0, 0))  # the plain count is not d^2
    for draws in ((1.5, 0), (1,), (-1, 0)):
        with pytest.raises(ValueError, match="draws must be a pair"):
            attention_terms(**shape, draws=draws)
