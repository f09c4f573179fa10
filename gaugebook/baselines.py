"""The baseline optimizers of the experiment (chapters 15-17), built by name by
:func:`gaugebook.optim.make_optimizer`: AdamW, SGD with Nesterov momentum, Muon (its matrices
one head at a time, the rest with AdamW, driven as one :class:`MultiOptimizer`) and SOAP."""
from __future__ import annotations

from typing import Callable

import torch
from torch.optim import Optimizer

__all__ = ["MultiOptimizer", "HEAD_MATRICES", "adamw", "sgdm", "muon", "soap"]


class MultiOptimizer:
    """Several optimizers over disjoint parameters, driven as one (e.g. Muon + AdamW).

    ``step(closure)`` evaluates the closure once and then steps every optimizer;
    ``param_groups`` and ``state`` are the union of theirs; ``state_dict`` nests theirs.
    torch's learning-rate schedulers accept only a ``torch.optim.Optimizer``: schedule each of
    ``optimizers`` (``[LambdaLR(o, f) for o in opt.optimizers]``), or set ``group["lr"]`` in
    :attr:`param_groups`, which are the inner optimizers' own dicts.
    """

    def __init__(self, *optimizers: Optimizer):
        if not optimizers:
            raise ValueError("MultiOptimizer needs at least one optimizer")
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict]:
        """The parameter groups of every wrapped optimizer, in order."""
        return [group for opt in self.optimizers for group in opt.param_groups]

    @property
    def state(self) -> dict:
        """``{parameter: state}`` merged over the wrapped optimizers."""
        return {p: s for opt in self.optimizers for p, s in opt.state.items()}

    def step(self, closure: Callable[[], torch.Tensor] | None = None):
        """One step of every wrapped optimizer; ``closure`` (optional) is evaluated once, here, and
        its loss returned."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for opt in self.optimizers:
            opt.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """``zero_grad`` of every wrapped optimizer."""
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        """``{"optimizers": [state_dict of each wrapped optimizer]}``."""
        return {"optimizers": [opt.state_dict() for opt in self.optimizers]}

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a :meth:`state_dict` of a ``MultiOptimizer`` over the same optimizers."""
        states = state_dict["optimizers"]
        if len(states) != len(self.optimizers):
            raise ValueError(f"state_dict holds {len(states)} optimizers, this MultiOptimizer has "
                             f"{len(self.optimizers)}")
        for opt, state in zip(self.optimizers, states):
            opt.load_state_dict(state)


def _is_embedding(name: str) -> bool:
    return any(key in name for key in ("wte", "wpe", "embed", "lm_head"))


#: Per-head attention weights ``[heads, ., .]`` that Muon takes one head at a time: each head's
#: slice is a matrix acting on the residual stream (W_Q, W_K, W_V, the RoPE gates W_GQ, W_GK)
#: or writing into it (W_O).
HEAD_MATRICES = ("W_Q", "W_K", "W_V", "W_O", "W_GQ", "W_GK")


def _muon_matrices(name: str, p: torch.Tensor) -> list[torch.Tensor]:
    """The matrices Muon orthogonalises in parameter ``name``: a weight matrix of a linear layer
    (2-D, not an embedding), or every head's slice of a per-head attention weight (3-D), as
    leaf tensors sharing ``p``'s memory; none (``[]``) for the rest (biases, gains, embeddings)."""
    leaf = name.rsplit(".", 1)[-1]
    if p.ndim == 3 and leaf in HEAD_MATRICES:
        return [torch.nn.Parameter(p.data[h]) for h in range(p.shape[0])]
    if p.ndim == 2 and leaf == "weight" and not _is_embedding(name):
        return [p]
    return []


class _HeadMuon(torch.optim.Muon):
    """``torch.optim.Muon`` over 2-D matrices, some of them slices of 3-D parameters
    (``pairs``: each parameter with its matrices): before each step the slices get views of their
    parameters' gradients, and Muon's in-place update of a slice is the update of its
    parameter."""

    def __init__(self, pairs: list[tuple[torch.Tensor, list[torch.Tensor]]], **muon_hp):
        super().__init__([m for _, ms in pairs for m in ms], **muon_hp)
        self.pairs = pairs

    @torch.no_grad()
    def step(self, closure=None):
        for p, matrices in self.pairs:
            if matrices[0] is not p:
                for h, m in enumerate(matrices):
                    m.grad = None if p.grad is None else p.grad[h]
        return super().step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        for p, _ in self.pairs:
            p.grad = None


def muon(params, lr, *, weight_decay=0.1, betas=(0.9, 0.95), **muon_hp) -> MultiOptimizer:
    """Muon for the weight matrices (per head for attention), AdamW (same lr and weight decay)
    for the rest; parameters are routed by name, so they must come with their names."""
    params = list(params)
    if any(isinstance(p, dict) for p in params):
        raise ValueError("make_optimizer('muon', ...) takes (name, parameter) pairs, not "
                         "parameter groups")
    if not all(isinstance(p, tuple) and len(p) == 2 for p in params):
        raise ValueError("Muon routes parameters by their role: pass (name, parameter) pairs, "
                         "e.g. model.named_parameters()")
    routed = [(p, _muon_matrices(n, p)) for n, p in params]
    muon_hp.setdefault("adjust_lr_fn", "match_rms_adamw")
    optimizers = []
    if any(ms for _, ms in routed):
        optimizers.append(_HeadMuon([(p, ms) for p, ms in routed if ms], lr=lr,
                                      weight_decay=weight_decay, **muon_hp))
    others = [p for p, ms in routed if not ms]
    if others:
        optimizers.append(adamw(others, lr=lr, weight_decay=weight_decay, betas=betas))
    return MultiOptimizer(*optimizers)


def _tensors(params) -> list[torch.Tensor]:
    """The tensors in a list of parameters, ``(name, parameter)`` pairs or parameter groups."""
    out = []
    for item in params:
        items = item["params"] if isinstance(item, dict) else [item]
        out += [p[1] if isinstance(p, tuple) else p for p in items]
    return out


def adamw(params, lr, **hp) -> torch.optim.AdamW:
    """``torch.optim.AdamW`` with betas (0.9, 0.95) as in nanoGPT and torch's weight decay 0.01
    unless given; ``fused=True`` when every parameter is on CUDA or the CPU (unless ``foreach``
    is given)."""
    params = list(params)
    hp.setdefault("betas", (0.9, 0.95))
    if "foreach" not in hp:  # torch's fused kernel exists for CUDA and CPU parameters
        hp.setdefault("fused", all(p.device.type in ("cuda", "cpu") for p in _tensors(params)))
    return torch.optim.AdamW(params, lr=lr, **hp)


def sgdm(params, lr, *, momentum=0.95, nesterov=True, **hp) -> torch.optim.SGD:
    """``torch.optim.SGD`` with Nesterov momentum 0.95, from zero velocity."""
    return torch.optim.SGD(params, lr=lr, momentum=momentum, nesterov=nesterov, **hp)


def soap(params, lr, **hp):
    """``SOAP`` from ``pytorch_optimizer``, with its defaults (betas (0.95, 0.95))."""
    from pytorch_optimizer import SOAP

    return SOAP(params, lr=lr, **hp)
