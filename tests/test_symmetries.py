"""The same checks for every symmetry the book counts (gaugebook.lie's one form), in float32 and
float64: the function is invariant, the input is untouched, the identity acts trivially, the
inverse undoes the action, composition follows functions and stays in the family, and (float64)
the Lie algebra's tangent vectors lie in the null space of the Jacobian."""
import dataclasses
import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable

import pytest
import torch

import gaugebook
from conftest import tolerance
from gaugebook.attention import MultiHeadAttention
from gaugebook.gauge import (GaugeElement, HeadPermutation, KeyBiasShift, QKTransform,
                             ValueBiasShift, VOTransform)
from gaugebook.gpt import GPT, GPTConfig
from gaugebook.gpt_gauge import (EmbeddingShift, HiddenPermutation, HiddenRescaling,
                                 LayerNormScale, LayerNormShift, PositionCentring, ReaderCentring,
                                 ResidualCentring, ResidualPermutation, StreamScaling)
from gaugebook.gpt_redundancy import LogProbabilities, make_generic_
from gaugebook.lie import Factor, tangent_map
from gaugebook.moe import (MoE, ExpertHiddenPermutation, ExpertPermutation, ExpertRescaling,
                           RouterShift)
from gaugebook.redundancy import jacobian

SEED = 7


def attention(dtype, **kw):
    g = torch.Generator().manual_seed(SEED)
    return MultiHeadAttention(8, 4, 4, n_kv_heads=2, bias=True, dtype=dtype, generator=g, **kw)


def gpt(dtype, **kw):
    torch.manual_seed(SEED)
    config = GPTConfig(**{**dict(vocab_size=11, block_size=6, n_layer=2, n_head=2, n_embd=6),
                          **kw})
    return make_generic_(GPT(config), generator=torch.Generator().manual_seed(SEED)).to(dtype)


def moe(dtype, **kw):
    return MoE(6, 4, 5, 2, activation="relu", router_bias=True, dtype=dtype,
               generator=torch.Generator().manual_seed(SEED), **kw)


def attention_input(m):
    return (torch.randn(2, 9, m.d_model, generator=torch.Generator().manual_seed(1),
                        dtype=m.W_Q.dtype),)


def gpt_input(model):
    gen = torch.Generator().manual_seed(1)
    return (torch.randint(0, model.config.vocab_size, (3, model.config.block_size),
                          generator=gen),)


def moe_input(m):
    return (torch.randn(16, m.d_model, generator=torch.Generator().manual_seed(1),
                        dtype=m.W_r.dtype),)


@dataclass
class Case:
    """A symmetry at a model: how to build the model and its input, the function that must not
    change, and the factor family at ``target``; ``random(module, gen)`` draws a group element,
    ``compose(a, b)`` is the one factor equal to "a, then b"."""

    model: Callable
    inputs: Callable
    family: type
    target: str = ""
    options: dict = None
    random: Callable | None = None  # discrete families
    compose: Callable | None = None
    function: Callable = lambda model, *x: model(*x)

    def module(self, model):
        return model.get_submodule(self.target)


def log_probs(model, *x):
    return LogProbabilities(model)(*x)


def output(model, *x):
    y = model(*x)
    return y[0] if isinstance(y, tuple) else y


def _field(family):
    """The name of the family's group parameter (its first field after ``target``)."""
    return next(f.name for f in dataclasses.fields(family) if f.name != "target")


def _sum(a, b):  # abelian translations: parameters add
    return a + b


def _product(a, b):  # scalings: parameters multiply
    return a * b


def _permutation_product(a, b):  # x[a] then [b] is x[a[b]] (row by row for a stack)
    return a.gather(-1, b)


def _matrix_product(a, b):  # W M_a then M_b is W (M_a M_b)
    return a @ b


