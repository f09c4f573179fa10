import math

import pytest
import torch

from conftest import public_names_are_exported
from gaugebook.attention import MultiHeadAttention
from gaugebook.moe import MoE
from gaugebook.rope import rope_frequencies, rotate, rotation_matrix

FLAVOURS = {
    "mha": dict(),
    "mha-bias": dict(bias=True),
    "gqa": dict(n_kv_heads=2, bias=True),
    "mqa": dict(n_kv_heads=1),
    "rope": dict(rope=True),
    "partial-rope": dict(rope=True, rotary_dim=2, bias=True),
    "gated-rope": dict(rope="gated", n_kv_heads=2),
    "wide-value": dict(d_value=6, causal=False),
}


def reference_attention(m: MultiHeadAttention, x: torch.Tensor) -> torch.Tensor:
    """Attention written head by head with explicit loops, the textbook formula."""
    q, k, v = m.project(x)
    B, T = x.shape[:2]
    out = torch.zeros(B, T, m.d_model, dtype=x.dtype)
    for h in range(m.n_heads):
        g = m.kv_group(h)
        scores = q[:, h] @ k[:, g].transpose(-1, -2) / math.sqrt(m.d_head)  # (B, T, T)
        if m.causal:
            scores = scores + torch.full((T, T), float("-inf"), dtype=x.dtype).triu(1)
        out = out + scores.softmax(-1) @ v[:, g] @ m.W_O[h]
    return out + (m.b_O if m.has_bias else 0)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_forward_matches_reference(flavour, dtype, generator):
    m = MultiHeadAttention(8, 4, 4, dtype=dtype, generator=generator, **FLAVOURS[flavour])
    x = torch.randn(2, 7, 8, generator=generator, dtype=dtype)
    y = m(x)
    assert y.shape == x.shape and y.dtype == dtype
    torch.testing.assert_close(y, reference_attention(m, x), rtol=0,
                               atol=50 * torch.finfo(dtype).eps)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("causal", [True, False])
def test_torch_multihead_attention_converts_to_per_head_weights(bias, causal):
    """``from_torch`` computes what torch's fused layer computes (with a causal mask when
    causal), batch-first or sequence-first; the gauge group then acts on it."""
    from gaugebook.gauge import invariance_error, random_element

    torch.manual_seed(3)
    for batch_first in (True, False):
        mha = torch.nn.MultiheadAttention(12, 3, bias=bias, batch_first=batch_first)
        mha = mha.double().eval()
        if bias:  # torch starts them at zero
            with torch.no_grad():
                mha.in_proj_bias.normal_(), mha.out_proj.bias.normal_()
        layer = MultiHeadAttention.from_torch(mha, causal=causal)
        x = torch.randn(2, 5, 12, dtype=torch.float64)
        mask = torch.nn.Transformer.generate_square_subsequent_mask(5, dtype=torch.float64)
        xt = x if batch_first else x.transpose(0, 1)
        ref = mha(xt, xt, xt, need_weights=False, attn_mask=mask if causal else None)[0]
        ref = ref if batch_first else ref.transpose(0, 1)
        assert (layer(x) - ref).abs().max() < 1e-13
    g = random_element(layer, cond=10.0, generator=torch.Generator().manual_seed(1))
    assert invariance_error(g, layer, x) < 1e-12


def test_torch_attention_without_a_per_head_form_is_refused():
    for options in (dict(kdim=5), dict(add_bias_kv=True), dict(add_zero_attn=True)):
        with pytest.raises(ValueError, match="from_torch needs kdim = vdim = embed_dim"):
            MultiHeadAttention.from_torch(torch.nn.MultiheadAttention(12, 3, **options))
    with pytest.raises(TypeError, match="expected a torch.nn.MultiheadAttention, got Linear"):
        MultiHeadAttention.from_torch(torch.nn.Linear(3, 3))


def test_attention_rows_are_causal_distributions(generator):
    m = MultiHeadAttention(8, 2, 4, dtype=torch.float64, generator=generator)
    A = m.attention_pattern(torch.randn(3, 5, 8, generator=generator, dtype=torch.float64))
    torch.testing.assert_close(A.sum(-1), torch.ones(3, 2, 5, dtype=torch.float64))
    assert (A.triu(1) == 0).all()


def test_rope_rotation_matrix_and_relative_positions(generator):
    freqs = rope_frequencies(6, 10000.0)
    x = torch.randn(4, 8, generator=generator, dtype=torch.float64)
    torch.testing.assert_close(rotate(x[None], torch.tensor([3]), freqs)[0, 0],
                               x[0] @ rotation_matrix(3.0, freqs, 8))
    R5, R2 = rotation_matrix(5.0, freqs, 8), rotation_matrix(2.0, freqs, 8)
    torch.testing.assert_close(R5 @ R2.T, rotation_matrix(3.0, freqs, 8))
    torch.testing.assert_close(freqs[0], torch.tensor(1.0, dtype=torch.float64))
    torch.testing.assert_close(freqs[-1], torch.tensor(10000.0 ** (-4 / 6), dtype=torch.float64))


