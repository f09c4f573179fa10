"""Near-symmetries (chapter 6): LayerNorm's epsilon as a configuration option, the residual-stream
scaling that is exact only at epsilon = 0, and the generators of gl(2) on a RoPE plane that the
commutant lacks, broken in proportion to sin of the plane's angle."""
import dataclasses
import math

import pytest
import torch

from gaugebook.gpt import GPT, GPTConfig
from gaugebook.gpt_gauge import StreamScaling
from gaugebook.gpt_redundancy import LogProbabilities, make_generic_
from gaugebook.lie import (GaugeElement, project, rope_commutant_basis,
                           rope_plane_breaking_basis, tangent_map)
from gaugebook.redundancy import jacobian
from gaugebook.rope import rope_frequencies, rotation_matrix

F64 = torch.float64
TINY = dict(vocab_size=11, block_size=6, n_layer=2, n_head=2, n_embd=6)


def generic(**options):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**TINY, **options}))
    return make_generic_(model, generator=torch.Generator().manual_seed(0)).double().eval()


def tokens():
    return torch.randint(0, TINY["vocab_size"], (3, TINY["block_size"]),
                         generator=torch.Generator().manual_seed(1))


# --- GPTConfig.layer_norm_eps ----------------------------------------------------------------

def test_every_layernorm_takes_the_configured_eps():
    assert GPTConfig(**TINY).layer_norm_eps == 1e-5  # GPT-2's and PyTorch's
    for eps in (0.0, 1e-3):
        model = GPT(GPTConfig(**TINY, layer_norm_eps=eps))
        norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
        assert len(norms) == 2 * TINY["n_layer"] + 1 and all(m.eps == eps for m in norms)


def test_layer_norm_eps_is_validated_and_frozen():
    for bad in (-1e-6, math.nan, math.inf, True, "1e-5", None):
        with pytest.raises(ValueError, match="layer_norm_eps"):
            GPTConfig(**TINY, layer_norm_eps=bad)
    config = GPTConfig(**TINY, layer_norm_eps=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.layer_norm_eps = 1.0
    with pytest.raises(ValueError, match="layer_norm_eps"):
        dataclasses.replace(config, layer_norm_eps=-1.0)
    assert GPTConfig.from_dict(config.to_dict()) == config


def test_huggingface_conversion_keeps_the_eps():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=11, n_positions=6, n_embd=8, n_layer=1, n_head=2,
                                  layer_norm_epsilon=0.5, resid_pdrop=0.0, embd_pdrop=0.0,
                                  attn_pdrop=0.0)
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    model = GPT.from_huggingface(hf).eval()
    assert model.config.layer_norm_eps == 0.5
    with torch.no_grad():  # a large eps: a wrong one would show far above 1e-5
        assert (model(tokens())[0] - hf(tokens()).logits).abs().max() < 1e-5


# --- StreamScaling ---------------------------------------------------------------------------

def logit_change(model, s):
    with torch.no_grad():
        before = model(tokens())[0]
        after = GaugeElement([StreamScaling(torch.tensor([s]))]).act(model)(tokens())[0]
    return ((after - before).abs().max() / before.abs().max()).item()


@pytest.mark.parametrize("options", [{}, dict(rope=True, n_head=1), dict(bias=False),
                                     dict(activation="prelu", symmetry_breaking="bqv")])
def test_stream_scaling_is_exact_at_eps_zero(options):
    model = generic(layer_norm_eps=0.0, **options)
    for s in (1.7, 0.6):  # not powers of two, whose scaling floating point does exactly
        assert logit_change(model, s) < 1e-12
    moved = StreamScaling(torch.tensor([1.7])).transform(dict(model.named_parameters()), model)
    assert "blocks.1.mlp.c_proj.weight" in moved and "ln_f.weight" in moved
    assert ("wpe.weight" in moved) == (not options.get("rope"))


def test_stream_scaling_breaks_in_proportion_to_eps():
    changes = {eps: logit_change(generic(layer_norm_eps=eps), 1.5) for eps in (1e-5, 1e-4)}
    ratio = changes[1e-4] / changes[1e-5]
    assert changes[1e-5] > 1e-8  # far above round-off: no symmetry
    assert abs(ratio / 10 - 1) < 0.03  # first order in eps


def test_stream_scaling_tangent_is_null_only_at_eps_zero():
    change = {}
    for eps in (0.0, 1e-4):
        model = LogProbabilities(generic(layer_norm_eps=eps))
        T = tangent_map(model, StreamScaling, "gpt")  # (n_params, 1)
        J = jacobian(model, tokens())
        change[eps] = ((J @ T).norm() / (torch.linalg.matrix_norm(J, ord=2) * T.norm())).item()
    assert change[0.0] < 1e-13 and change[1e-4] > 1e-7


# --- rope_plane_breaking_basis ---------------------------------------------------------------

@pytest.mark.parametrize("d_head, rotary_dim, plane", [(6, 6, 0), (6, 6, 2), (8, 4, 1)])
def test_plane_breaking_generators(d_head, rotary_dim, plane):
    X = rope_plane_breaking_basis(d_head, rotary_dim, plane)
    assert X.shape == (2, d_head, d_head) and X.dtype == F64
    i, j = plane, plane + rotary_dim // 2
    outside = torch.ones(d_head, d_head, dtype=torch.bool)
    outside[[i, i, j, j], [i, j, i, j]] = False
    assert (X[:, outside] == 0).all()  # supported on the plane
    assert torch.equal(X, X.transpose(1, 2))  # symmetric
    assert (torch.diagonal(X, dim1=1, dim2=2).sum(1) == 0).all()  # traceless
    assert project(X, rope_commutant_basis(d_head, rotary_dim)).abs().max() == 0  # not in it
    theta = rope_frequencies(rotary_dim)
    for position in (0.0, 0.5, 3.0):
        R = rotation_matrix(position, theta, d_head)
        alpha = position * theta[plane]
        norms = torch.linalg.matrix_norm(X @ R - R @ X)  # Frobenius, one per generator
        expected = 2 * math.sqrt(2) * abs(math.sin(alpha))
        assert torch.allclose(norms, torch.full((2,), expected, dtype=F64), atol=1e-14)


def test_plane_breaking_basis_validates():
    with pytest.raises(ValueError, match="rotary_dim"):
        rope_plane_breaking_basis(6, 8, 0)
    with pytest.raises(ValueError, match="rotary_dim"):
        rope_plane_breaking_basis(6, 3, 0)
    with pytest.raises(ValueError, match="plane"):
        rope_plane_breaking_basis(6, 4, 2)


def test_the_term_count_refuses_layer_norm_eps_zero():
    from gaugebook.gpt_redundancy import redundancy_terms

    with pytest.raises(ValueError, match="StreamScaling"):
        redundancy_terms(GPTConfig(20, 6, 1, 2, 8, layer_norm_eps=0.0))
    assert sum(redundancy_terms(GPTConfig(20, 6, 1, 2, 8)).values()) > 0
