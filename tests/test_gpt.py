"""The GPT-2 model: configuration, shapes, initialisation, gauge invariance, Hugging Face
equivalence, bf16 autocast and torch.compile without graph breaks."""
import math

import pytest
import torch
import torch.nn.functional as F

from gaugebook.gauge import GaugeElement, KeyBiasShift, random_element, invariance_error
from gaugebook.gpt import GPT, GPTConfig, eval_mode

V, T = 61, 12


def config(**kw):
    return GPTConfig(V, T, 2, 4, 32, **kw)


def tokens(seed, batch=3, length=T):
    return torch.randint(0, V, (batch, length), generator=torch.Generator().manual_seed(seed))


def generic(model, seed=0, scale=0.3):
    """Perturb every parameter (biases are zero at GPT-2 initialisation) so that no test passes
    by accident of special weights."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


# --- configuration --------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    (dict(n_embd=30), "not divisible by n_head"),
    (dict(n_kv_head=3), "not divisible by n_kv_head"),
    (dict(n_kv_head=0), "n_kv_head must be a positive integer"),
    (dict(n_layer=0), "n_layer must be a positive integer"),
    (dict(vocab_size=True), "vocab_size must be a positive integer"),
    (dict(activation="relu"), "activation must be one of"),
    (dict(rope="yes"), "rope must be"),
    (dict(n_embd=36, n_head=4, rope=True), "must be even"),
    (dict(symmetry_breaking="bk"), "symmetry_breaking must be one of"),
    (dict(mu_v=0.5), "only symmetry_breaking='bqv'"),
    (dict(symmetry_breaking="bqv", mu_v=float("nan")), "finite"),
    (dict(bias=1), "bias must be True or False"),
    (dict(rope=1), "rope must be one of"),
    (dict(rope="Gated"), "rope must be one of"),
    (dict(symmetry_breaking="bqv", mu_v=True), "mu_v must be a finite number"),
])
def test_config_rejects_bad_values(kwargs, match):
    base = dict(vocab_size=V, block_size=T, n_layer=2, n_head=4, n_embd=32)
    with pytest.raises(ValueError, match=match):
        GPTConfig(**{**base, **kwargs})


def test_config_from_dict_round_trip_and_errors():
    c = config(activation="prelu", symmetry_breaking="bqv", mu_v=0.5)
    assert GPTConfig.from_dict(c.to_dict()) == c
    with pytest.raises(ValueError, match=r"unknown GPTConfig keys \['dropout'\].*valid keys.*mu_v"):
        GPTConfig.from_dict({**c.to_dict(), "dropout": 0.1})
    with pytest.raises(ValueError, match=r"missing required keys \['n_embd'\]"):
        GPTConfig.from_dict({k: v for k, v in c.to_dict().items() if k != "n_embd"})


def test_options_are_keyword_only():
    with pytest.raises(TypeError):
        GPTConfig(V, T, 2, 4, 32, 2)


# --- the model ------------------------------------------------------------------------------

def test_forward_shapes_and_loss():
    torch.manual_seed(0)
    model = GPT(config())
    idx, targets = tokens(0), tokens(1)
    logits, loss = model(idx, targets)
    assert logits.shape == (3, T, V)
    assert torch.allclose(loss, F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1)))
    assert model(idx)[1] is None
    # GPT-2 initialisation: logits are small, so the loss starts near log(V)
    assert abs(loss.item() - math.log(V)) < 0.05


def test_bad_inputs_are_rejected():
    model = GPT(config())
    with pytest.raises(ValueError, match="exceeds block_size"):
        model(tokens(0, length=T + 1))
    with pytest.raises(ValueError, match=r"shape \[B, T\]"):
        model(tokens(0)[0])
    with pytest.raises(ValueError, match="targets must have the shape"):
        model(tokens(0), tokens(0)[:, :-1])


def test_initialisation_follows_gpt2():
    torch.manual_seed(0)
    model = GPT(GPTConfig(V, T, 3, 4, 64))
    residual = 0.02 / math.sqrt(2 * 3)
    block = model.blocks[0]
    for p, std in [(block.attn.W_Q, 0.02), (block.attn.W_O, residual), (block.mlp.c_fc.weight, 0.02),
                   (block.mlp.c_proj.weight, residual), (model.wte.weight, 0.02)]:
        assert abs(p.std().item() / std - 1) < 0.1
    for b in (block.attn.b_Q, block.attn.b_K, block.attn.b_O, block.mlp.c_fc.bias, block.ln_1.bias):
        assert torch.equal(b, torch.zeros_like(b))
    assert torch.equal(block.ln_2.weight, torch.ones_like(block.ln_2.weight))


def test_a_generator_draws_the_same_model_whatever_the_global_seed():
    cfg = GPTConfig(vocab_size=17, block_size=8, n_layer=2, n_head=2, n_embd=8,
                    activation="prelu", prelu_init="paper")

    def state(seed, global_seed):
        torch.manual_seed(global_seed)
        model = GPT(cfg, generator=torch.Generator().manual_seed(seed))
        return torch.cat([p.flatten() for p in model.parameters()])

    assert torch.equal(state(0, 1), state(0, 2))
    assert not torch.equal(state(0, 1), state(1, 1))
    torch.manual_seed(3)
    default = torch.cat([p.flatten() for p in GPT(cfg).parameters()])
    assert not torch.equal(default, state(0, 3))  # no generator: the global one, as before
    torch.manual_seed(3)
    assert torch.equal(default, torch.cat([p.flatten() for p in GPT(cfg).parameters()]))


def test_tied_embeddings_and_parameter_count():
    model = GPT(config(bias=False))
    assert model.lm_head.weight is model.wte.weight
    D = 32
    per_block = 4 * D * D + 8 * D * D + 2 * D  # attention, MLP, two LayerNorm weights
    assert model.num_params() == V * D + T * D + 2 * per_block + D


def test_rope_model_has_no_position_embedding():
    model = GPT(config(rope=True))
    assert model.wpe is None and model.blocks[0].attn.rope is True
    assert model(tokens(0))[0].shape == (3, T, V)


def test_prelu_has_one_learned_slope_per_hidden_unit():
    model = GPT(config(activation="prelu"))
    act = model.blocks[0].mlp.act
    assert act.weight.shape == (4 * 32,) and act.weight.requires_grad
    slopes = torch.linspace(-1, 1, 4 * 32)
    with torch.no_grad():
        act.weight.copy_(slopes)
    h = torch.randn(2, 5, 4 * 32)
    assert torch.equal(act(h), torch.where(h >= 0, h, slopes * h))


def test_gelu_is_the_tanh_approximation():
    act = GPT(config()).blocks[0].mlp.act
    h = torch.linspace(-4, 4, 101, dtype=torch.float64)
    tanh_gelu = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
    assert torch.allclose(act(h), tanh_gelu, atol=1e-15)


# --- gauge symmetry -------------------------------------------------------------------------

@pytest.mark.parametrize("kw", [dict(), dict(n_kv_head=2, rope=True, activation="prelu")])
def test_random_gauge_element_leaves_a_gpt_invariant(kw):
    torch.manual_seed(0)
    model = generic(GPT(config(**kw)).double())
    g = random_element(model, generator=torch.Generator().manual_seed(1))
    assert len(g.factors) >= 2 * 3  # QK, VO, permutation in each of the two layers
    assert invariance_error(g, model, tokens(0)) < 1e-12


def test_breaking_biases_break_the_gauge_but_not_the_key_bias_shift():
    torch.manual_seed(0)
    model = generic(GPT(config(symmetry_breaking="bqv", mu_v=0.5)).double()).eval()
    idx = tokens(0)
    assert invariance_error(random_element(model, generator=torch.Generator().manual_seed(1)),
                            model, idx) > 1e-3
    t = torch.randn(4, 8, dtype=torch.float64)
    shift = GaugeElement([KeyBiasShift(t, target="blocks.1.attn")])
    assert invariance_error(shift, model, idx) < 1e-12


def test_symmetry_breaking_biases_in_the_model():
    torch.manual_seed(0)
    plain, broken = GPT(config()), GPT(config(symmetry_breaking="bqv", mu_v=0.5))
    assert plain.num_params() == broken.num_params()  # buffers, not parameters
    assert "blocks.0.breaking.q_std" in broken.state_dict()
    broken.load_state_dict({**broken.state_dict(), **plain.state_dict()})
    idx = tokens(0)
    with torch.no_grad():
        train_1, train_2 = broken(idx)[0], broken(idx)[0]
        broken.eval()
        eval_1, eval_2 = broken(idx)[0], broken(idx)[0]
    assert not torch.equal(train_1, train_2)  # a fresh draw per forward
    assert torch.equal(eval_1, eval_2)  # means at inference
    assert not torch.allclose(eval_1, plain(idx)[0])


def test_each_layer_draws_its_own_bias():
    torch.manual_seed(0)
    model = GPT(config(symmetry_breaking="bq"))
    seen = []
    for block in model.blocks:
        block.attn.register_forward_pre_hook(
            lambda m, args, kwargs: seen.append(kwargs["query_shift"]), with_kwargs=True)
    model(tokens(0))
    assert len(seen) == 2 and seen[0].shape == (8,) and not torch.equal(seen[0], seen[1])


# --- Hugging Face equivalence ---------------------------------------------------------------

def hf_gpt2(**kw):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=V, n_positions=T, n_embd=32, n_layer=2, n_head=4,
                                  activation_function="gelu_new", resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                                  eos_token_id=0, **kw)
    torch.manual_seed(0)
    return generic(transformers.GPT2LMHeadModel(cfg), scale=0.1).eval()


def test_matches_huggingface_gpt2_logits():
    hf = hf_gpt2()
    model = GPT.from_huggingface(hf).eval()
    idx = tokens(0)
    with torch.no_grad():
        expected, actual = hf(idx).logits, model(idx)[0]
    assert (actual - expected).abs().max() < 1e-5
    assert expected.abs().max() > 0.5  # the comparison is not between near-zero numbers
    assert model.num_params() == sum(p.numel() for p in hf.parameters())


def test_huggingface_conversion_rejects_other_architectures():
    hf = hf_gpt2()
    hf.config.activation_function = "relu"
    with pytest.raises(ValueError, match="activation_function='relu'"):
        GPT.from_huggingface(hf)


# --- speed paths: bf16 autocast and torch.compile --------------------------------------------

def test_bf16_autocast():
    torch.manual_seed(0)
    model = GPT(config(symmetry_breaking="bqv", activation="prelu"))
    idx = tokens(0)
    loss32 = model(idx, idx)[1]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss = model(idx, idx)
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    assert abs(loss.item() - loss32.item()) < 0.05
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_compiles_without_graph_breaks():
    torch.manual_seed(0)
    model = GPT(config(symmetry_breaking="bqv", mu_v=0.5, activation="prelu")).train()
    idx = tokens(0)
    explanation = torch._dynamo.explain(model)(idx, idx)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    # fullgraph=True raises on any break; aot_eager also traces the backward pass
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    logits, loss = compiled(idx, idx)
    loss.backward()
    assert torch.isfinite(loss) and model.blocks[0].attn.W_Q.grad.abs().sum() > 0


# --- generation -----------------------------------------------------------------------------

def test_generate():
    torch.manual_seed(0)
    model = generic(GPT(config())).eval()
    idx = tokens(0, batch=2, length=4)
    out = model.generate(idx, T + 3, top_k=1)  # runs past block_size: the context is cropped
    assert out.shape == (2, 4 + T + 3) and torch.equal(out[:, :4], idx)
    greedy = model(out[:, :4])[0][:, -1].argmax(-1)
    assert torch.equal(out[:, 4], greedy)
    with pytest.raises(ValueError, match="temperature"):
        model.generate(idx, 1, temperature=0.0)


def test_generate_samples_in_eval_mode_and_restores_the_mode():
    torch.manual_seed(0)
    model = generic(GPT(config(symmetry_breaking="bqv")))  # training mode: biases drawn afresh
    idx = tokens(1, batch=2, length=4)
    sampled = model.generate(idx, 6, top_k=1)
    assert model.training
    assert torch.equal(sampled, model.eval().generate(idx, 6, top_k=1))
    with pytest.raises(ValueError, match="top_k must be None or a positive integer, got 0"):
        model.generate(idx, 1, top_k=0)


def test_eval_mode_gives_each_submodule_its_own_mode_back():
    model = GPT(config(symmetry_breaking="bqv"))
    model.blocks[0].eval()  # a mixed model: one block frozen in eval mode, the rest training
    before = [m.training for m in model.modules()]
    with eval_mode(model):
        assert not any(m.training for m in model.modules())
    assert [m.training for m in model.modules()] == before
    with pytest.raises(RuntimeError), eval_mode(model):
        raise RuntimeError  # restored on an error too
    assert [m.training for m in model.modules()] == before


def test_paper_prelu_init_draws_one_slope_per_unit():
    torch.manual_seed(0)
    model = GPT(GPTConfig(50, 16, 2, 2, 64, activation="prelu", prelu_init="paper"))
    slopes = torch.cat([b.mlp.act.weight.detach() for b in model.blocks])  # 2 x 256 units
    assert abs(slopes.mean().item() - 0.2) < 0.15 and abs(slopes.std().item() - 1.0) < 0.1
    with pytest.raises(ValueError, match="prelu_init"):
        GPTConfig(50, 16, 2, 2, 64, activation="prelu", prelu_init="zero")


def test_explicit_bias_draws_are_the_layers_own_draws():
    """draw_biases(generator) + forward(bias_draws=...) computes what the layers' own draws from
    the same random state compute; symmetric models refuse draws."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(50, 16, 3, 2, 16, symmetry_breaking="bqv", mu_v=0.5)).double()
    idx = tokens(0)[:, :16] % 50
    torch.manual_seed(7)
    own = model(idx)[0]
    draws = model.draw_biases(torch.Generator().manual_seed(7))
    assert draws[0].shape == (3, 8) and draws[1].shape == (3, 8)
    assert torch.equal(model(idx, bias_draws=draws)[0], own)
    symmetric = GPT(GPTConfig(50, 16, 1, 2, 16))
    assert symmetric.draw_biases() is None
    with pytest.raises(ValueError, match="symmetric model"):
        symmetric(idx, bias_draws=draws)
    for wrong in ((draws[0][0], draws[1]), (draws[0][:2], draws[1][:2]),
                  (torch.cat([draws[0], draws[0][:1]]), draws[1])):  # one layer, too few, too many
        with pytest.raises(ValueError, match=r"\[n_layer, head_size\] = \[3, 8\]"):
            model(idx, bias_draws=wrong)


