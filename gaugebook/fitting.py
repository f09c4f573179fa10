"""The chapters' small training loops in one place: :func:`fit`, the random-token batches
(:func:`random_token_batches`) on which the chapters watch an optimizer's conserved quantities,
and the small GPT that chapters 18 and 20 train on the default corpus (:func:`train_small_gpt`).

The experiment's trainer (:mod:`gaugebook.training`) adds checkpoints, batching and result files;
a chapter that trains a small model for a few hundred steps on the CPU needs only the loop, and
the loop is written here once.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from types import MappingProxyType

import torch

from gaugebook.checks import check_positive_ints
from gaugebook.data.stream import Batch
from gaugebook.experiment import HP as TRAINER_HP
from gaugebook.gpt import GPT, GPTConfig
from gaugebook.optim import make_optimizer

__all__ = ["fit", "random_token_batches", "train_small_gpt", "SMALL_GPT_SIZE",
           "SMALL_GPT_HYPERPARAMETERS"]

#: The shape of :func:`train_small_gpt`'s model (GPTConfig fields).
SMALL_GPT_SIZE = MappingProxyType(dict(block_size=32, n_layer=2, n_head=2, n_embd=32))
#: The settings of its optimizers, ECD as the trainer's defaults (``gaugebook.experiment.HP``)
#: and AdamW with torch's default weight decay.
SMALL_GPT_HYPERPARAMETERS = MappingProxyType({
    "ecd": MappingProxyType(dict(TRAINER_HP["ecd"])),
    "adamw": MappingProxyType(dict(lr=3e-3, betas=(0.9, 0.95), weight_decay=0.01)),
})


def _gpt_loss(model, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return model(x, y)[1]  # a GPT returns (logits, mean cross-entropy)


def _pair(batch, t: int) -> tuple:
    """Step ``t``'s ``(x, y)``: ``batch`` itself, or a :class:`Batch`'s inputs and targets."""
    if isinstance(batch, Batch):
        return batch.inputs, batch.targets
    if torch.is_tensor(batch):  # unpacking would split it along its first axis
        raise ValueError(f"batch {t} must be an (x, y) pair or a Batch, got a Tensor of shape "
                         f"{tuple(batch.shape)}")
    try:
        x, y = batch
    except (TypeError, ValueError):
        size = f" of length {len(batch)}" if isinstance(batch, (tuple, list)) else ""
        raise ValueError(f"batch {t} must be an (x, y) pair or a Batch, got a "
                         f"{type(batch).__name__}{size}") from None
    return x, y


def fit(model: torch.nn.Module, optimizer, batches: Callable[[int], tuple] | Iterable,
        steps: int, *, loss: Callable | None = None,
        after_step: Callable[[int, torch.nn.Module, object], None] | None = None) -> list[float]:
    """Train ``model`` in place for ``steps`` optimizer steps; return the loss of each step (at
    the parameters the step starts from).

    Step ``t = 0, ..., steps - 1`` takes its batch ``x, y = batches(t)`` (a callable of the step,
    so that a step's data do not depend on what ran before) or the next item of ``batches`` (an
    iterable, such as :meth:`~gaugebook.data.DefaultCorpus.batches`); a batch is an ``(x, y)``
    pair or a :class:`~gaugebook.data.Batch` (its ``inputs`` and ``targets``). It calls
    ``optimizer.step(closure)`` with the closure

    .. math::
        \\text{zero the gradients}, \\quad L = \\ell(\\theta; x, y), \\quad
        \\nabla_\\theta L \\text{ by backward}, \\quad \\text{return } L,

    the form every ``torch.optim`` optimizer accepts and :class:`~gaugebook.optim.ECD` needs (it
    uses the loss as well as the gradient). ``loss(model, x, y)`` is :math:`\\ell` (default
    ``model(x, y)[1]``, a :class:`~gaugebook.gpt.GPT`'s mean cross-entropy); ``after_step(t,
    model, optimizer)`` runs after each step, to record what a chapter follows (charges, the
    path, the parameters).
    """
    check_positive_ints(steps=steps)
    if not hasattr(optimizer, "step") or not hasattr(optimizer, "zero_grad"):
        raise TypeError(f"optimizer must have step() and zero_grad(), got "
                        f"{type(optimizer).__name__}")
    if not callable(batches) and not isinstance(batches, Iterable):
        raise TypeError(f"batches must be a callable of the step or an iterable of (x, y), got "
                        f"{type(batches).__name__}")
    loss = loss or _gpt_loss
    stream = None if callable(batches) else iter(batches)
    losses = []
    for t in range(steps):
        try:
            x, y = _pair(batches(t) if stream is None else next(stream), t)
        except StopIteration:
            raise ValueError(f"batches ran out after {t} of {steps} steps") from None

        evaluated = []

        def closure():
            optimizer.zero_grad()
            value = loss(model, x, y)
            value.backward()
            evaluated.append(value.detach())
            return value

        optimizer.step(closure)
        losses.append(float(evaluated[0]))  # the loss at the step's start (LBFGS evaluates more)
        if after_step is not None:
            after_step(t, model, optimizer)
    return losses


def random_token_batches(vocab_size: int, batch_size: int, block_size: int, *,
                         seed: int = 0) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
    """Batches of uniformly random tokens for :func:`fit`, as a function of the step.

    Step ``t``'s batch is the ``t``-th draw of ``randint(0, vocab_size, (batch_size, block_size
    + 1))`` from a generator seeded with ``seed``, split into inputs ``x = idx[:, :-1]`` and
    next-token targets ``y = idx[:, 1:]`` (both ``[batch_size, block_size]``). Draws are made in
    step order and kept, so ``batches(t)`` is the same tensor pair whenever it is asked for.
    Random tokens carry no structure to learn; what a chapter watches on them (charges, balances)
    follows from the symmetries alone.
    """
    check_positive_ints(vocab_size=vocab_size, batch_size=batch_size, block_size=block_size)
    generator = torch.Generator().manual_seed(seed)
    drawn: list[torch.Tensor] = []  # drawn[t]: step t's tokens [batch_size, block_size + 1]

    def batches(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        if type(step) is not int or step < 0:
            raise ValueError(f"step must be a non-negative integer, got {step!r}")
        while len(drawn) <= step:
            drawn.append(torch.randint(0, vocab_size, (batch_size, block_size + 1),
                                       generator=generator))
        return drawn[step][:, :-1], drawn[step][:, 1:]

    return batches


def train_small_gpt(corpus, optimizer_name: str = "ecd", breaking: str | None = None, *,
                    steps: int = 200, batch_size: int = 8, seed: int = 0, bias: bool = True,
                    dtype: torch.dtype = torch.float64) -> GPT:
    """A small PReLU :class:`~gaugebook.gpt.GPT` (:data:`SMALL_GPT_SIZE`) trained on ``corpus``
    (a :class:`~gaugebook.data.DefaultCorpus`); returned in eval mode.

    The recipe of chapter 18's live models: seed a fork of torch's generator with ``seed``
    (the caller's generator is left as it was: :func:`torch.random.fork_rng`), build the
    model (``symmetry_breaking=breaking``, learned biases iff ``bias``) and cast it to
    ``dtype``, make ``optimizer_name``'s optimizer with :data:`SMALL_GPT_HYPERPARAMETERS`, and
    :func:`fit` it on the corpus' training batches ``corpus.batch(t, batch_size, block)``
    (``block`` of :data:`SMALL_GPT_SIZE`) for ``t = 0, ..., steps - 1``. The default float64
    keeps the trained model the same on every processor: float32 round-off differs between CPU
    kernels and grows in training.
    """
    if optimizer_name not in SMALL_GPT_HYPERPARAMETERS:
        raise ValueError(f"optimizer_name must be one of {sorted(SMALL_GPT_HYPERPARAMETERS)}, "
                         f"got {optimizer_name!r}")
    config = GPTConfig(corpus.vocab_size, **SMALL_GPT_SIZE, activation="prelu",
                       symmetry_breaking=breaking, bias=bias)
    block = SMALL_GPT_SIZE["block_size"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT(config).to(dtype)
        optimizer = make_optimizer(optimizer_name, model.parameters(),
                                   **SMALL_GPT_HYPERPARAMETERS[optimizer_name])
        fit(model, optimizer, lambda t: corpus.batch(t, batch_size, block), steps)
    return model.eval()
