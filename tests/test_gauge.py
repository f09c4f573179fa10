import typing

import pytest
import torch

from conftest import tolerance
from gaugebook import gauge
from gaugebook.attention import MultiHeadAttention
from gaugebook.gpt import GPT, GPTConfig
from gaugebook.gauge import (GaugeElement, HeadPermutation, KeyBiasShift, QKTransform,
                             ValueBiasShift, VOTransform, invariance_error, random_element)
from gaugebook.linalg import random_gl
from gaugebook.rope import rotation_matrix

FLAVOURS = {
    "mha-bias": dict(bias=True),
    "gqa": dict(n_kv_heads=2, bias=True),
    "mqa": dict(n_kv_heads=1),
    "rope": dict(rope=True, bias=True),
    "gqa-rope": dict(rope=True, n_kv_heads=2),
    "partial-rope": dict(rope=True, rotary_dim=2, bias=True),
    "gated-rope": dict(rope="gated", bias=True),
    "wide-head": dict(d_value=10, bias=True),
}


def make(flavour, dtype, generator, d_model=8, d_head=4):
    return MultiHeadAttention(d_model, 4, d_head, dtype=dtype, generator=generator,
                              **FLAVOURS[flavour])


def inputs(m, generator, batch=3, T=9):
    return torch.randn(batch, T, m.d_model, generator=generator, dtype=m.W_Q.dtype)


def max_param_difference(a, b):
    return max((pa.double() - pb.double()).abs().max().item()
               for pa, pb in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_random_element_is_a_symmetry(flavour, dtype, generator):
    m = make(flavour, dtype, generator)
    g = random_element(m, cond=10.0, generator=generator)
    err = invariance_error(g, m, inputs(m, generator))
    assert err < tolerance(dtype, 10.0)
    if dtype == torch.float64:
        assert err < 1e-12  # the design's bar at condition number 10


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_random_element_shifts_every_free_key_bias_coordinate(flavour, generator):
    m = make(flavour, torch.float64, generator)
    shifts = [f for f in random_element(m, generator=generator).factors
              if isinstance(f, KeyBiasShift)]
    free = list(KeyBiasShift.free(m))
    assert len(shifts) == (1 if free else 0)
    if free:
        moved = (shifts[0].t != 0).any(dim=0)
        assert moved.nonzero().flatten().tolist() == free


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_every_factor_is_a_symmetry(flavour, dtype, generator):
    m = make(flavour, dtype, generator)
    x = inputs(m, generator)
    for factor in random_element(m, cond=10.0, generator=generator).factors:
        assert invariance_error(GaugeElement([factor]), m, x) < tolerance(dtype), factor


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_action_moves_the_parameters(flavour, generator):
    m = make(flavour, torch.float64, generator)
    moved = random_element(m, generator=generator).act(m)
    assert max_param_difference(m, moved) > 0.1
    assert moved is not m


def test_input_module_is_untouched(generator):
    m = make("mha-bias", torch.float64, generator)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    random_element(m, generator=generator).act(m)
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]), k


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_group_axioms(flavour, generator):
    m = make(flavour, torch.float64, generator)
    a, b, c = (random_element(m, cond=5.0, generator=generator) for _ in range(3))
    assert max_param_difference(gauge.identity().act(m), m) == 0
    assert max_param_difference(a.inverse().act(a.act(m)), m) < 1e-12
    assert max_param_difference(a.act(a.inverse().act(m)), m) < 1e-12
    assert max_param_difference((a @ b).act(m), a.act(b.act(m))) < 1e-13
    assert max_param_difference(((a @ b) @ c).act(m), (a @ (b @ c)).act(m)) < 1e-13
    assert max_param_difference((a @ b).inverse().act(m), (b.inverse() @ a.inverse()).act(m)) < 1e-12