def test_bias_draws_must_match_the_models_biases():
    """A query draw [n_layer, head_size], and a value draw of that shape exactly for "bqv"
    (None for "bq"): no silent use, drop or broadcast of a draw."""
    torch.manual_seed(0)
    bq = GPT(GPTConfig(50, 16, 3, 2, 16, symmetry_breaking="bq")).double().eval()
    bqv = GPT(GPTConfig(50, 16, 3, 2, 16, symmetry_breaking="bqv", mu_v=0.5)).double().eval()
    idx = tokens(0)[:, :16] % 50
    q, v = bqv.draw_biases(torch.Generator().manual_seed(7))
    cases = [
        (bq, (q, v), "'bq' model has no value bias"),  # was used as a value bias
        (bqv, (q, None), "needs a value draw"),  # was dropped
        (bqv, (q[:, :1], v), r"query draw of shape \[n_layer, head_size\] = \[3, 8\]"),  # width 1
        (bqv, (q[:, :5], v), r"got \(3, 5\)"),  # a bare RuntimeError before
        (bqv, (q[:, None].expand(3, 2, 8), v), r"got \(3, 2, 8\)"),  # per head
        (bqv, (q, v[:, :5]), "needs a value draw"),
        (bq, (None, None), "needs a query draw"),  # a TypeError before
        (bq, q, "must be a pair"),
        (bqv, (q, v, v), "must be a pair"),
    ]
    for model, draws, message in cases:
        with pytest.raises(ValueError, match=message):
            model(idx, bias_draws=draws)
    assert bq(idx, bias_draws=(q, None))[0].shape == (*idx.shape, 50)
    assert bqv(idx, bias_draws=[q, torch.zeros_like(v)])[0].shape == (*idx.shape, 50)


