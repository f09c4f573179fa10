import pytest
import torch

from gaugebook.alignment import (align_factors, align_gpt, align_mlp, align_qk_vo,
                                 head_similarity, interpolate, loss_barrier, match_heads,
                                 match_residual, parameter_distance, permute_mlp,
                                 permute_residual, sample_align)
from gaugebook.attention import MultiHeadAttention
from gaugebook.gauge import GaugeElement, HeadPermutation, QKTransform, VOTransform, random_element
from gaugebook.gpt import GPT, GPTConfig
from gaugebook.linalg import random_gl, random_orthogonal
from gaugebook.redundancy import redundancy

DTYPE = torch.float64



def generic_gpt(seed=0, **kw):
    """A small float64 GPT with every parameter generic (GPT init zeroes the biases)."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(40, 12, 2, 4, 16, **kw)).double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def disguise(model, generator):
    """The same function with every symmetry applied: attention gauge (QK, VO, heads, bias
    shifts), residual features and MLP units permuted."""
    other = random_element(model, cond=10.0, generator=generator).act(model)
    other = permute_residual(other, torch.randperm(model.config.n_embd, generator=generator))
    for block in other.blocks:
        permute_mlp(block.mlp, torch.randperm(4 * model.config.n_embd, generator=generator))
    return other


def logits(model, idx):
    with torch.no_grad():
        return model(idx)[0]


@pytest.mark.parametrize("activation", ["gelu", "prelu"])
def test_align_gpt_recovers_a_disguised_copy(activation):
    gen = torch.Generator().manual_seed(1)
    a = generic_gpt(activation=activation)
    b = disguise(a, gen)
    idx = torch.randint(0, 40, (3, 12), generator=gen)
    assert (logits(a, idx) - logits(b, idx)).abs().max() < 1e-12
    assert parameter_distance(a, b) > 1.0
    aligned = align_gpt(a, b)
    assert parameter_distance(a, aligned) < 1e-9
    assert (logits(aligned, idx) - logits(b, idx)).abs().max() < 1e-12
    ts = [i / 4 for i in range(5)]
    with torch.no_grad():
        losses = [interpolate(a, aligned, t)(idx, idx)[1].item() for t in ts]
    assert max(losses) - min(losses) < 1e-10
    assert abs(loss_barrier(ts, losses)) < 1e-10


def test_naive_midpoint_of_a_disguised_copy_is_another_function():
    gen = torch.Generator().manual_seed(2)
    a = generic_gpt()
    b = disguise(a, gen)
    idx = torch.randint(0, 40, (8, 12), generator=gen)
    reference = logits(a, idx)
    naive = logits(interpolate(a, b, 0.5), idx)
    aligned = logits(interpolate(a, align_gpt(a, b), 0.5), idx)
    assert (naive - reference).abs().max() > 0.1 * reference.abs().max()
    assert (aligned - reference).abs().max() < 1e-10


def test_match_heads_finds_a_planted_permutation():
    gen = torch.Generator().manual_seed(3)
    a = MultiHeadAttention(16, 6, 4, dtype=DTYPE, generator=gen)
    perm = torch.randperm(6, generator=gen)
    M = torch.stack([random_gl(4, 10.0, generator=gen) for _ in range(6)])
    N = torch.stack([random_gl(4, 10.0, generator=gen) for _ in range(6)])
    b = GaugeElement([QKTransform(M), VOTransform(N), HeadPermutation(perm)]).act(a)
    S = head_similarity(a, b)
    assert torch.allclose(S[torch.arange(6), torch.argsort(perm)], torch.full((6,), 2.0,
                                                                              dtype=DTYPE))
    found = match_heads(a, b)
    assert torch.equal(perm[found], torch.arange(6))  # head i of a is at found[i] in b
    restored = GaugeElement([HeadPermutation(found)]).act(b)
    aligned = align_qk_vo(a, restored).act(restored)
    for name in ("W_Q", "W_K", "W_V", "W_O"):
        assert torch.allclose(getattr(aligned, name), getattr(a, name), atol=1e-10)


def test_align_qk_vo_under_gqa_with_bias_shifts():
    """Under GQA one M and one N per key/value group; the bias translations are fitted too."""
    gen = torch.Generator().manual_seed(9)
    a = MultiHeadAttention(8, 4, 4, n_kv_heads=2, bias=True, dtype=DTYPE, generator=gen)
    element = random_element(a, cond=10.0, generator=gen)
    element = GaugeElement(f for f in element.factors if not isinstance(f, HeadPermutation))
    b = element.act(a)
    aligned = align_qk_vo(a, b).act(b)
    for p, q in zip(a.parameters(), aligned.parameters()):
        assert torch.allclose(p, q, atol=1e-10)
    with pytest.raises(ValueError, match="GQA"):
        match_heads(a, b)


def test_align_factors_recovers_the_lora_gauge():
    """LoRA's update B A has its own GL(r) gauge (B G, G^{-1} A); alignment undoes it, and
    averaging aligned factors averages the updates while naive averaging does not."""
    gen = torch.Generator().manual_seed(4)
    B, A = torch.randn(12, 3, generator=gen, dtype=DTYPE), torch.randn(3, 8, generator=gen,
                                                                       dtype=DTYPE)
    G = random_gl(3, 20.0, generator=gen)
    B2, A2 = B @ G, torch.linalg.solve(G, A)
    assert torch.allclose(B2 @ A2, B @ A, atol=1e-12)
    M = align_factors(B, A.T, B2, A2.T)  # (B2 M, A2^T M^{-T}) should be (B, A^T)
    assert torch.allclose(M, torch.linalg.inv(G), atol=1e-9)
    B3, A3 = B2 @ M, torch.linalg.solve(M, A2)
    assert torch.allclose((B + B3) / 2 @ ((A + A3) / 2), B @ A, atol=1e-9)
    naive = (B + B2) / 2 @ ((A + A2) / 2)
    assert (naive - B @ A).abs().max() > 1e-2


def test_align_factors_procrustes_and_errors():
    gen = torch.Generator().manual_seed(5)
    X, Y = torch.randn(10, 4, generator=gen, dtype=DTYPE), torch.randn(7, 4, generator=gen,
                                                                       dtype=DTYPE)
    Q = random_orthogonal(4, generator=gen)
    M = align_factors(X, Y, X @ Q, Y @ Q, method="procrustes")  # Q^{-T} = Q
    assert torch.allclose(M, Q.T, atol=1e-12)
    with pytest.raises(ValueError, match="method"):
        align_factors(X, Y, X, Y, method="svd")
    with pytest.raises(ValueError, match="shapes"):
        align_factors(X, Y, X[:, :3], Y)


def test_lora_redundancy_is_r_squared():
    """Jacobian rank of a LoRA adapter on a frozen layer: r^2 redundant directions, r k at the
    B = 0 initialisation (the first-order change dB A + B dA loses every dA)."""
    gen = torch.Generator().manual_seed(6)
    base = MultiHeadAttention(6, 2, 3, dtype=DTYPE, generator=gen)
    for p in base.parameters():
        p.requires_grad_(False)
    r, D, k = 2, 6, 6  # W_Q viewed as [D, H * d_head]

    class LoRAQuery(torch.nn.Module):
        def __init__(self, B, A):
            super().__init__()
            self.B, self.A = torch.nn.Parameter(B), torch.nn.Parameter(A)

        def forward(self, x):
            W_Q = base.W_Q + (self.B @ self.A).view(D, 2, 3).transpose(0, 1)  # (H, D, dk)
            return torch.func.functional_call(base, {"W_Q": W_Q}, (x,))

    x = torch.randn(8, 6, D, generator=gen, dtype=DTYPE)
    generic = LoRAQuery(torch.randn(D, r, generator=gen, dtype=DTYPE),
                        torch.randn(r, k, generator=gen, dtype=DTYPE))
    assert redundancy(generic, x).dimension == r * r
    at_init = LoRAQuery(torch.zeros(D, r, dtype=DTYPE), torch.randn(r, k, generator=gen,
                                                                      dtype=DTYPE))
    assert redundancy(at_init, x).dimension == r * k


def test_residual_and_mlp_permutations():
    gen = torch.Generator().manual_seed(7)
    a = generic_gpt()
    perm = torch.randperm(16, generator=gen)
    b = permute_residual(a, perm)
    idx = torch.randint(0, 40, (2, 12), generator=gen)
    assert (logits(a, idx) - logits(b, idx)).abs().max() < 1e-12
    found = match_residual(a, b)
    assert torch.equal(perm[found], torch.arange(16))
    c = permute_residual(a, torch.arange(16))  # a copy
    hidden = torch.randperm(64, generator=gen)
    permute_mlp(c.blocks[0].mlp, hidden)
    assert (logits(a, idx) - logits(c, idx)).abs().max() < 1e-12
    assert torch.equal(hidden[align_mlp(a.blocks[0].mlp, c.blocks[0].mlp)], torch.arange(64))
    with pytest.raises(ValueError, match="permutation"):
        permute_residual(a, torch.zeros(16, dtype=torch.long))


def test_interpolation_and_distance():
    a, b = generic_gpt(0), generic_gpt(1)
    assert parameter_distance(a, a) == 0
    assert parameter_distance(interpolate(a, b, 0.0), a) == 0
    assert parameter_distance(interpolate(a, b, 1.0), b) == 0  # as the docstring says: exactly
    mid = interpolate(a, b, 0.5)
    assert abs(parameter_distance(a, mid) - parameter_distance(a, b) / 2) < 1e-9
    assert mid.lm_head.weight is mid.wte.weight  # still tied
    assert loss_barrier([0, 0.5, 1], [1.0, 3.0, 2.0]) == 1.5
    with pytest.raises(ValueError):
        loss_barrier([0, 0.5], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="configs"):
        align_gpt(a, generic_gpt(0, activation="prelu"))
    with pytest.raises(ValueError, match="RoPE"):
        align_gpt(generic_gpt(0, rope=True), generic_gpt(1, rope=True))
    with pytest.raises(ValueError, match="rounds must be a positive integer, got 1.5"):
        align_gpt(a, b, rounds=1.5)


def test_rope_models_align_by_their_permutations_alone():
    """Residual, head and MLP permutations commute with RoPE's rotations, so align_gpt with
    frames=False keeps a RoPE model's function; the QK frames (frames=True) are refused."""
    a, b = generic_gpt(0, rope=True), generic_gpt(1, rope=True)
    aligned = align_gpt(a, b, frames=False)
    idx = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(3))
    assert (logits(aligned, idx) - logits(b, idx)).abs().max() < 1e-10
    assert parameter_distance(a, aligned) < parameter_distance(a, b)
    with pytest.raises(ValueError, match="RoPE.*for align_gpt, frames=False: its permutations "
                                         "alone commute with the rotations"):
        align_gpt(a, b)