def test_composition_of_matrices_and_permutations(generator):
    """QK(M1) @ QK(M2) acts as QK(M2 M1); permutations compose as index maps p2[p1]."""
    m = make("gqa", torch.float64, generator)
    M1, M2 = (torch.stack([random_gl(4, 3.0, generator=generator) for _ in range(2)])
              for _ in range(2))
    left = (GaugeElement([QKTransform(M1)]) @ GaugeElement([QKTransform(M2)])).act(m)
    assert max_param_difference(left, GaugeElement([QKTransform(M2 @ M1)]).act(m)) < 1e-13
    p1, p2 = torch.tensor([2, 3, 0, 1]), torch.tensor([1, 0, 3, 2])
    both = GaugeElement([HeadPermutation(p1)]) @ GaugeElement([HeadPermutation(p2)])
    assert max_param_difference(both.act(m), GaugeElement([HeadPermutation(p2[p1])]).act(m)) == 0


def test_permutations_normalise_the_matrices(generator):
    """pi QK(M) pi^{-1} = QK(M_{pi(i)}): the product of GLs is normal (semidirect product)."""
    m = make("mha-bias", torch.float64, generator)
    M = torch.stack([random_gl(4, 3.0, generator=generator) for _ in range(4)])
    perm = torch.tensor([3, 1, 0, 2])
    pi = GaugeElement([HeadPermutation(perm)])
    conjugated = pi @ GaugeElement([QKTransform(M)]) @ pi.inverse()
    expected = GaugeElement([QKTransform(M[perm])])
    assert max_param_difference(conjugated.act(m), expected.act(m)) < 1e-13


def test_source_same_matrix_qk_action_is_not_a_symmetry(generator):
    """The source's W_Q -> W_Q M, W_K -> W_K M changes the output unless M is orthogonal."""
    m = make("mha-bias", torch.float64, generator)
    x = inputs(m, generator)
    M = torch.stack([random_gl(4, 10.0, generator=generator) for _ in range(4)])
    source = MultiHeadAttention(8, 4, 4, bias=True, dtype=torch.float64)
    source.load_state_dict(m.state_dict())
    with torch.no_grad():
        source.W_Q.copy_(m.W_Q @ M)
        source.W_K.copy_(m.W_K @ M)
        source.b_Q.copy_((m.b_Q[:, None] @ M)[:, 0])
        source.b_K.copy_((m.b_K[:, None] @ M)[:, 0])
    with torch.no_grad():
        change = ((source(x) - m(x)).abs().max() / m(x).abs().max()).item()
    assert change > 1e-2
    assert invariance_error(GaugeElement([QKTransform(M)]), m, x) < 1e-13


def test_generic_matrix_breaks_rope_but_commutant_does_not(generator):
    m = make("rope", torch.float64, generator)
    x = inputs(m, generator)
    M = torch.stack([random_gl(4, 10.0, generator=generator) for _ in range(4)])
    assert invariance_error(GaugeElement([QKTransform(M)]), m, x) > 1e-3
    g = random_element(m, generator=generator)
    M_rope = next(f.M for f in g.factors if isinstance(f, QKTransform))
    R = rotation_matrix(7.0, m.rope_freqs, 4)
    torch.testing.assert_close(M_rope @ R, R @ M_rope, rtol=0, atol=1e-13)


def test_key_bias_shift_is_no_symmetry_under_rope(generator):
    m = make("rope", torch.float64, generator)
    shift = KeyBiasShift(torch.randn(4, 4, generator=generator, dtype=torch.float64))
    assert invariance_error(GaugeElement([shift]), m, inputs(m, generator)) > 1e-3


@pytest.mark.parametrize("cond", [1.0, 10.0, 1e4])
def test_random_matrices_have_the_requested_condition_number(cond, generator):
    m = make("gqa", torch.float64, generator)
    for f in random_element(m, cond=cond, generator=generator).factors:
        if isinstance(f, (QKTransform, VOTransform)):
            mats = f.M if isinstance(f, QKTransform) else f.N
            torch.testing.assert_close(torch.linalg.cond(mats),
                                       torch.full((2,), cond, dtype=torch.float64))


def test_singular_matrix_is_rejected():
    M = torch.eye(4, dtype=torch.float64).repeat(2, 1, 1)
    M[1, 3] = 0
    with pytest.raises(ValueError, match=r"QKTransform.M\[1\] is singular \(condition number inf"):
        QKTransform(M)
    with pytest.raises(ValueError, match="square"):
        VOTransform(torch.ones(2, 3, 4))
    with pytest.raises(ValueError, match="non-finite"):
        VOTransform(torch.full((1, 2, 2), float("nan")))