def test_per_tensor_ecd_over_gpt2_tensors_follows_a_fused_c_attn_model():
    """Our per-head GPT under ECD's per-tensor projection over :meth:`GPT.gpt2_tensors` follows,
    to 1e-10 in float64 over 50 steps, a GPT-2 written with fused ``c_attn`` layers (Hugging
    Face's) under a plain per-tensor ECD written out here, one dot product per HF tensor."""
    from gaugebook.optim import ECD

    hf = hf_gpt2().double().train()
    model = GPT.from_huggingface(hf).double().train()
    idx = tokens(1)
    lr, eta, F0 = 0.1, 10.0, -2.0
    params = [p for p in hf.parameters()]
    d = sum(p.numel() for p in params)
    dt, kappa = lr / math.sqrt(eta), eta / 2 * d / (d - 1)

    def loss_of(logits):
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), idx[:, 1:].flatten())

    names = dict(model.named_parameters())
    blocks = [[names[n] for n in group] for group in model.gpt2_tensors()]
    assert len(blocks) == len(params)  # one block per GPT-2 tensor
    opt = ECD(model.parameters(), lr=lr, eta=eta, F0=F0, projection="per_tensor", blocks=blocks)

    def closure():
        opt.zero_grad()
        loss = loss_of(model(idx)[0])
        loss.backward()
        return loss
    v = None
    for step in range(50):
        loss = loss_of(hf(idx).logits)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            if v is None:
                norm = torch.sqrt(sum((g * g).sum() for g in grads))
                v = [-g / norm for g in grads]
            c = kappa * dt / (loss.item() - F0)
            v = [vi - c * (gi - vi * (vi * gi).sum()) for vi, gi in zip(v, grads)]
            for p, vi in zip(params, v):
                p.add_(dt * vi)
            speed = torch.sqrt(sum((vi * vi).sum() for vi in v))
            v = [vi / speed for vi in v]
        opt.step(closure)
    expected = GPT.from_huggingface(hf).double()
    for (name, ours), theirs in zip(model.named_parameters(), expected.parameters()):
        assert (ours - theirs).abs().max() < 1e-10, name
    assert opt.steps == 50
    # the partition matters: the global projection, or one block per per-head tensor, goes elsewhere
    for kw in (dict(projection="global"), dict(projection="per_tensor")):
        other = GPT.from_huggingface(hf_gpt2()).double().train()
        opt = ECD(other.parameters(), lr=lr, eta=eta, F0=F0, **kw)
        for _ in range(50):
            opt.step(lambda: (opt.zero_grad(), (loss := loss_of(other(idx)[0])).backward(), loss)[2])
        gap = max((a - b).abs().max().item() for a, b in zip(other.parameters(),
                                                            expected.parameters()))
        assert gap > 1e-6, kw


def test_activations_are_what_the_modules_see_in_eval_mode():
    """Inputs or outputs of chosen submodules, in the order given, with the mean biases of eval
    mode; the modes and hooks are left as they were."""
    from gaugebook.gpt import activations

    torch.manual_seed(0)
    model = GPT(config(symmetry_breaking="bqv", mu_v=0.5)).train()
    idx = torch.randint(0, V, (2, T))
    fc = [block.mlp.c_fc for block in model.blocks]
    inputs = activations(model, idx, [model.blocks[1].ln_2, model.blocks[0].ln_2])
    outputs = activations(model, idx, fc, output=True)
    assert model.training and all(not m._forward_hooks and not m._forward_pre_hooks
                                  for m in model.modules())
    model.eval()
    assert torch.equal(outputs[1], fc[1](model.blocks[1].ln_2(inputs[0])))
    assert torch.equal(activations(model, idx, fc, output=True)[0], outputs[0])