CASES = {
    "qk": Case(attention, attention_input, QKTransform, compose=_matrix_product),
    "qk-partial-rope": Case(lambda d: attention(d, rope=True, rotary_dim=2), attention_input,
                            QKTransform, compose=_matrix_product),
    "qk-gated-rope": Case(lambda d: attention(d, rope="gated"), attention_input, QKTransform,
                          compose=_matrix_product),
    "vo": Case(attention, attention_input, VOTransform, compose=_matrix_product),
    "key-bias": Case(attention, attention_input, KeyBiasShift, compose=_sum),
    "value-bias": Case(attention, attention_input, ValueBiasShift, compose=_sum),
    "heads": Case(attention, attention_input, HeadPermutation, compose=_permutation_product,
                  random=lambda m, g: HeadPermutation(
                      (torch.randperm(2, generator=g)[:, None] * 2
                       + torch.stack([torch.randperm(2, generator=g) for _ in range(2)]))
                      .flatten())),
    "ln1-scale": Case(gpt, gpt_input, LayerNormScale, "blocks.0", dict(which="ln_1"),
                      compose=_product, function=log_probs),
    "ln2-scale": Case(gpt, gpt_input, LayerNormScale, "blocks.1", dict(which="ln_2"),
                      compose=_product, function=log_probs),
    "ln1-shift": Case(gpt, gpt_input, LayerNormShift, "blocks.0", dict(which="ln_1"),
                      compose=_sum, function=log_probs),
    "ln2-shift": Case(gpt, gpt_input, LayerNormShift, "blocks.1", dict(which="ln_2"),
                      compose=_sum, function=log_probs),
    "ln1-shift-gated": Case(lambda d: gpt(d, n_embd=8, rope="gated"), gpt_input, LayerNormShift,
                            "blocks.0", dict(which="ln_1"), compose=_sum, function=log_probs),
    "ln1-centring": Case(gpt, gpt_input, ReaderCentring, "blocks.0", dict(which="ln_1"),
                         compose=_sum, function=log_probs),
    "ln2-centring": Case(gpt, gpt_input, ReaderCentring, "blocks.1", dict(which="ln_2"),
                         compose=_sum, function=log_probs),
    "ln1-centring-gated": Case(lambda d: gpt(d, n_embd=8, bias=False, rope="gated"), gpt_input,
                               ReaderCentring, "blocks.0", dict(which="ln_1"), compose=_sum,
                               function=log_probs),
    "residual-centring": Case(gpt, gpt_input, ResidualCentring, "blocks.0", compose=_sum,
                              function=log_probs),
    "prelu-rescaling": Case(lambda d: gpt(d, activation="prelu"), gpt_input, HiddenRescaling,
                            "blocks.1.mlp", compose=_product, function=log_probs),
    "mlp-permutation": Case(lambda d: gpt(d, activation="prelu"), gpt_input, HiddenPermutation,
                            "blocks.0.mlp", compose=_permutation_product, function=log_probs,
                            random=lambda mlp, g: HiddenPermutation(
                                torch.randperm(mlp.c_fc.weight.shape[0], generator=g))),
    "residual-permutation": Case(gpt, gpt_input, ResidualPermutation,
                                 compose=_permutation_product, function=log_probs,
                                 random=lambda m, g: ResidualPermutation(
                                     torch.randperm(m.config.n_embd, generator=g))),
    "position-centring": Case(gpt, gpt_input, PositionCentring, compose=_sum,
                              function=log_probs),
    "embedding-shift": Case(gpt, gpt_input, EmbeddingShift, compose=_sum, function=log_probs),
    "embedding-shift-rope": Case(lambda d: gpt(d, n_embd=8, rope=True), gpt_input, EmbeddingShift,
                                 compose=_sum, function=log_probs),
    "stream-scaling": Case(lambda d: gpt(d, layer_norm_eps=0.0), gpt_input, StreamScaling,
                           compose=_product, function=log_probs),  # exact only at eps = 0
    "router-shift": Case(moe, moe_input, RouterShift, compose=_sum, function=output),
    "expert-rescaling": Case(moe, moe_input, ExpertRescaling, compose=_product,
                             function=output),
    "expert-permutation": Case(moe, moe_input, ExpertPermutation,
                               compose=_permutation_product, function=output,
                               random=lambda m, g: ExpertPermutation(
                                   torch.randperm(m.n_experts, generator=g))),
    "expert-hidden-permutation": Case(moe, moe_input, ExpertHiddenPermutation,
                                      compose=_permutation_product, function=output,
                                      random=lambda m, g: ExpertHiddenPermutation(torch.stack(
                                          [torch.randperm(m.d_hidden, generator=g)
                                           for _ in range(m.n_experts)]))),
}
CONTINUOUS = [name for name, case in CASES.items() if case.random is None]


