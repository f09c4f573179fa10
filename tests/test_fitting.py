"""The chapters' training loop (gaugebook.fitting.fit)."""
import pytest
import torch

from gaugebook.fitting import fit, random_token_batches
from gaugebook.gpt import GPT, GPTConfig
from gaugebook.optim import ECD


def tiny_gpt(seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(16, 8, 1, 2, 8)).double()


def batch(step):
    g = torch.Generator().manual_seed(step)
    idx = torch.randint(0, 16, (4, 9), generator=g)
    return idx[:, :-1], idx[:, 1:]


def test_fit_is_the_hand_written_loop():
    """SGD with momentum through fit equals the plain loop exactly, loss by loss."""
    model, reference = tiny_gpt(), tiny_gpt()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = fit(model, opt, batch, 5)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    expected = []
    for t in range(5):
        x, y = batch(t)
        ref_opt.zero_grad()
        value = reference(x, y)[1]
        value.backward()
        ref_opt.step()
        expected.append(value.item())
    assert losses == expected
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p, q)


def test_ecd_an_iterable_a_custom_loss_and_after_step():
    mlp = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    x, y = torch.randn(16, 3), torch.randn(16, 1)
    opt = ECD(mlp.parameters(), lr=0.1, eta=2.0, F0=-1.0)
    seen = []
    losses = fit(mlp, opt, [(x, y)] * 3, 3, loss=lambda m, x, y: ((m(x) - y) ** 2).mean(),
                 after_step=lambda t, m, o: seen.append((t, m is mlp, o.steps)))
    assert len(losses) == 3 and seen == [(0, True, 1), (1, True, 2), (2, True, 3)]


def test_lbfgs_records_the_first_loss_of_its_step():
    model = torch.nn.Linear(2, 1)
    x, y = torch.randn(8, 2), torch.randn(8, 1)
    opt = torch.optim.LBFGS(model.parameters(), max_iter=5)
    losses = fit(model, opt, lambda t: (x, y), 2, loss=lambda m, x, y: ((m(x) - y) ** 2).mean())
    assert losses[1] < losses[0]


def test_a_stream_of_corpus_batches_is_accepted():
    """DefaultCorpus.batches yields Batch 3-tuples, which fit used to fail to unpack."""
    from gaugebook.data import DefaultCorpus

    corpus = DefaultCorpus(0)
    torch.manual_seed(0)
    model, reference = (GPT(GPTConfig(corpus.vocab_size, 8, 1, 1, 8)) for _ in range(2))
    reference.load_state_dict(model.state_dict())
    losses = fit(model, torch.optim.SGD(model.parameters(), lr=0.1), corpus.batches(2, 8), 2)
    pairs = fit(reference, torch.optim.SGD(reference.parameters(), lr=0.1),
                lambda t: corpus.batch(t, 2, 8)[:2], 2)
    assert losses == pairs
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"batch 0 must be an \(x, y\) pair or a Batch, got a "
                                         r"tuple of length 3"):
        fit(model, opt, [tuple(corpus.batch(0, 2, 8))], 1)
    with pytest.raises(ValueError, match="got a Tensor"):
        fit(model, opt, lambda t: torch.zeros(()), 1)
    with pytest.raises(ValueError, match=r"got a Tensor of shape \(2, 8\)"):  # not x, y = rows
        fit(model, opt, [corpus.batch(0, 2, 8)[0]], 1)


def test_bad_arguments_are_refused():
    model = tiny_gpt()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for steps in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="positive integer"):
            fit(model, opt, batch, steps)
    with pytest.raises(TypeError, match="step"):
        fit(model, object(), batch, 1)
    with pytest.raises(TypeError, match="batches must be"):
        fit(model, opt, 3, 1)
    with pytest.raises(ValueError, match="ran out after 1 of 2"):
        fit(model, opt, [batch(0)], 2)


def test_random_token_batches_are_the_draws_in_step_order_whatever_the_order_asked():
    """Step t's batch is the t-th draw of the seeded generator, split into inputs and next-token
    targets, and asking for steps out of order (or twice) returns the same tensors."""
    batches = random_token_batches(32, 4, 8, seed=1)
    late = batches(2)
    first, again = batches(0), batches(2)
    generator = torch.Generator().manual_seed(1)
    draws = [torch.randint(0, 32, (4, 9), generator=generator) for _ in range(3)]
    assert torch.equal(first[0], draws[0][:, :-1]) and torch.equal(first[1], draws[0][:, 1:])
    assert torch.equal(late[0], draws[2][:, :-1]) and torch.equal(again[1], late[1])
    assert late[0].shape == late[1].shape == (4, 8) and int(late[0].max()) < 32
    assert not torch.equal(random_token_batches(32, 4, 8, seed=2)(0)[0], first[0])
    with pytest.raises(ValueError, match="vocab_size must be a positive integer"):
        random_token_batches(0, 4, 8)
    with pytest.raises(ValueError, match="step must be a non-negative integer"):
        batches(-1)


def test_train_small_gpt_is_chapter_18s_recipe_written_out():
    """The library recipe equals the hand-written one (seed, model, float64, optimizer, fit)
    exactly, for ECD and AdamW; the model comes back in eval mode, in float64, and torch's global
    generator is left as the caller had it."""
    from gaugebook.data import DefaultCorpus
    from gaugebook.fitting import SMALL_GPT_HYPERPARAMETERS, SMALL_GPT_SIZE, train_small_gpt
    from gaugebook.optim import make_optimizer

    corpus = DefaultCorpus(seed=0)
    for name, breaking in (("ecd", "bqv"), ("adamw", None)):
        torch.manual_seed(3)
        reference = GPT(GPTConfig(corpus.vocab_size, 32, 2, 2, 32, activation="prelu",
                                  symmetry_breaking=breaking)).double()
        opt = make_optimizer(name, reference.parameters(), **SMALL_GPT_HYPERPARAMETERS[name])
        fit(reference, opt, lambda t: corpus.batch(t, 4, 32)[:2], 3)
        outer = torch.get_rng_state()
        model = train_small_gpt(corpus, name, breaking, steps=3, batch_size=4, seed=3)
        assert torch.equal(torch.get_rng_state(), outer)  # the caller's generator is untouched
        assert not model.training and model.config.n_layer == SMALL_GPT_SIZE["n_layer"]
        for (key, p), q in zip(model.state_dict().items(), reference.state_dict().values()):
            assert p.dtype == torch.float64 and torch.equal(p, q), key


def test_train_small_gpt_without_biases_and_bad_names():
    from gaugebook.data import DefaultCorpus
    from gaugebook.fitting import SMALL_GPT_HYPERPARAMETERS, train_small_gpt

    corpus = DefaultCorpus(seed=0)
    plain = train_small_gpt(corpus, "ecd", "bqv", steps=1, batch_size=2, bias=False)
    names = [name.rsplit(".", 1)[-1] for name, _ in plain.named_parameters()]
    assert "W_Q" in names and not {"bias", "b_Q", "b_K", "b_V", "b_O"} & set(names)
    with pytest.raises(ValueError, match="optimizer_name must be one of"):
        train_small_gpt(corpus, "sgd", steps=1)
    with pytest.raises(TypeError):  # the settings cannot be changed by accident
        SMALL_GPT_HYPERPARAMETERS["ecd"]["lr"] = 2.0
