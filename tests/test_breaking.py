"""The symmetry-breaking protocol: sampling statistics, and what a bias does to the gauge group."""
import math

import pytest
import torch

from gaugebook.attention import MultiHeadAttention
from gaugebook.breaking import QUERY_MEAN, QUERY_STD, VALUE_STD, ShiftedAttention, \
    SymmetryBreakingBias
from gaugebook.gauge import GaugeElement, KeyBiasShift, QKTransform
from gaugebook.linalg import random_gl
from gaugebook.redundancy import predicted_redundancy, redundancy

F64 = torch.float64
D, H, DK = 6, 2, 3  # d_head = d_value = DK <= D so the plain counts are dk^2 and dv^2


def attention(seed, *, n_kv=None, bias=False, rope=False, d_model=D, n_heads=H):
    g = torch.Generator().manual_seed(seed)
    return MultiHeadAttention(d_model, n_heads, DK, n_kv_heads=n_kv, bias=bias, rope=rope,
                              dtype=F64, generator=g)


def inputs(seed, d_model=D):
    return torch.randn(6, 8, d_model, generator=torch.Generator().manual_seed(seed), dtype=F64)


def draws(n, mode="bqv", seed=0):
    """``n`` training draws of the protocol (``mu_V = 0.5``): (query shifts [n, dk], value shifts
    [n, dv] or None)."""
    torch.manual_seed(seed)
    b = SymmetryBreakingBias(DK, DK, mode, mu_v=0.5 if mode == "bqv" else 0.0).double().train()
    q, v = zip(*(b() for _ in range(n)))
    return torch.stack(q), (None if mode == "bq" else torch.stack(v))


# --- the sampling protocol ------------------------------------------------------------------

def test_draw_statistics_match_the_protocol():
    torch.manual_seed(0)
    dk, dv, n = 8, 5, 20000
    b = SymmetryBreakingBias(dk, dv, "bqv", mu_v=0.5).train()
    q, v = map(torch.stack, zip(*(b() for _ in range(n))))  # (n, dk), (n, dv)
    q_std = torch.linspace(*QUERY_STD, dk)
    # 5 standard errors: the mean's is std/sqrt(n), the std's about std/sqrt(2n)
    assert torch.allclose(q.mean(0), torch.full((dk,), QUERY_MEAN), atol=5 * 0.15 / math.sqrt(n))
    assert torch.allclose(q.std(0), q_std, rtol=5 / math.sqrt(2 * n))
    assert torch.allclose(v.mean(0), torch.full((dv,), 0.5), atol=5 * VALUE_STD / math.sqrt(n))
    assert torch.allclose(v.std(0), torch.full((dv,), VALUE_STD), rtol=5 / math.sqrt(2 * n))
    # coordinates are independent
    corr = torch.corrcoef(q.T) - torch.eye(dk)
    assert corr.abs().max() < 5 / math.sqrt(n)


def test_new_draw_each_training_forward_and_means_in_eval():
    b = SymmetryBreakingBias(4, 4, "bqv")
    q1, v1 = b()
    q2, v2 = b()
    assert not torch.equal(q1, q2) and not torch.equal(v1, v2)
    b.eval()
    q, v = b()
    assert torch.equal(q, torch.full((4,), QUERY_MEAN)) and torch.equal(v, torch.zeros(4))
    assert torch.equal(b()[0], q)


def test_query_only_mode_and_reproducibility():
    b = SymmetryBreakingBias(4, 4, "bq")
    torch.manual_seed(3)
    q1, v1 = b()
    torch.manual_seed(3)
    q2, _ = b()
    assert v1 is None and torch.equal(q1, q2)


def test_biases_are_buffers_not_parameters():
    b = SymmetryBreakingBias(4, 3, "bqv", mu_v=0.5)
    assert list(b.parameters()) == []
    assert set(b.state_dict()) == {"q_mean", "q_std", "v_mean", "v_std"}
    q, v = b()
    assert not q.requires_grad and not v.requires_grad
    q, v = b.double()()
    assert q.dtype == v.dtype == F64 and q.shape == (4,) and v.shape == (3,)