def test_rope_base_is_configurable():
    a = MultiHeadAttention(8, 2, 4, rope=True)
    b = MultiHeadAttention(8, 2, 4, rope=True, rope_base=500.0)
    assert a.rope_freqs[1] != b.rope_freqs[1]


@pytest.mark.parametrize("cast", [lambda m: m.to(torch.bfloat16), lambda m: m.half()])
def test_rope_frequencies_stay_float64_when_the_module_is_cast(cast):
    m = cast(MultiHeadAttention(8, 2, 4, rope=True))
    assert m.rope_freqs.dtype == torch.float64
    torch.testing.assert_close(m.rope_freqs, rope_frequencies(4))
    x = torch.ones(1, 258, 8, dtype=m.W_Q.dtype)  # the same token everywhere: q_t = q R_t
    q, _, _ = m.project(x)
    assert not torch.equal(q[:, :, 257], q[:, :, 256])


def test_rotate_counts_positions_exactly_with_bfloat16_frequencies():
    x = torch.ones(1, 258, 2, dtype=torch.bfloat16)
    y = rotate(x, torch.arange(258), torch.ones(1, dtype=torch.bfloat16))
    assert not torch.equal(y[0, 257], y[0, 256])


def test_rotate_refuses_more_frequencies_than_half_the_width():
    with pytest.raises(ValueError, match="3 frequencies rotate 6 coordinates, more than the 4"):
        rotate(torch.ones(2, 4), torch.arange(2), rope_frequencies(6))


def test_rotate_needs_one_position_per_token_and_frequencies_an_even_integer():
    with pytest.raises(ValueError, match=r"positions must be \[T\], one per token of x "
                                         r"\[\.\.\., T, d\] \(or \[1\]\): got positions of "
                                         r"shape \(5,\) for x of shape \(2, 6, 8\)"):
        rotate(torch.randn(2, 6, 8), torch.arange(5), rope_frequencies(8))
    for rotary_dim in (4.0, True, 3, 0):
        with pytest.raises(ValueError, match="rotary_dim must be a positive even integer, got"):
            rope_frequencies(rotary_dim)


@pytest.mark.parametrize("kwargs, message", [
    (dict(d_model=8, n_heads=2, d_head=4, rotary_dim=2), "rotary_dim=2 needs rope"),
    (dict(d_model=8, n_heads=2, d_head=4, rope=True, rope_base=1.0), "rope_base must be greater"),
    (dict(d_model=8, n_heads=2, d_head=4, rope=True, rope_base=0.5), "rope_base must be greater"),
    (dict(d_model=8, n_heads=6, d_head=4, n_kv_heads=4), "not divisible"),
    (dict(d_model=0, n_heads=2, d_head=4), "d_model"),
    (dict(d_model=8, n_heads=2, d_head=4, rope="yes"), "rope must be"),
    (dict(d_model=8, n_heads=2, d_head=4, rope=True, rotary_dim=6), "rotary_dim"),
    (dict(d_model=8, n_heads=2, d_head=3, rope=True), "even"),
    # inf gives the frequencies 1, 0, ...: planes that never turn, which the counts exclude
    (dict(d_model=8, n_heads=2, d_head=4, rope=True, rope_base=math.inf), "finite"),
    (dict(d_model=8, n_heads=2, d_head=4, rope=True, rope_base=math.nan), "rope_base"),
    (dict(d_model=True, n_heads=1, d_head=4), "d_model must be a positive integer"),
    (dict(d_model=8, n_heads=2.0, d_head=4), "n_heads must be a positive integer"),
    (dict(d_model=8, n_heads=2, d_head=4, rope=1), "rope must be one of"),
    (dict(d_model=8, n_heads=2, d_head=4, causal="no"), "causal must be True or False"),
])
def test_bad_configuration_is_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MultiHeadAttention(**kwargs)


