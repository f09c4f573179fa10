import copy
import subprocess
import sys

import pytest
import torch

from gaugebook.attention import MultiHeadAttention
from gaugebook.redundancy import factor_redundancy, jacobian, predicted_redundancy, redundancy

# (d_model, n_heads, d_head, kwargs): every attention flavour, including d_head > d_model.
ARCHITECTURES = {
    "mha": (6, 3, 4, dict()),
    "mha-bias": (6, 3, 4, dict(bias=True)),
    "gqa": (6, 4, 4, dict(n_kv_heads=2)),
    "gqa-bias": (6, 4, 4, dict(n_kv_heads=2, bias=True)),
    "mqa-bias": (6, 4, 4, dict(n_kv_heads=1, bias=True)),
    "rope": (6, 3, 4, dict(rope=True)),
    "rope-bias-gqa": (6, 4, 4, dict(rope=True, n_kv_heads=2, bias=True)),
    "partial-rope-bias": (6, 3, 4, dict(rope=True, rotary_dim=2, bias=True)),
    "gated-rope": (6, 3, 4, dict(rope="gated", bias=True)),
    "value-width": (6, 3, 4, dict(d_value=2, bias=True)),
    "bidirectional": (6, 3, 4, dict(causal=False, bias=True)),
    "wide-head": (3, 2, 4, dict(bias=True)),
    "wide-head-gqa": (3, 4, 4, dict(n_kv_heads=2)),
    "wide-head-rope": (3, 2, 6, dict(rope=True)),
    "wide-value": (3, 2, 2, dict(d_value=5, bias=True)),
}


def probe(m, generator, batch=16, T=12):
    return torch.randn(batch, T, m.d_model, generator=generator, dtype=torch.float64)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_measured_redundancy_equals_theory(name, generator):
    D, H, dk, kwargs = ARCHITECTURES[name]
    m = MultiHeadAttention(D, H, dk, dtype=torch.float64, generator=generator, **kwargs)
    r = redundancy(m, probe(m, generator))
    assert r.n_params == sum(p.numel() for p in m.parameters())
    assert r.dimension == predicted_redundancy(m)
    assert r.gap > 1e8, "the zero singular values must be separated from the rest"


def test_mha_count_is_dk2_plus_dv2_per_head():
    m = MultiHeadAttention(16, 4, 4, d_value=3)
    assert predicted_redundancy(m) == 4 * (4**2 + 3**2)
    m = MultiHeadAttention(16, 4, 4, d_value=3, bias=True)
    assert predicted_redundancy(m) == 4 * (4**2 + 4 + 3**2 + 3)


def test_factor_redundancy_counts():
    assert factor_redundancy(10, 10, 3) == 9  # GL(3) acts freely
    assert factor_redundancy(3, 3, 5) == 2 * 3 * 5 - 9  # stabiliser of dimension (5 - 3)^2
    assert factor_redundancy(3, 3, 5) == 5**2 - (5 - 3) ** 2


def test_float32_model_is_measured_in_float64(generator):
    m = MultiHeadAttention(6, 2, 3, generator=generator)
    r = redundancy(m, probe(m, generator).float())
    assert r.singular_values.dtype == torch.float64
    assert r.dimension == predicted_redundancy(m)
    assert m.W_Q.dtype == torch.float32  # the model itself is untouched


def test_rank_deficient_weights_add_redundancy(generator):
    """At a non-generic point (W_Q of rank 1 in one head) the count exceeds the theory's."""
    m = MultiHeadAttention(6, 2, 3, dtype=torch.float64, generator=generator)
    with torch.no_grad():
        m.W_Q[0] = torch.outer(m.W_Q[0, :, 0], torch.ones(3, dtype=torch.float64))
    assert redundancy(m, probe(m, generator)).dimension > predicted_redundancy(m)


def test_gpt2_initialisation_is_not_generic():
    """The example of redundancy's docstring: a fresh GPT (LayerNorm gains 1, biases 0) has 250
    redundant directions, not the theory's 218; make_generic_ gives the 218."""
    from gaugebook.gpt import GPT, GPTConfig
    from gaugebook.gpt_redundancy import make_generic_
    torch.manual_seed(0)
    config = GPTConfig(11, 8, 1, 2, 8)
    idx = torch.randint(0, 11, (40, 8))
    fresh = GPT(config).double()
    assert predicted_redundancy(fresh) == 218
    assert redundancy(fresh, idx).dimension == 250
    generic = make_generic_(GPT(config).double(), generator=torch.Generator().manual_seed(0))
    assert redundancy(generic, idx).dimension == 218
    assert "make_generic_" in redundancy.__doc__ and "make_generic_" in \
        predicted_redundancy.__doc__


def test_too_few_outputs_warn(generator):
    m = MultiHeadAttention(6, 3, 4, dtype=torch.float64, generator=generator)
    with pytest.warns(UserWarning, match="more or longer inputs"):
        redundancy(m, probe(m, generator, batch=1, T=3))


def test_too_few_outputs_for_the_expected_rank_warn_below_the_output_count(generator):
    """A GPT's logits have rank below their count: without the theory's count the cap hides."""
    from gaugebook.gpt import GPT, GPTConfig
    gpt = GPT(GPTConfig(11, 8, 1, 2, 8)).double()
    idx = torch.randint(0, 11, (1, 8), generator=generator)  # 88 outputs, 1,000+ parameters
    with pytest.warns(UserWarning, match=r"88 outputs for a Jacobian of rank \d+ \(the theory "
                      r"expects rank \d+\)"):
        measured = redundancy(gpt, idx)
    assert measured.rank < 88  # the old check (rank == outputs) stayed silent


def test_unsupported_model_is_rejected():
    with pytest.raises(TypeError, match="no redundancy prediction for Linear"):
        predicted_redundancy(torch.nn.Linear(2, 2))
    frozen = torch.nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        redundancy(frozen, torch.randn(3, 2))


def test_the_function_is_the_model_in_eval_mode(generator):
    """Dropout in training mode would make the Jacobian random: it is taken in eval mode."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Dropout(0.5)).double()  # training
    x = torch.randn(5, 3, generator=generator, dtype=torch.float64)
    expected = jacobian(copy.deepcopy(model).eval(), x)
    torch.testing.assert_close(jacobian(model, x), expected)
    assert model.training  # the model itself is untouched


@pytest.mark.parametrize("build", [
    "gaugebook.gpt GPT(GPTConfig(50, 8, 1, 2, 8)).eval()",
    "gaugebook.gpt GPT(GPTConfig(50, 8, 1, 2, 8)).blocks[0].eval()",
    "gaugebook.moe MoE(4, 3, 5, 2, activation='relu')",
    "gaugebook.attention MultiHeadAttention(8, 2, 4)",
])
def test_predicted_redundancy_needs_no_other_import(build):
    """Only the model's module and gaugebook.redundancy are imported (a fresh interpreter):
    no count is registered as a side effect of importing some third module."""
    module, expression = build.split(" ", 1)
    code = (f"import sys\nfrom {module} import *\nfrom gaugebook.redundancy import "
            f"predicted_redundancy\nprint(predicted_redundancy({expression}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 0