@pytest.mark.parametrize("kwargs, match", [
    (dict(mode="bk"), "mode must be one of"),
    (dict(mode=None), "mode must be one of"),
    (dict(mode="bq", mu_v=0.5), "no effect"),
    (dict(mode="bqv", mu_v=math.nan), "mu_v must be a finite number"),
    (dict(mode="bqv", mu_v=math.inf), "mu_v must be a finite number"),
    (dict(mode="bqv", mu_v="0.5"), "mu_v must be a finite number"),
    (dict(mode="bq", d_head=0), "d_head must be a positive integer, got 0"),
    (dict(mode="bq", d_head=-1), "d_head must be a positive integer, got -1"),
    (dict(mode="bqv", d_value=2.0), "d_value must be a positive integer"),
])
def test_invalid_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SymmetryBreakingBias(**{"d_head": 4, "d_value": 4, **kwargs})


def test_one_draw_is_shared_by_all_heads():
    a = attention(0)
    with torch.no_grad():
        a.W_Q.zero_()  # queries are then the shift alone
    q, _ = draws(1, "bq")
    queries, _, _ = a.project(inputs(1), query_shift=q[0])  # (B, H, T, dk)
    assert torch.equal(queries[:, 0], queries[:, 1])
    assert torch.equal(queries[0, 0, 0], q[0])


# --- which gauge directions a bias removes ---------------------------------------------------

def test_learned_biases_keep_the_full_qk_gauge():
    """Learned biases add only their own redundant directions (``b_K`` cancels, ``b_V`` is absorbed
    by ``b_O``): the QK gauge is still ``dk^2`` per head, because ``b_Q -> b_Q M`` moves along."""
    x = inputs(1)
    plain, learned = redundancy(attention(0), x), redundancy(attention(0, bias=True), x)
    assert plain.dimension == H * (DK**2 + DK**2)
    assert learned.dimension - plain.dimension == H * (DK + DK)
    assert learned.dimension == predicted_redundancy(attention(0, bias=True))


def test_fixed_query_bias_leaves_the_stabiliser():
    x, (q, _) = inputs(1), draws(1, "bq")
    fixed = ShiftedAttention(attention(0), query_shifts=q)
    r = redundancy(fixed, x)
    assert r.dimension == H * (DK**2 - DK + DK**2) == predicted_redundancy(fixed)
    assert r.gap > 1e8


def test_learned_query_bias_absorbs_a_fixed_draw():
    x, (q, _) = inputs(1), draws(1, "bq")
    r = redundancy(ShiftedAttention(attention(0, bias=True), query_shifts=q), x)
    assert r.dimension == redundancy(attention(0, bias=True), x).dimension


def test_resampled_query_bias_removes_the_qk_gauge():
    x, (q, _) = inputs(1), draws(DK, "bq")  # dk draws span R^dk
    r = redundancy(ShiftedAttention(attention(0), query_shifts=q), x)
    assert r.dimension == H * DK**2  # only the VO gauge is left


def test_resampled_query_and_value_biases_remove_the_whole_gauge():
    x, (q, v) = inputs(1), draws(DK)
    assert redundancy(ShiftedAttention(attention(0), q, v), x).dimension == 0


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("n_kv, n_draws, which", [(2, 2, "q"), (2, 2, "qv"), (1, 2, "v"),
                                                  (1, 5, "qv"), (2, 4, "v")])
def test_measured_redundancy_matches_prediction(bias, n_kv, n_draws, which):
    q, v = draws(n_draws, seed=n_draws)
    m = ShiftedAttention(attention(0, n_kv=n_kv, bias=bias),
                         q if "q" in which else None, v if "v" in which else None)
    r = redundancy(m, inputs(1))
    assert r.dimension == predicted_redundancy(m)
    assert r.gap > 1e8


