"""Redundancy of a whole GPT: the term-by-term count against the Jacobian rank, the explicit
tangent vectors, the parameter count, and GPT-2 small's numbers."""
import math

import pytest
import torch

from gaugebook.gpt import GPT, Block, GPTConfig
from gaugebook.gpt_redundancy import (MIN_LAYER_NORM_EPS, TERMS, LogProbabilities, block_terms,
                                      make_generic_, parameter_count, positive_fraction,
                                      redundancy_terms, redundant_directions)
from gaugebook.redundancy import jacobian, predicted_redundancy, redundancy

V, T = 11, 6


def probe(config, seed, output="log_probs", rows_per_param=4):
    """A generic float64 model and tokens with ``rows_per_param`` times more outputs than
    parameters; seeds are tried from ``seed`` on until every MLP unit switches sign on at least 5%
    of the positions (the count's assumption for PReLU, checked rather than hoped for)."""
    for s in range(seed, seed + 20):
        torch.manual_seed(s)
        g = torch.Generator().manual_seed(s)
        gpt = make_generic_(GPT(config), generator=g).double().eval()
        B = math.ceil(rows_per_param * gpt.num_params() / (T * (V - 1)))
        idx = torch.randint(0, V, (B, T), generator=g)
        f = positive_fraction(gpt, idx)
        if torch.minimum(f, 1 - f).min() >= 0.05:
            return (LogProbabilities(gpt) if output == "log_probs" else gpt), idx
    raise AssertionError("no seed gave MLP units that all switch sign")


CONFIGS = {
    "gelu-mha": dict(),
    "gelu-mqa-nobias": dict(n_kv_head=1, bias=False),
    "prelu-mha": dict(activation="prelu"),
    "prelu-mha-nobias-2layer": dict(n_layer=2, activation="prelu", bias=False),
    "prelu-mqa-2layer": dict(n_layer=2, activation="prelu", n_kv_head=1),
    "rope": dict(n_embd=8, rope=True),
    "gated-rope-nobias": dict(n_embd=8, rope="gated", bias=False, activation="prelu"),
    "bq-eval": dict(symmetry_breaking="bq"),
    "bqv-eval-nobias": dict(symmetry_breaking="bqv", mu_v=0.5, bias=False, n_kv_head=1),
}


def config(**kw):
    base = dict(vocab_size=V, block_size=T, n_layer=1, n_head=2, n_embd=6)
    return GPTConfig(**{**base, **kw})


@pytest.mark.parametrize("name", CONFIGS)
def test_log_probability_redundancy_equals_count(name):
    model, idx = probe(config(**CONFIGS[name]), seed=0)
    r = redundancy(model, idx)
    assert r.n_params == parameter_count(model.gpt.config)
    terms = redundancy_terms(model.gpt.config)
    assert r.dimension == predicted_redundancy(model) == sum(terms.values())
    assert r.gap > 1e8


@pytest.mark.parametrize("bias", [True, False])
def test_logits_lose_the_embedding_shift(bias):
    model, idx = probe(config(bias=bias), seed=0, output="logits")
    assert redundancy(model, idx).dimension == predicted_redundancy(model)
    lp, logits = (redundancy_terms(model.config, output=o) for o in ("log_probs", "logits"))
    assert lp["embedding_shift"] - logits["embedding_shift"] == 6 - (not bias)


@pytest.mark.parametrize("kw", [dict(), dict(rope=True, n_embd=8)])
def test_redundancy_terms_default_counts_log_probabilities(kw):
    """As the docstring says: the default output is the log-probabilities', whose count is not
    the GPT's own (its logits)."""
    gpt = GPT(config(**kw))
    terms, logits = redundancy_terms(gpt.config), redundancy_terms(gpt.config, output="logits")
    assert sum(terms.values()) == predicted_redundancy(LogProbabilities(gpt))
    assert sum(logits.values()) == predicted_redundancy(gpt) < sum(terms.values())
    assert 'output="log_probs"`` (the default)' in redundancy_terms.__doc__


@pytest.mark.parametrize("kw", [dict(), dict(bias=False, activation="prelu"), dict(n_kv_head=1)])
def test_standalone_block(kw):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    block = make_generic_(Block(config(**kw)), generator=g).double()
    x = torch.randn(40, T, 6, generator=g, dtype=torch.float64)
    r = redundancy(block, x)
    assert r.dimension == predicted_redundancy(block) and r.gap > 1e8