@pytest.mark.parametrize("n_kv_head", [4, 2, 1])  # multi-head, grouped-query, multi-query
def test_sample_align_keeps_the_closest_sample(n_kv_head):
    gen = torch.Generator().manual_seed(8)
    a, b = generic_gpt(0, n_kv_head=n_kv_head), generic_gpt(1, n_kv_head=n_kv_head)
    result = sample_align(a, b, 20, generator=gen)
    assert len(result.distances) == 20 and result.seconds > 0
    assert abs(result.distance - min(result.distances)) < 1e-9
    assert result.initial_distance == parameter_distance(a, b)
    idx = torch.randint(0, 40, (2, 12), generator=gen)
    assert (logits(result.model, idx) - logits(b, idx)).abs().max() < 1e-10
    with pytest.raises(ValueError):
        sample_align(a, b, 0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_alignment_keeps_models_on_their_device():
    gen = torch.Generator().manual_seed(9)
    a = generic_gpt(0).cuda()
    perm = torch.randperm(16, generator=gen)
    b = permute_residual(a, perm)
    assert b.wte.weight.is_cuda
    assert torch.equal(perm[match_residual(a, b).cpu()], torch.arange(16))
    assert torch.equal(match_heads(a.blocks[0].attn, a.blocks[0].attn).cpu(), torch.arange(4))
    X, Y = (torch.randn(n, 3, generator=gen, dtype=DTYPE).cuda() for n in (8, 7))
    M0 = random_gl(3, 5.0, generator=gen).cuda()
    M = align_factors(X, Y, X @ torch.linalg.inv(M0), Y @ M0.T)
    assert M.is_cuda and torch.allclose(M, M0, atol=1e-8)
    result = sample_align(a, generic_gpt(1).cuda(), 3, generator=gen)
    assert result.model.wte.weight.is_cuda
    assert abs(result.distance - min(result.distances)) < 1e-9


def test_every_entry_point_refuses_rope_and_symmetry_breaking_alike():
    """sample_align used to accept symmetry-breaking biases and return a different function;
    it, align_gpt and minimise_over_orbit now refuse through one check, with one message."""
    from gaugebook.sharpness import minimise_over_orbit

    idx = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(0))
    for kw, match in ((dict(symmetry_breaking="bq"), "symmetry-breaking biases.*chapter 16"),
                      (dict(rope=True), "RoPE.*full GL\\(d_head\\)")):
        a, b = generic_gpt(0, **kw).eval(), generic_gpt(1, **kw).eval()
        messages = set()
        for call in (lambda: align_gpt(a, b), lambda: sample_align(a, b, 2),
                     lambda: minimise_over_orbit(b, lambda out: out[1], idx, idx, steps=1)):
            with pytest.raises(ValueError, match=match) as error:
                call()
            messages.add(str(error.value))
        assert len(messages) == 1, messages
    with pytest.raises(TypeError, match="no MultiHeadAttention"):
        sample_align(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2), 2)