def test_incompatible_module_is_rejected(generator):
    m = make("gqa", torch.float64, generator)  # 4 query heads, 2 kv heads, d_head 4
    with pytest.raises(ValueError, match="n_kv_heads=4 but the module has 2"):
        GaugeElement([QKTransform(torch.eye(4).repeat(4, 1, 1))]).act(m)
    with pytest.raises(ValueError, match="d_value=3 but the module has 4"):
        GaugeElement([VOTransform(torch.eye(3).repeat(2, 1, 1))]).act(m)
    with pytest.raises(ValueError, match="splits a key/value group"):
        GaugeElement([HeadPermutation(torch.tensor([0, 2, 1, 3]))]).act(m)
    with pytest.raises(ValueError, match="n_heads=3 but the module has 4"):
        GaugeElement([HeadPermutation(torch.tensor([0, 2, 1]))]).act(m)
    with pytest.raises(ValueError, match=r"one permutation \[n_heads\], got shape \(2, 4\)"):
        GaugeElement([HeadPermutation(torch.arange(4).repeat(2, 1))]).act(m)
    with pytest.raises(ValueError, match="bias=True"):
        GaugeElement([ValueBiasShift(torch.zeros(4, 4))]).act(make("mqa", torch.float64, generator))
    with pytest.raises(ValueError, match="permutation"):
        HeadPermutation(torch.tensor([0, 0, 1]))
    with pytest.raises(TypeError, match="no MultiHeadAttention .* for a random gauge element$"):
        random_element(torch.nn.Linear(3, 3))
    with pytest.raises(TypeError, match="nn.MultiheadAttention keeps its heads' weights fused"):
        random_element(torch.nn.MultiheadAttention(16, 4))  # torch's, one capital letter apart
    with pytest.raises(TypeError, match="acts on MultiHeadAttention"):
        GaugeElement([QKTransform(torch.eye(2)[None])]).act(torch.nn.Linear(2, 2))
    of_a_gpt = random_element(GPT(GPTConfig(11, 6, 1, 2, 6)))
    with pytest.raises(ValueError, match="targets 'blocks.0.attn', which MultiHeadAttention does "
                       "not have: apply the element to the model it was built for"):
        of_a_gpt.act(m)


def test_elements_compose_with_single_factors_and_either_argument_order(generator):
    m = make("mha-bias", torch.float64, generator)
    x = inputs(m, generator)
    qk = QKTransform(torch.stack([random_gl(4, 3.0, generator=generator) for _ in range(4)]))
    vo = VOTransform(torch.stack([random_gl(4, 3.0, generator=generator) for _ in range(4)]))
    both = GaugeElement([vo, qk])
    assert max_param_difference(GaugeElement(qk).act(m), GaugeElement([qk]).act(m)) == 0
    assert max_param_difference((qk @ GaugeElement(vo)).act(m), both.act(m)) == 0
    assert max_param_difference((GaugeElement(qk) @ vo).act(m), both.act(m)) == 0
    assert max_param_difference((qk @ vo).act(m), both.act(m)) == 0  # two bare factors
    assert max_param_difference(qk.act(m), GaugeElement(qk).act(m)) == 0
    with pytest.raises(TypeError, match="unsupported operand"):
        qk @ x
    assert invariance_error(m, both, x) == invariance_error(both, m, x) < 1e-13  # DESIGN's f, g
    # a bare factor is the element of that factor, in either order
    assert invariance_error(qk, m, x) == invariance_error(m, qk, x) \
        == invariance_error(GaugeElement(qk), m, x) < 1e-13
    with pytest.raises(TypeError, match=r"a GaugeElement \(or one Factor\) and an nn.Module, then "
                       "the inputs; got Tensor and MultiHeadAttention"):
        invariance_error(x, m)
    hints = typing.get_type_hints(invariance_error)
    for name in ("element", "module"):  # either argument order is annotated
        assert {GaugeElement, torch.nn.Module} <= set(typing.get_args(hints[name])), name