def test_a_block_with_an_activation_swapped_in_is_refused_not_miscounted():
    """A ReLU put in by hand has the rescaling symmetry that GELU lacks: the count refuses it
    (it was counted as GELU: 24 directions short), in a block and in a GPT whose config no
    longer describes its blocks."""
    block = Block(config())
    block.mlp.act = torch.nn.ReLU()
    with pytest.raises(TypeError, match="MLP activation is ReLU: the counts cover"):
        predicted_redundancy(block)
    gpt = GPT(config(activation="prelu"))  # a GELU where the config says PReLU
    gpt.blocks[0].mlp.act = torch.nn.GELU()
    with pytest.raises(ValueError, match=r"blocks \[0\] do not use the config's activation"):
        predicted_redundancy(LogProbabilities(gpt))


@pytest.mark.parametrize("kw", [dict(activation="prelu"), dict(n_kv_head=1, bias=False),
                                dict(n_embd=8, rope=True), dict(n_embd=8, rope="gated"),
                                dict(n_embd=8, rope="gated", bias=False, activation="prelu")])
def test_every_term_is_a_null_direction_and_together_they_span(kw):
    """With gated RoPE and biases, the LayerNorm shift of ``ln_1`` is a symmetry only because
    the bias-free gates move their columns along ``1/gamma`` (it was refused there, while the
    count had it)."""
    model, idx = probe(config(**kw), seed=0)
    J = jacobian(model, idx)
    directions = redundant_directions(model)
    terms = redundancy_terms(model.gpt.config)
    assert set(directions) == set(terms) == set(TERMS)
    scale = torch.linalg.matrix_norm(J, ord=2)
    for name, V_term in directions.items():
        if V_term.shape[1]:
            assert (J @ V_term).norm() <= 1e-12 * scale * V_term.norm(), name
        assert int(torch.linalg.matrix_rank(V_term)) == terms[name], name
    everything = torch.cat(list(directions.values()), dim=1)
    nullity = J.shape[1] - int(torch.linalg.matrix_rank(J))  # rtol max(shape) eps, as redundancy
    assert int(torch.linalg.matrix_rank(everything)) == nullity == sum(terms.values())


def test_one_sided_prelu_unit_adds_redundancy():
    model, idx = probe(config(activation="prelu"), seed=0)
    with torch.no_grad():
        model.gpt.blocks[0].mlp.c_fc.bias[0] = 20.0  # unit 0 now positive on every probe
    assert positive_fraction(model, idx)[0, 0] == 1.0
    assert redundancy(model, idx).dimension > predicted_redundancy(model)


def test_training_mode_with_breaking_counts_and_measures_the_eval_function():
    model, idx = probe(config(symmetry_breaking="bq"), seed=0)
    assert model.train().training  # the biases are redrawn at every call in this mode
    logits_terms = redundancy_terms(model.gpt.config, output="log_probs")
    assert predicted_redundancy(model) == sum(logits_terms.values())
    assert redundancy(model, idx).dimension == predicted_redundancy(model)  # both the means
    assert model.training


@pytest.mark.parametrize("kw, message", [
    (dict(activation="relu"), "activation must be one of .*got 'relu'"),
    (dict(d_model=7), "d_model=7 is not divisible by n_head=2"),
    (dict(n_kv_head=3), "n_head=2 is not divisible by n_kv_head=3"),
    # GPTConfig's rules: these were counted (or a ZeroDivisionError)
    (dict(symmetry_breaking="bogus"), "symmetry_breaking must be one of"),
    (dict(d_model=8, rope="Gated"), "rope must be one of"),
    (dict(symmetry_breaking="bq", mu_v=0.5), "only symmetry_breaking='bqv'"),
    (dict(symmetry_breaking="bqv", mu_v=float("nan")), "mu_v must be a finite number"),
    (dict(n_kv_head=0), "n_kv_head must be a positive integer, got 0"),
    (dict(d_model=6.0), "d_model must be a positive integer"),
    (dict(bias=1), "bias must be True or False"),
    (dict(in_gpt="no"), "in_gpt must be True or False, got 'no'"),  # was counted as inside
    (dict(rope=True), "head size d_model/n_head=3 must be even"),
    # narrow blocks: measured more redundant than every term (GELU width 2: 22 more)
    (dict(d_model=3, n_head=1, n_kv_head=1), r"width d_model >= 4 \(inside a GPT, gelu\)"),
    (dict(d_model=4, activation="prelu"), r"d_model >= 6 \(inside a GPT, prelu\); at 4"),
    (dict(d_model=4, activation="prelu", in_gpt=False), r"d_model >= 5 \(on their own"),
])
def test_block_terms_rejects_what_it_cannot_count(kw, message):
    shape = dict(d_model=6, n_head=2, n_kv_head=2, bias=True, activation="gelu")
    with pytest.raises(ValueError, match=message):
        block_terms(**{**shape, **kw})