def test_prediction_when_value_heads_outnumber_the_model_width():
    """``n_kv d_value > d_model``: each value draw removes only ``d_model`` VO directions."""
    q, v = draws(2, seed=5)
    m = ShiftedAttention(attention(0, d_model=4), value_shifts=v)
    assert predicted_redundancy(m) == H * (DK**2 + DK**2) - 2 * 4
    assert redundancy(m, inputs(1, d_model=4)).dimension == predicted_redundancy(m)


def test_the_affine_action_is_a_symmetry_with_learned_bias_and_a_fixed_draw():
    """``W_Q -> W_Q M``, ``b_Q -> (b_Q + s) M - s``, ``W_K -> W_K M^{-T}`` keeps the output; the
    plain action ``b_Q -> b_Q M`` does not once ``s`` is there."""
    a, x = attention(0, bias=True), inputs(1)
    s = draws(1, "bq")[0][0]
    g = torch.Generator().manual_seed(2)
    M = torch.stack([random_gl(DK, 10.0, generator=g) for _ in range(H)])
    plain = GaugeElement([QKTransform(M)]).act(a)
    affine = GaugeElement([QKTransform(M)]).act(a)
    with torch.no_grad():
        affine.b_Q += (s[None, None] @ M)[:, 0] - s  # b_Q M + s M - s
    y = a(x, query_shift=s)
    scale = y.abs().max()
    assert ((affine(x, query_shift=s) - y).abs().max() / scale) < 1e-12
    assert ((plain(x, query_shift=s) - y).abs().max() / scale) > 1e-3


def test_stabiliser_of_a_fixed_query_bias_is_a_symmetry():
    """``M = I + P Z`` with ``P = I - s^T s / |s|^2`` fixes ``s`` and keeps the output."""
    a, x = attention(0), inputs(1)
    s = draws(1, "bq")[0][0]
    P = torch.eye(DK, dtype=F64) - torch.outer(s, s) / s.dot(s)
    Z = torch.randn(H, DK, DK, generator=torch.Generator().manual_seed(3), dtype=F64)
    M = torch.eye(DK, dtype=F64) + P @ Z
    assert torch.allclose(s @ M, s.expand(H, DK), atol=1e-14)
    y = a(x, query_shift=s)
    moved = GaugeElement([QKTransform(M)]).act(a)
    assert ((moved(x, query_shift=s) - y).abs().max() / y.abs().max()) < 1e-12


# --- b_K cancels in the softmax ---------------------------------------------------------------

@pytest.mark.parametrize("with_query_shift", [False, True])
def test_key_bias_cancels_without_rope(with_query_shift):
    a, x = attention(0, bias=True), inputs(1)
    s = draws(1, "bq")[0][0] if with_query_shift else None
    t = 3.0 * torch.randn(H, DK, generator=torch.Generator().manual_seed(4), dtype=F64)
    y = a(x, query_shift=s)
    shifted = GaugeElement([KeyBiasShift(t)]).act(a)
    assert ((shifted(x, query_shift=s) - y).abs().max() / y.abs().max()) < 1e-14


def test_key_bias_does_not_cancel_with_rope():
    x = inputs(1)
    a = MultiHeadAttention(D, H, 4, bias=True, rope=True, dtype=F64,
                           generator=torch.Generator().manual_seed(0))  # even d_head for RoPE
    t = torch.randn(H, 4, generator=torch.Generator().manual_seed(4), dtype=F64)
    y = a(x)
    assert ((GaugeElement([KeyBiasShift(t)]).act(a)(x) - y).abs().max() / y.abs().max()) > 1e-3


def test_shifted_attention_validates_draws():
    a = attention(0)
    with pytest.raises(ValueError, match="query_shifts must have shape"):
        ShiftedAttention(a, query_shifts=torch.zeros(2, DK + 1))
    with pytest.raises(ValueError, match="different numbers of draws"):
        ShiftedAttention(a, torch.zeros(2, DK), torch.zeros(3, DK))
    with pytest.raises(ValueError, match="give query_shifts"):
        ShiftedAttention(a)
    with pytest.raises(ValueError, match="without RoPE"):
        predicted_redundancy(ShiftedAttention(MultiHeadAttention(D, H, 4, rope=True),
                                              query_shifts=torch.ones(1, 4)))