def test_elements_act_on_attention_inside_larger_models(generator):
    model = torch.nn.Sequential(make("mha-bias", torch.float64, generator),
                                make("gqa", torch.float64, generator))
    x = inputs(model[0], generator)
    g = random_element(model, generator=generator)
    assert {f.target for f in g.factors} == {"0", "1"}
    assert invariance_error(g, model, x) < 1e-12


def test_stochastic_model_sees_the_same_noise_in_both_passes(generator):
    gpt = GPT(GPTConfig(11, 6, 1, 2, 6, symmetry_breaking="bq")).double()  # training mode: random
    idx = torch.randint(0, 11, (2, 6), generator=generator)
    state = torch.random.get_rng_state()
    assert invariance_error(gauge.identity(), gpt, idx) == 0
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's stream is untouched
    dropout = torch.nn.Sequential(make("mha-bias", torch.float64, generator), torch.nn.Dropout(0.5))
    x = inputs(dropout[0], generator)
    assert invariance_error(random_element(dropout, generator=generator), dropout, x) < 1e-12


def test_all_zero_reference_output_is_rejected(generator):
    m = MultiHeadAttention(4, 2, 2, generator=generator)  # no biases: zero in, zero out
    with pytest.raises(ValueError, match="reference tensor is all zero"):
        invariance_error(random_element(m, generator=generator), m, torch.zeros(1, 3, 4))


@pytest.mark.parametrize("flavour", ["gqa", "partial-rope"])
def test_factors_move_to_the_module_device(flavour, generator):
    m = make(flavour, torch.float32, generator).to("meta")  # the meta device stands in for a GPU
    g = random_element(m, generator=generator)  # built on the CPU, in float64
    assert all(p.device.type == "meta" for p in g.act(m).parameters())


def test_bias_shifts_are_validated():
    t = KeyBiasShift([[0.5, 0.0], [0.0, 0.5]]).t  # a nested list is accepted
    assert t.dtype == torch.float64 and t.shape == (2, 2)
    with pytest.raises(ValueError, match=r"KeyBiasShift.t must have shape .* got shape \(2,\)"):
        KeyBiasShift(torch.zeros(2))
    with pytest.raises(ValueError, match="ValueBiasShift.t has non-finite entries"):
        ValueBiasShift(torch.full((2, 2), float("inf")))


@pytest.mark.parametrize("rotary_dim", [0, 3, 6])
def test_rope_commutant_element_checks_the_rotary_dimension(rotary_dim):
    with pytest.raises(ValueError, match=f"at most d_head=4, got {rotary_dim}"):
        gauge.rope_commutant_element(4, rotary_dim, cond=10.0)


def test_factors_compare_by_identity():
    a, b = QKTransform(torch.eye(2)[None]), QKTransform(torch.eye(2)[None])
    assert a == a and a != b and len({a, b}) == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_head_permutation_accepts_a_gpu_permutation(generator):
    """``align_gpt`` and ``sample_align`` pass permutations on the module's device: the check
    must not compare a CUDA ``perm`` with a CPU ``arange``."""
    m = make("gqa", torch.float64, generator).cuda()
    perm = torch.tensor([2, 3, 0, 1], device="cuda")
    moved = GaugeElement([HeadPermutation(perm)]).act(m)
    assert torch.equal(moved.W_Q, m.W_Q[perm]) and torch.equal(moved.W_K, m.W_K[perm[::2] // 2])
    with pytest.raises(ValueError, match="permutation"):
        HeadPermutation(torch.tensor([0, 0, 1], device="cuda"))


def test_random_attention_factors_have_the_asked_conditioning_and_keep_groups_together():
    m = MultiHeadAttention(16, 4, 4, n_kv_heads=2, dtype=torch.float64)  # 2 groups of 2 heads
    M, N, perm = gauge.random_attention_factors(m, cond=10.0,
                                                generator=torch.Generator().manual_seed(0))
    assert M.shape == (2, 4, 4) and N.shape == (2, 4, 4) and sorted(perm.tolist()) == [0, 1, 2, 3]
    assert torch.allclose(torch.linalg.cond(torch.cat([M, N])), torch.full((4,), 10.0,
                                                                           dtype=torch.float64))
    assert {frozenset(perm[:2].tolist()), frozenset(perm[2:].tolist())} == {
        frozenset({0, 1}), frozenset({2, 3})}  # a group's heads move together