def test_block_terms_accept_what_gpt_config_accepts():
    """block_terms checks with GPTConfig's rules; every valid block is counted as before."""
    shape = dict(d_model=8, n_head=2, n_kv_head=1, bias=False, activation="prelu")
    for kw in (dict(), dict(rope=True), dict(rope="gated"), dict(symmetry_breaking="bq"),
               dict(symmetry_breaking="bqv", mu_v=0.5)):
        assert sum(block_terms(**shape, **kw).values()) > 0
    narrow = dict(d_model=5, n_head=1, n_kv_head=1, bias=True, activation="prelu")
    assert block_terms(**narrow, in_gpt=False)["mlp_rescaling"] == 20  # 4 D <= (D - 1) D


@pytest.mark.parametrize("eps", [1e-7, 1e-12])
def test_the_count_refuses_an_eps_too_small_to_measure(eps):
    """Below MIN_LAYER_NORM_EPS the stream scaling's singular value, proportional to eps, can
    fall under the rank tolerance: measured 159 against the count's 158 at eps = 1e-12."""
    with pytest.raises(ValueError, match="layer_norm_eps >= 1e-06"):
        redundancy_terms(config(layer_norm_eps=eps))
    with pytest.raises(ValueError, match="layer_norm_eps >= 1e-06"):
        predicted_redundancy(LogProbabilities(GPT(config(layer_norm_eps=eps))).eval())
    assert MIN_LAYER_NORM_EPS < config().layer_norm_eps  # the default, GPT-2's 1e-5
    for ok in (MIN_LAYER_NORM_EPS, 1e-5):
        assert redundancy_terms(config(layer_norm_eps=ok)) == redundancy_terms(config())


def test_positive_fraction_is_for_eval_mode_and_keeps_the_mode():
    """A train-mode "bq" model redraws its query bias at every call: the fractions must be those
    of eval mode (the means, as the count), and the caller's modes must stay as they were."""
    model, idx = probe(config(symmetry_breaking="bq", bias=False), seed=0)
    expected = positive_fraction(model, idx)
    model.train()
    model.gpt.blocks[0].mlp.eval()  # a mixed state, restored module by module
    modes = [m.training for m in model.modules()]
    torch.manual_seed(1)
    assert torch.equal(positive_fraction(model, idx), expected)
    assert torch.equal(positive_fraction(model.gpt, idx), expected)
    assert [m.training for m in model.modules()] == modes
    with pytest.raises(TypeError, match="GPT or LogProbabilities"):
        positive_fraction(torch.nn.Linear(2, 2), idx)


def test_bad_arguments():
    with pytest.raises(ValueError, match="vocab_size > n_embd"):
        redundancy_terms(config(vocab_size=6))
    with pytest.raises(ValueError, match="output must be one of"):
        redundancy_terms(config(), output="probs")
    with pytest.raises(TypeError, match="GPTConfig"):
        redundancy_terms(dict(n_embd=6))
    with pytest.raises(TypeError, match="wraps a GPT"):
        LogProbabilities(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="symmetry-breaking"):
        redundant_directions(GPT(config(symmetry_breaking="bq")).eval())
    at_init = LogProbabilities(GPT(config(n_embd=8, rope="gated")))  # every LayerNorm bias 0
    with pytest.raises(ValueError, match=r"\['ln_bias'\] are not finite.*make_generic_"):
        redundant_directions(at_init)


@pytest.mark.parametrize("kw", [dict(), dict(bias=False, activation="prelu"), dict(n_kv_head=1),
                                dict(n_embd=8, rope=True), dict(n_embd=8, rope="gated")])
def test_parameter_count_without_building(kw):
    c = config(**kw)
    assert parameter_count(c) == GPT(c).num_params()


def test_gpt2_small():
    c = GPTConfig(50257, 1024, 12, 12, 768)
    assert parameter_count(c) == 124_439_808  # the Hugging Face checkpoint's size
    terms = redundancy_terms(c)
    layers, heads, dk = 12, 12, 64
    assert terms["qk_gauge"] == terms["vo_gauge"] == layers * heads * dk**2
    assert terms["key_bias"] == terms["value_bias"] == layers * heads * dk
    assert terms["mlp_rescaling"] == 0  # GELU
    assert terms["embedding_shift"] == 768 and terms["position_centring"] == 1024
    total = sum(terms.values())
    assert 0.01 < total / parameter_count(c) < 0.012
