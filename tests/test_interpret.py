"""The query-offset factor, key alignment and their behaviour under the QK gauge."""
import copy

import pytest
import torch

from gaugebook.attention import MultiHeadAttention
from gaugebook.data import Category
from gaugebook.gpt import GPT, GPTConfig
from gaugebook.interpret import alignment_scores, attention_inputs, by_category, \
    key_alignment, key_log_factor, layer_keys, log_factors, query_offset, reference_vectors, \
    centred_on_vocabulary, reweight, static_key_cosines, structure_score
from gaugebook.linalg import random_gl

F64 = torch.float64
V, T = 20, 7


def gpt(breaking="bq", seed=0, **kw):
    """A small float64 GPT with generic weights (biases and LayerNorm non-trivial)."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(V, T, 2, 2, 8, symmetry_breaking=breaking, **kw)).double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model.eval()


def tokens(seed=1, batch=3):
    return torch.randint(0, V, (batch, T), generator=torch.Generator().manual_seed(seed))


def test_reweight_is_the_pattern_with_the_offset_added():
    g = torch.Generator().manual_seed(0)
    attn = MultiHeadAttention(6, 2, 3, bias=True, dtype=F64, generator=g)
    x = torch.randn(2, 5, 6, generator=g, dtype=F64)
    shift = torch.randn(2, 3, generator=g, dtype=F64)  # one offset per head
    _, k, _ = attn.project(x)  # (B, H, T, dk)
    predicted = reweight(attn.attention_pattern(x), key_log_factor(k, shift))
    actual = attn.attention_pattern(x, query_shift=shift)
    assert (predicted - actual).abs().max() < 1e-14
    assert (predicted.triu(1) == 0).all()  # the causal mask survives
    with pytest.raises(ValueError, match="keys"):
        reweight(attn.attention_pattern(x), torch.zeros(2, 2, 4, dtype=F64))
    with pytest.raises(ValueError, match="width"):
        key_log_factor(k, torch.zeros(4, dtype=F64))


@pytest.mark.parametrize("breaking", [None, "bqv"])
def test_query_offset_is_the_token_independent_part_of_the_query(breaking):
    model = gpt(breaking)
    for block, x in zip(model.blocks, attention_inputs(model, tokens())):
        shift = None if block.breaking is None else block.breaking()[0]  # eval: the mean
        q = block.attn.project(x, query_shift=shift)[0]  # (B, H, T, dk)
        linear = torch.einsum("btd,hde->bhte", x - block.ln_1.bias, block.attn.W_Q)
        assert (q - linear - query_offset(block)[:, None]).abs().max() < 1e-13


def test_keys_and_inputs_shapes_and_mode():
    model = gpt("bq").train()
    idx = tokens()
    assert len(attention_inputs(model, idx)) == 2 and model.training  # mode restored
    assert layer_keys(model, idx).shape == (2, 2, 3, T, 4)
    assert key_alignment(model, idx).shape == (2, 2, 3, T)
    f = log_factors(model, idx)
    assert f.shape == (2, 2, 3, T) and f.mean(dim=(2, 3)).abs().max() < 1e-12  # centred


def test_grouped_keys_are_repeated_to_their_query_heads():
    model = gpt(None, n_kv_head=1)
    keys = layer_keys(model, tokens())
    assert keys.shape[1] == 2 and (keys[:, 0] == keys[:, 1]).all()


def gauge_transformed(model, seed=3):
    """QK transform M in every layer, with the learned b_Q absorbing the unlearned mean:
    W_Q -> W_Q M, b_Q -> (b_Q + E[b_Q]) M - E[b_Q], W_K -> W_K M^-T, b_K -> b_K M^-T."""
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for block in out.blocks:
            a, s = block.attn, block.breaking.q_mean
            M = torch.stack([random_gl(a.d_head, 5.0, generator=g) for _ in range(a.n_heads)])
            Minv_T = torch.linalg.inv(M).transpose(-1, -2)
            a.W_Q.copy_(a.W_Q @ M)
            a.b_Q.copy_(torch.einsum("he,hef->hf", a.b_Q + s, M) - s)
            a.W_K.copy_(a.W_K @ Minv_T)
            a.b_K.copy_(torch.einsum("he,hef->hf", a.b_K, Minv_T))
    return out


def test_effective_log_factor_is_gauge_invariant_and_the_cosine_is_not():
    model, idx = gpt("bq"), tokens()
    moved = gauge_transformed(model)
    assert (model(idx)[0] - moved(idx)[0]).abs().max() < 1e-11  # same function at inference
    effective = log_factors(model, idx, center=False)
    assert (effective - log_factors(moved, idx, center=False)).abs().max() < 1e-10
    mean_part = log_factors(model, idx, "mean")
    assert (mean_part - log_factors(moved, idx, "mean")).abs().max() > 1e-2
    assert (key_alignment(model, idx) - key_alignment(moved, idx)).abs().max() > 1e-2


def test_references():
    model, symmetric = gpt("bq"), gpt(None)
    assert (reference_vectors(model, "mean") == 0.5).all()
    with pytest.raises(ValueError, match="no E\\[b_Q\\]"):
        reference_vectors(symmetric, "mean")
    fixed = reference_vectors(symmetric, torch.full((4,), 0.5, dtype=F64))
    assert fixed.shape == (2, 2, 4)
    with pytest.raises(ValueError, match="shape"):
        reference_vectors(symmetric, torch.ones(3))
    with pytest.raises(ValueError, match="reference must be"):
        reference_vectors(symmetric, "keys")
    with pytest.raises(TypeError):
        reference_vectors(MultiHeadAttention(4, 1, 4), "mean")
    with pytest.raises(ValueError, match="RoPE"):
        reference_vectors(GPT(GPTConfig(V, T, 1, 2, 8, rope=True)), "effective")


def test_by_category_and_structure_score():
    values = torch.arange(12.0).reshape(1, 1, 2, 6)  # (L, H, B, T)
    categories = torch.tensor([[0, 1, 8, 4, 4, 2], [8, 0, 4, 4, 4, 4]])
    table = by_category(values, categories)
    assert set(table) == {Category.SENTENCE_START, Category.PUNCTUATION, Category.QUESTION_WORD,
                          Category.CONTENT_WORD, Category.NOISE}
    assert table[Category.SENTENCE_START].item() == (0 + 7) / 2
    assert table[Category.NOISE].item() == (2 + 6) / 2
    expected = ((0 + 7) / 2 + 1 + 5) / 3 - 4
    assert structure_score(table).item() == pytest.approx(expected)
    del table[Category.NOISE]
    with pytest.raises(ValueError, match="NOISE"):
        structure_score(table)
    with pytest.raises(ValueError, match="categories"):
        by_category(values, categories[:, :5])


def test_category_means_centred_on_the_vocabulary_are_those_of_centred_scores():
    token_categories = torch.tensor([4, 4, 4, 8, 0, 1, 4, 8, 2, 4])  # (V,): five categories
    score = torch.randn(10, generator=torch.Generator().manual_seed(1), dtype=torch.float64)

    def means(values):  # {name: mean over the category's words}
        return {c.name.lower(): v.item()
                for c, v in by_category(values[None], token_categories[None]).items()}

    centred = centred_on_vocabulary(means(score), token_categories)
    expected = means(score - score.mean())
    assert centred.keys() == expected.keys()
    assert all(centred[c] == pytest.approx(expected[c], abs=1e-14) for c in expected)
    incomplete = means(score)
    del incomplete["noise"]
    with pytest.raises(ValueError, match="noise"):
        centred_on_vocabulary(incomplete, token_categories)


@pytest.mark.parametrize("n_kv_head", [2, 1])
def test_static_keys_are_embedding_rows_times_the_key_weights(n_kv_head):
    model = gpt("bqv", n_kv_head=n_kv_head)
    cos = static_key_cosines(model)  # (L, H, V)
    assert cos.shape == (2, 2, V)
    for layer, block in enumerate(model.blocks):
        for head in range(2):
            W_K = block.attn.W_K[head // block.attn.group_size]  # (D, dk)
            key = model.wte.weight[5] @ W_K
            expected = torch.dot(key, block.breaking.q_mean) / (key.norm()
                                                                * block.breaking.q_mean.norm())
            assert abs(cos[layer, head, 5] - expected) < 1e-12
    positions = static_key_cosines(model, rows=model.wpe.weight)
    assert positions.shape == (2, 2, T)
    with pytest.raises(ValueError, match="no E\\[b_Q\\]"):
        static_key_cosines(gpt(None))
    u = torch.randn(4, dtype=F64)  # a fixed direction works for a symmetric model
    assert static_key_cosines(gpt(None), u).shape == (2, 2, V)


def test_alignment_scores_are_the_two_structure_scores():
    model, idx = gpt("bq"), tokens(batch=6)
    # every category of the scores present, in the batch and in the vocabulary
    categories = torch.arange(idx.numel()).reshape(idx.shape) % len(Category)
    vocabulary = torch.arange(V) % len(Category)
    scores = alignment_scores(model, idx, categories, vocabulary)
    in_context = structure_score(by_category(log_factors(model, idx), categories)).mean()
    static = structure_score(by_category(static_key_cosines(model).mean((0, 1))[None],
                                         vocabulary[None]))
    assert scores["in_context"] == pytest.approx(in_context.item())
    assert scores["static"] == pytest.approx(static.item())
    # per category: the mean cosines the static score is made of (function words included)
    per = scores["static_by_category"]
    assert set(per) == {c.name.lower() for c in Category}
    assert per["sentence_start"] == pytest.approx(
        static_key_cosines(model).mean((0, 1))[vocabulary == 0].mean().item())
    # the null band: random directions, a fixed seed, so one band per model and repeatable
    null = scores["static_null"]
    assert null["low"] <= null["mean"] <= null["high"] and null["high"] - null["low"] > 0
    assert alignment_scores(model, idx, categories, vocabulary)["static_null"] == null
    symmetric = alignment_scores(gpt(None), idx, categories, vocabulary)
    assert symmetric["static"] is None and symmetric["static_by_category"] is None
    assert symmetric["static_null"]["low"] < symmetric["static_null"]["high"]
    with pytest.raises(ValueError, match="no tokens of"):
        alignment_scores(model, idx, torch.zeros_like(idx), vocabulary)
