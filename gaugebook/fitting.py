"""The chapters' small training loops in one place: :func:`fit`, and the random-token batches
(:func:`random_token_batches`) on which the chapters watch an optimizer's conserved quantities.

The experiment's trainer (:mod:`gaugebook.training`) adds checkpoints, batching and result files;
a chapter that trains a small model for a few hundred steps on the CPU needs only the loop, and
the loop is written here once.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from gaugebook.data.stream import Batch

__all__ = ["fit", "random_token_batches"]


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
    if type(steps) is not int or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
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
    for name, value in (("vocab_size", vocab_size), ("batch_size", batch_size),
                        ("block_size", block_size)):
        if type(value) is not int or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
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
