"""The mixture-of-experts layer: a loop reference, its symmetries (experts, router shift, hidden
units), routing invariance under the attention gauge group, the load-balancing loss, the
redundancy count, and errors."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import tolerance
from gaugebook.attention import MultiHeadAttention
from gaugebook.gauge import random_element
from gaugebook.moe import (MoE, load_balancing_loss, permute_experts, permute_hidden,
                           rescale_hidden, shift_router)
from gaugebook.redundancy import predicted_redundancy, redundancy

D, E, DH = 6, 5, 4


def layer(dtype=torch.float64, seed=0, **kw):
    kw = {"k": 2, **kw}
    return MoE(D, E, DH, dtype=dtype, generator=torch.Generator().manual_seed(seed), **kw)


def tokens(dtype=torch.float64, seed=1, shape=(3, 7)):
    return torch.randn(*shape, D, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def relative(new, old):
    return ((new - old).abs().max() / old.abs().max()).item()


def loop_reference(m: MoE, x: torch.Tensor) -> torch.Tensor:
    """One token and one chosen expert at a time, straight from the formulas."""
    act = {"gelu": F.gelu, "relu": F.relu}[m.activation]
    out = torch.zeros_like(x.reshape(-1, D))
    for n, token in enumerate(x.reshape(-1, D)):
        logits = token @ m.W_r + (m.b_r if m.has_router_bias else 0)
        p = logits.softmax(-1)
        chosen = sorted(range(E), key=lambda e: -p[e].item())[:m.k]
        total = sum(p[e] for e in chosen) if m.renormalize else 1.0
        for e in chosen:
            expert = act(token @ m.W_in[e] + m.b_in[e]) @ m.W_out[e] + m.b_out[e]
            out[n] += p[e] / total * expert
    return out.view(x.shape)


@pytest.mark.parametrize("kw", [dict(), dict(k=1), dict(k=1, renormalize=False),
                                dict(k=E, activation="relu", router_bias=True),
                                dict(k=3, renormalize=False, router_bias=True)])
@torch.no_grad()
def test_forward_matches_loop_reference(dtype, kw):
    m, x = layer(dtype, **kw), tokens(dtype)
    res = m(x)
    assert res.output.shape == x.shape and res.indices.shape == res.weights.shape == (3, 7, m.k)
    assert res.output.dtype == dtype
    assert relative(res.output, loop_reference(m, x)) < tolerance(dtype, 1.0)
    top = res.probs.gather(-1, res.indices)
    assert (top[..., :-1] >= top[..., 1:]).all()  # most probable first
    if m.renormalize:
        assert torch.allclose(res.weights.sum(-1), torch.ones((), dtype=dtype))


@torch.no_grad()
def test_expert_permutation_is_a_symmetry_only_with_the_router(dtype):
    m, x = layer(dtype, router_bias=True), tokens(dtype)
    perm = torch.tensor([3, 0, 4, 1, 2])
    before, after = m(x), permute_experts(m, perm)(x)
    assert relative(after.output, before.output) < tolerance(dtype, 1.0)
    # expert i of the new layer is expert perm[i] of the old one
    assert torch.equal(perm[after.indices], before.indices)
    assert torch.allclose(after.weights, before.weights, atol=tolerance(dtype, 1.0))
    # the experts alone, router left in place: a different function
    experts_only = permute_experts(m, perm)
    with torch.no_grad():
        experts_only.W_r.copy_(m.W_r)
        experts_only.b_r.copy_(m.b_r)
    assert relative(experts_only(x).output, before.output) > 0.01


@torch.no_grad()
def test_load_balancing_loss_is_invariant_under_the_symmetries(dtype):
    m, x = layer(dtype, activation="relu", router_bias=True), tokens(dtype, shape=(8, 9))
    aux = m(x).aux_loss
    g = torch.Generator().manual_seed(5)
    transformed = [
        permute_experts(m, torch.randperm(E, generator=g)),
        shift_router(m, torch.randn(D, generator=g, dtype=dtype), s=0.7),
        rescale_hidden(m, torch.rand(E, DH, generator=g, dtype=torch.float64) + 0.5),
    ]
    for other in transformed:
        assert abs(other(x).aux_loss - aux).item() < tolerance(dtype, 1.0)
    # moving one router column alone is not a symmetry, and the loss sees it
    broken = shift_router(m, torch.zeros(D))
    broken.W_r[:, 0] += 1.0
    assert abs(broken(x).aux_loss - aux).item() > 1e-3


def test_load_balancing_loss_values():
    n, k = 12, 2
    uniform = torch.full((n, E), 1.0 / E)
    balanced = (torch.arange(n * k).view(n, k) % E)  # every expert chosen equally often
    assert load_balancing_loss(uniform, balanced).item() == pytest.approx(1.0)
    collapsed = F.one_hot(torch.zeros(n, dtype=torch.long), E).double()
    assert load_balancing_loss(collapsed, torch.zeros(n, 1, dtype=torch.long)).item() == \
        pytest.approx(E)
    with pytest.raises(ValueError, match="do not match"):
        load_balancing_loss(uniform, balanced[:5])
    with pytest.raises(ValueError, match="only 5 experts"):
        load_balancing_loss(uniform, torch.zeros(n, E + 1, dtype=torch.long))


def test_load_balancing_loss_maximum_is_E_over_k():
    n, k = 10, 2
    probs = torch.zeros(n, E, dtype=torch.float64)
    probs[:, :k] = 1.0 / k  # every token: the same k experts, all the probability on them
    chosen = torch.arange(k).expand(n, k)
    assert load_balancing_loss(probs, chosen).item() == pytest.approx(E / k)


def test_load_balancing_loss_rejects_an_empty_batch():
    with pytest.raises(ValueError, match="at least one token, got probs of shape"):
        load_balancing_loss(torch.zeros(0, E), torch.zeros(0, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="at least one token"):
        layer()(torch.zeros(0, D, dtype=torch.float64))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_symmetries_keep_the_layer_on_its_device():
    m = layer(activation="relu", router_bias=True).cuda()
    x = tokens().cuda()
    perm = torch.stack([torch.randperm(DH) for _ in range(E)])
    for out in (shift_router(m, torch.ones(D), 0.5), rescale_hidden(m, torch.full((E, DH), 2.0)),
                permute_experts(m, torch.arange(E).flip(0)), permute_hidden(m, perm)):
        assert out.W_r.is_cuda
        assert relative(out(x).output, m(x).output) < 1e-12


def test_load_balancing_loss_gradient_reaches_only_the_router():
    m = layer()
    m(tokens()).aux_loss.backward()
    assert m.W_r.grad.abs().max() > 0
    assert all(getattr(m, n).grad is None for n in ("W_in", "b_in", "W_out", "b_out"))


@torch.no_grad()
def test_router_shift_and_hidden_unit_symmetries(dtype):
    x = tokens(dtype)
    g = torch.Generator().manual_seed(2)
    relu = layer(dtype, activation="relu", router_bias=True)
    a = torch.exp(torch.randn(E, DH, generator=g, dtype=torch.float64))
    perm = torch.stack([torch.randperm(DH, generator=g) for _ in range(E)])
    c = torch.randn(D, generator=g, dtype=dtype)
    before = relu(x)
    for other in (shift_router(relu, c, s=-1.3), rescale_hidden(relu, a),
                  permute_hidden(relu, perm)):
        after = other(x)
        assert relative(after.output, before.output) < tolerance(dtype, 10.0)
        assert torch.equal(after.indices, before.indices)
    # GELU is not positively homogeneous: the same rescaling, applied by hand, is no symmetry
    gelu = layer(dtype)
    scaled = layer(dtype)
    scaled.W_in.mul_(a[:, None, :].to(dtype))
    scaled.b_in.mul_(a.to(dtype))
    scaled.W_out.div_(a[:, :, None].to(dtype))
    assert relative(scaled(x).output, gelu(x).output) > 1e-3
    with pytest.raises(ValueError, match="ReLU experts only"):
        rescale_hidden(gelu, a)
    assert relative(permute_hidden(gelu, perm)(x).output, gelu(x).output) < tolerance(dtype, 1.0)


class AttentionThenMoE(nn.Module):
    """``h = x + attn(x)``, then the MoE on ``h``: the router reads the attention output."""

    def __init__(self, dtype, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.attn = MultiHeadAttention(D, 3, 2, bias=True, dtype=dtype, generator=g)
        self.moe = MoE(D, E, DH, 2, dtype=dtype, generator=g)

    def forward(self, x):
        return self.moe(x + self.attn(x))


@torch.no_grad()
def test_routing_is_invariant_under_attention_gauge_transformations(dtype):
    block, x = AttentionThenMoE(dtype), tokens(dtype, shape=(4, 9))
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        element = random_element(block, cond=10.0, generator=g)
        before, after = block(x), element.act(block)(x)
        assert torch.equal(after.indices, before.indices)
        assert (after.weights - before.weights).abs().max() < tolerance(dtype, 10.0)
        assert relative(after.output, before.output) < tolerance(dtype, 10.0)
        assert abs(after.aux_loss - before.aux_loss).item() < tolerance(dtype, 10.0)
    # the gauge element did move the attention weights
    assert (element.act(block).attn.W_Q - block.attn.W_Q).abs().max() > 0.1


@pytest.mark.parametrize("kw", [dict(), dict(activation="relu", router_bias=True), dict(k=1),
                                dict(k=1, renormalize=False)])
def test_measured_redundancy_matches_prediction(kw):
    m = MoE(4, 3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0),
            **{"k": 2, **kw})
    x = torch.randn(12, 8, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    r = redundancy(m, x)
    assert r.dimension == predicted_redundancy(m) and r.gap > 1e8


@pytest.mark.parametrize("kw, match", [
    (dict(k=0), "k must be a positive integer"),
    (dict(k=E + 1), "only n_experts"),
    (dict(k=2.0), "k must be a positive integer"),
    (dict(k=2, n_experts=0), "n_experts must be a positive integer"),
    (dict(k=2, activation="tanh"), "activation must be one of"),
    (dict(k=2, router_bias=1), "router_bias must be True or False"),
])
def test_constructor_rejects_bad_arguments(kw, match):
    args = {"d_model": D, "n_experts": E, "d_hidden": DH, **kw}
    with pytest.raises(ValueError, match=match):
        MoE(**args)


def test_bad_inputs_and_actions_raise():
    m = layer(activation="relu")
    with pytest.raises(ValueError, match=r"\[\.\.\., d_model=6\]"):
        m(torch.randn(2, 3, D + 1, dtype=torch.float64))
    with pytest.raises(ValueError, match="permutation of 0..4"):
        permute_experts(m, [0, 1, 2, 3, 3])
    with pytest.raises(ValueError, match="needs a MoE with router_bias=True"):
        shift_router(m, torch.zeros(D), s=1.0)
    with pytest.raises(ValueError, match="shape \\[d_model=6\\]"):
        shift_router(m, torch.zeros(D + 1))
    with pytest.raises(ValueError, match="positive and finite"):
        rescale_hidden(m, -torch.ones(E, DH))
    with pytest.raises(ValueError, match=r"perm\[1\] must be a permutation"):
        permute_hidden(m, torch.stack([torch.arange(DH), torch.zeros(DH, dtype=torch.long)]
                                      + [torch.arange(DH)] * (E - 2)))
    with pytest.raises(TypeError, match="expected a MoE"):
        permute_experts(nn.Linear(2, 2), [0, 1])
    # a float permutation used to be cast to long first: 1.9 became 1 without a word
    floats = torch.arange(DH, dtype=torch.float64).repeat(E, 1)
    floats[0, 1] = 1.9
    with pytest.raises(ValueError, match=r"perm\[0\] must hold integer indices"):
        permute_hidden(m, floats)