def test_parameters_and_rope_frequencies_are_made_on_the_device():
    """``device`` as for torch.nn layers (a meta device allocates nothing)."""
    m = MultiHeadAttention(8, 2, 4, rope="gated", bias=True, device="meta")
    assert {p.device.type for p in m.parameters()} == {"meta"}
    assert m.rope_freqs.device.type == "meta" and m.rope_freqs.dtype == torch.float64
    e = MoE(8, 4, 6, 2, router_bias=True, device="meta")
    assert {p.device.type for p in e.parameters()} == {"meta"}
    made = m.to_empty(device="cpu")  # materialised: the frequencies are computed there
    assert torch.equal(made.rope_freqs, rope_frequencies(4, dtype=torch.float64))
    chosen = torch.tensor([1.0, 0.0], dtype=torch.float64)
    made.rope_freqs = chosen  # frequencies a user set survive casts and moves
    assert torch.equal(made.float().to("cpu").rope_freqs, chosen)
    R = rotation_matrix(2.0, torch.ones(2, device="meta"), 4)
    assert R.device.type == "meta"  # made where the frequencies are
    with pytest.raises(ValueError, match="dtype must be a floating-point dtype, got torch.int64"):
        MoE(8, 4, 6, 2, dtype=torch.int64)


def test_bad_input_shape_is_rejected():
    m = MultiHeadAttention(8, 2, 4)
    with pytest.raises(ValueError, match=r"\[B, T, d_model=8\]"):
        m(torch.randn(2, 5, 7))
    with pytest.raises(ValueError, match="d_model"):
        m(torch.randn(5, 8))
    with pytest.raises(ValueError, match=r"input of dtype torch.float64 for weights of dtype "
                       r"torch.float32: cast one to the other \(x.to\(torch.float32\)"):
        m(torch.randn(2, 5, 8, dtype=torch.float64))  # einsum: "expected scalar type Float"
    with pytest.raises(ValueError, match="dtype torch.int64"):
        m(torch.ones(2, 5, 8, dtype=torch.long))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast mixes dtypes on purpose
        assert m(torch.randn(2, 5, 8, dtype=torch.bfloat16)).shape == (2, 5, 8)
    with pytest.raises(ValueError, match="dtype must be a floating-point dtype, got torch.int64"):
        MultiHeadAttention(8, 2, 4, dtype=torch.int64)
    for make in (lambda: MultiHeadAttention(16, 4, 4, dtype="float64"),
                 lambda: MoE(8, 4, 6, 2, dtype="float64")):
        with pytest.raises(TypeError, match="dtype must be a torch.dtype, e.g. torch.float64, "
                                            "got 'float64'"):
            make()


@pytest.mark.parametrize("kw, shape, name", [
    (dict(), (3,), "query_shift"),  # d_head = 4
    (dict(), (2, 1), "query_shift"),  # width 1 would broadcast over d_head
    (dict(), (3, 4), "query_shift"),  # 3 heads, the layer has 4
    (dict(), (1, 4, 4), "query_shift"),
    (dict(n_kv_heads=2), (4, 4), "value_shift"),  # per query head under GQA
    (dict(n_kv_heads=1), (4, 4), "value_shift"),  # per query head under MQA (was silent)
    (dict(n_kv_heads=2), (1,), "value_shift"),
])
def test_bad_shift_shapes_are_rejected(kw, shape, name):
    m = MultiHeadAttention(8, 4, 4, dtype=torch.float64, **kw)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match=f"{name} must be a tensor"):
        m(x, **{name: torch.zeros(shape, dtype=torch.float64)})
    with pytest.raises(ValueError, match=f"{name} must be a tensor"):
        m.project(x, **{name: torch.zeros(shape, dtype=torch.float64)})
    with pytest.raises(ValueError, match=f"{name} must be a tensor"):
        m(x, **{name: [0.0] * 4})


def test_documented_shift_shapes_add_per_head_biases():
    """``[d]`` (shared), ``[1, d]`` and ``[heads, d]`` shifts act as per-head biases."""
    g = torch.Generator().manual_seed(0)
    m = MultiHeadAttention(8, 4, 4, n_kv_heads=2, dtype=torch.float64, generator=g)
    x = torch.randn(2, 5, 8, generator=g, dtype=torch.float64)
    q0, _, v0 = m.project(x)
    for heads, heads_v in ((None, None), (1, 1), (4, 2)):
        sq = torch.randn(*(() if heads is None else (heads,)), 4, generator=g, dtype=torch.float64)
        sv = torch.randn(*(() if heads_v is None else (heads_v,)), 4, generator=g,
                         dtype=torch.float64)
        q, _, v = m.project(x, query_shift=sq, value_shift=sv)
        torch.testing.assert_close(q - q0, sq.expand(4, 4)[None, :, None].expand_as(q))
        torch.testing.assert_close(v - v0, sv.expand(2, 4)[None, :, None].expand_as(v))
        assert m(x, query_shift=sq, value_shift=sv).shape == (2, 5, 8)



def test_all_lists_the_public_names_of_attention_and_rope():
    from gaugebook import attention, rope
    for module in (attention, rope):
        public_names_are_exported(module)
    assert "ROPE_MODES" in attention.__all__