def _declared_families() -> set[type]:
    """Every public factor family of the library: the subclasses of ``lie.Factor`` outside
    ``lie`` itself (whose classes are the forms, not symmetries), from every module."""
    for module in pkgutil.iter_modules(gaugebook.__path__):
        importlib.import_module(f"gaugebook.{module.name}")

    def below(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from below(sub)

    return {f for f in below(Factor) if f.__module__.startswith("gaugebook.")
            and f.__module__ != "gaugebook.lie" and not f.__name__.startswith("_")}


def test_every_declared_symmetry_has_a_case_here():
    """A factor added to the library without a case would escape every check of this file."""
    missing = _declared_families() - {case.family for case in CASES.values()}
    assert not missing, f"add a case to CASES for {sorted(f.__name__ for f in missing)}"


def draw(case: Case, model, gen, scale=0.3):
    """A random element of the case's family: the discrete ones by the case's own draw, the
    continuous ones by the library's (``ContinuousFactor.random``, through the Lie algebra)."""
    module = case.module(model)
    options = case.options or {}
    if case.random is not None:
        f = case.random(module, gen)
        return type(f)(f.__dict__[_field(type(f))], target=case.target)
    return case.family.random(module, scale=scale, target=case.target, generator=gen,
                              **options)


def params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def close(a, b, dtype, cond=10.0):
    scale = max(x.abs().max().item() for x in a.values())
    return max((a[n].double() - b[n].double()).abs().max().item() for n in a) <= \
        tolerance(dtype, cond) * scale


@pytest.mark.parametrize("name", CASES)
def test_the_function_is_invariant_and_the_input_untouched(name, dtype):
    case = CASES[name]
    model, gen = case.model(dtype), torch.Generator().manual_seed(3)
    x = case.inputs(model)
    before = params(model)
    g = GaugeElement([draw(case, model, gen)])
    moved = g.act(model)
    f0, f1 = case.function(model, *x), case.function(moved, *x)
    assert (f1 - f0).abs().max() <= tolerance(dtype, 100.0) * f0.abs().max()
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    assert all(p.dtype == dtype for p in moved.parameters())
    assert not close(params(moved), before, dtype)  # it did move the parameters


@pytest.mark.parametrize("name", CASES)
def test_group_axioms(name, dtype):
    case = CASES[name]
    model, gen = case.model(dtype), torch.Generator().manual_seed(4)
    a, b = draw(case, model, gen), draw(case, model, gen)
    ga, gb = GaugeElement([a]), GaugeElement([b])
    theta = params(model)
    assert close(params((ga.inverse() @ ga).act(model)), theta, dtype, 100.0)  # inverse
    assert close(params((ga @ ga.inverse()).act(model)), theta, dtype, 100.0)
    name = _field(type(a))
    in_family = type(a)(case.compose(getattr(a, name), getattr(b, name)), target=case.target,
                        **(case.options or {}))
    then = params(gb.act(ga.act(model)))
    assert close(params((gb @ ga).act(model)), then, dtype)  # composition follows functions
    assert close(params(GaugeElement([in_family]).act(model)), then, dtype, 100.0)  # closure
    if case.random is None:  # exp(0) is the identity
        zero = torch.zeros_like(case.family.lie_basis(case.module(model),
                                                      **(case.options or {}))[0])
        identity = case.family.exp(zero, target=case.target, **(case.options or {}))
        assert close(params(GaugeElement([identity]).act(model)), theta, dtype, 1.0)


@pytest.mark.parametrize("name", CONTINUOUS)
def test_lie_algebra_is_in_the_null_space_of_the_jacobian(name):
    case = CASES[name]
    model = case.model(torch.float64).eval()
    x = case.inputs(model)

    class Function(torch.nn.Module):  # the case's function as a module (parameters shared)
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *inputs):
            return case.function(self.model, *inputs)

    T = tangent_map(model, case.family, case.target, **(case.options or {}))
    J = jacobian(Function(), *x)
    assert T.shape == (J.shape[1], len(case.family.lie_basis(case.module(model),
                                                             **(case.options or {}))))
    assert torch.linalg.matrix_rank(T) == T.shape[1]  # independent generators at generic weights
    assert (J @ T).norm() <= 1e-12 * torch.linalg.matrix_norm(J, ord=2) * T.norm()


@pytest.mark.parametrize("family", [LayerNormScale, LayerNormShift, ReaderCentring])
def test_a_bad_layernorm_name_is_a_value_error(family):
    """``which`` names ln_1 or ln_2; ln_f (the model's) or a typo was an AttributeError."""
    block = gpt(torch.float64).blocks[0]
    for which in ("ln_f", "attn"):
        with pytest.raises(ValueError, match="which must be one of"):
            family.shape(block, which)
        with pytest.raises(ValueError, match="which must be one of"):
            family.lie_basis(block, which=which)
        with pytest.raises(ValueError, match="which must be one of"):
            tangent_map(block, family, which=which)


def test_embedding_shift_with_rope_needs_a_constant_w():
    """Without ``wpe`` the shift reaches every block; only ``w = c 1`` vanishes in the
    LayerNorms, so any other ``w`` is refused (it was applied, and changed the function)."""
    model = gpt(torch.float64, n_embd=8, rope=True)
    x = gpt_input(model)
    before = log_probs(model, *x)
    model = GaugeElement(EmbeddingShift(torch.full((8,), 0.7, dtype=torch.float64))).act(model)
    assert torch.allclose(log_probs(model, *x), before, atol=1e-10)
    with pytest.raises(ValueError, match="w = c 1"):
        GaugeElement(EmbeddingShift(torch.arange(8.0))).act(model)
    GaugeElement(EmbeddingShift(torch.arange(6.0))).act(gpt(torch.float64))  # learned: any w
