"""The trainer: one run (:func:`train`) or several runs as one batched model
(:func:`train_batched`), with checkpoints, exact resume and atomic result files.

A *cohort* is the set of runs trained in one loop. Alone (one run) the model is the
:class:`~gaugebook.gpt.GPT` itself, under any optimizer, DDP or ``torch.compile``. Batched,
``R`` runs that share a :func:`~gaugebook.run_config.batch_key` keep their weights stacked along
a leading run dimension and one vmapped forward and backward (:func:`torch.func.vmap` over
:func:`torch.func.functional_call`) trains them all, each with its own seed, data stream, bias
draws and optimizer state (ECD with ``members=R``: its own F, reductions and chaos). Both
paths draw every random number a run uses in the same order from the same seeds, so a member
of a batched cohort follows the trajectory of the run trained alone.

The loop is cut into one function per job: ``_setup`` (models, optimizer, generators),
``_resume`` (a checkpoint), ``_record_way`` (how this call trains, from which step),
``_step`` (one optimizer step for every member),
``_measure`` (losses, Noether charges, path length at an evaluation) and ``_results``
(one JSON file per run).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.func import functional_call, vmap
from tqdm.auto import tqdm

from gaugebook import mechanics, run_files
from gaugebook.attention import math_attention
from gaugebook.data import DefaultCorpus, evaluate_probes
from gaugebook.gpt import GPT, eval_mode
from gaugebook.interpret import alignment_scores
from gaugebook.optim import ecd_dt, make_optimizer
from gaugebook.results import HISTORY_EXTRA, HISTORY_KEYS, RESULT_KEYS
from gaugebook.run_config import BATCHABLE_OPTIMIZERS, MEMBER_FIELDS, RunConfig, batch_key
from gaugebook.run_files import provenance, write_json_atomic
from gaugebook.step_graph import CapturedStep

__all__ = ["train", "train_batched", "cohorts", "check_runs", "check_distinct_names",
           "build_optimizer", "optimizer_state_bytes"]


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes held in tensors of the optimizer's per-parameter state, including tensors kept in
    lists or dicts (SOAP's preconditioners); scalar step counters are not counted."""
    def size(value) -> int:
        if torch.is_tensor(value):
            return value.numel() * value.element_size() if value.ndim > 0 else 0
        if isinstance(value, (list, tuple)):
            return sum(size(v) for v in value)
        if isinstance(value, dict):
            return sum(size(v) for v in value.values())
        return 0

    return sum(size(state) for state in optimizer.state.values())


# ----------------------------------------------------------------------------- random state

def _rng_state(device) -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": np.random.get_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict, device) -> None:
    """Restore ``_rng_state`` (torch wants its generator states as CPU byte tensors)."""
    torch.set_rng_state(state["torch"].cpu())
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)


def _rank_world() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


# ----------------------------------------------------------------------------- one member

@dataclass
class _Member:
    """One run of a cohort: its settings, data, model (for measurements), random draws and
    record."""

    cfg: RunConfig
    corpus: DefaultCorpus
    model: GPT
    bias_generator: torch.Generator
    chaos_seed: int
    init_velocity: list[torch.Tensor] | None
    val_batches: list | None = None
    history: dict = field(default_factory=lambda: {k: [] for k in HISTORY_KEYS + HISTORY_EXTRA})


def _member(cfg: RunConfig, device: torch.device) -> _Member:
    """Build a run's model and draw its random numbers, in one fixed order from its seed: model
    initialisation, the seed of its bias draws, ECD's chaos seed, SGDM's initial velocity."""
    torch.manual_seed(cfg.seed)
    corpus = DefaultCorpus(seed=cfg.seed)
    model = GPT(cfg.model_config(corpus.vocab_size)).to(device)
    bias_generator = torch.Generator(device=device).manual_seed(int(torch.randint(0, 2**62, ())))
    chaos_seed = int(torch.randint(0, 2**62, ()))
    std = cfg.optimizer_hp.get("init_velocity_std", 0.0)
    init_velocity = [std * torch.randn(p.shape).to(device) for p in model.parameters()] \
        if std else None
    return _Member(cfg, corpus, model, bias_generator, chaos_seed, init_velocity)


def build_optimizer(cfg: RunConfig, model: GPT, params: dict[str, torch.Tensor], **extra):
    """``cfg``'s optimizer over ``params`` (of ``model``'s layout, alone or stacked), as the
    trainer builds it, with ``extra`` settings (ECD's ``members``, ``chaos_seeds``, ``fused``):
    ECD's named partition becomes its blocks, Muon gets the names it routes by."""
    hp = {k: v for k, v in cfg.optimizer_hp.items() if k not in ("partition", "init_velocity_std")}
    if cfg.optimizer_hp.get("partition") == "gpt2":
        hp["blocks"] = [[params[n] for n in group] for group in model.gpt2_tensors()]
    tensors = list(params.items()) if cfg.optimizer == "muon" else list(params.values())
    return make_optimizer(cfg.optimizer, tensors, **hp, **extra)


# ----------------------------------------------------------------------------- the cohort

@dataclass
class _Cohort:
    """What the loop trains: ``R`` members, the tensors the optimizer moves and the loss of a
    step (``[R]`` batched, a scalar alone)."""

    members: list[_Member]
    device: torch.device
    batched: bool
    params: dict[str, torch.Tensor]  # name -> parameter (alone) or stacked [R, ...] (batched)
    optimizer: object
    loss: object  # (x, y, draws) -> loss
    train_step: object  # (x, y, draws) -> loss, after the optimizer's step on it
    init: dict[str, torch.Tensor]  # the parameters at step 0, for the distance travelled
    step: int = 0
    elapsed: float = 0.0
    tokens: int = 0
    window: torch.Tensor | None = None  # summed training losses since the last measurement
    window_start: int = 0
    ckpt_path: Path | None = None
    cuda_graphs: bool = False  # the step is replayed as a CUDA graph (no autocast cache)
    ways: list[dict] = dataclasses.field(default_factory=list)  # how it trained, from which step

    @property
    def cfg(self) -> RunConfig:
        return self.members[0].cfg

    def autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16,
                              enabled=self.cfg.autocast_bf16, cache_enabled=not self.cuda_graphs)

    def member_params(self, r: int) -> dict[str, torch.Tensor]:
        return {n: p[r] for n, p in self.params.items()} if self.batched else self.params

    def sync_member(self, r: int) -> GPT:
        """Member ``r``'s model holding its current weights (batched: copied from the stack)."""
        model = self.members[r].model
        if self.batched:
            with torch.no_grad():
                for name, p in model.named_parameters():
                    p.copy_(self.params[name][r])
        return model


def _batched_loss(base: GPT):
    """``(params [R, ...], x [R, B, T], y, (b_Q [R, L, dk], b_V [R, L, dv])) -> [R]``: one
    vmapped forward of ``base`` (a model with query and value biases, so that every member's
    draws, zeros where a member has none, enter the same graph), attention on the math kernel
    (:func:`~gaugebook.attention.math_attention`)."""
    def one(params, x, y, query, value):
        return functional_call(base, params, (x, y), {"bias_draws": (query, value)})[1]

    batched = vmap(one)

    def on_math_kernel(*args):
        with math_attention():
            return batched(*args)
    return on_math_kernel


def _setup(cfgs: list[RunConfig], device: torch.device, batched: bool,
           cuda_graphs: bool = False) -> _Cohort:
    """Members, the optimizer over their parameters (stacked when batched), the loss (compiled
    with ``cfg.compile``) and the training step (with ``cuda_graphs`` the whole step, forward,
    backward and update, replayed as one CUDA graph: one launch instead of hundreds)."""
    members = [_member(cfg, device) for cfg in cfgs]
    cfg, world = cfgs[0], _rank_world()[1]
    if not batched:
        model = members[0].model
        params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        train_model = model
        if world > 1:
            train_model = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None)
        if cfg.compile:
            train_model = torch.compile(train_model)

        def loss(x, y, draws):
            return train_model(x, y, bias_draws=draws[0])[1]
    else:
        # (parameters only: the members' buffers differ, a symmetric model has no bias means)
        named = [dict(m.model.named_parameters()) for m in members]
        params = {n: torch.stack([p[n].detach() for p in named]).requires_grad_(True)
                  for n in named[0]}
        base_cfg = dataclasses.replace(members[0].model.config, symmetry_breaking="bqv", mu_v=0.0)
        base = GPT(base_cfg).to(device)
        batched_loss = _batched_loss(base)
        if cfg.compile:
            batched_loss = torch.compile(batched_loss)

        def loss(x, y, draws):
            return batched_loss(params, x, y, *draws)
    extra = {}
    if cfg.optimizer == "ecd":
        extra["chaos_seeds"] = [m.chaos_seed for m in members]
        if not cfg.compile:  # (compiled: ECD's fused kernels where it can take them)
            extra["fused"] = False
        if batched:
            extra["members"] = len(members)
    optimizer = build_optimizer(cfg, members[0].model, params, **extra)
    if members[0].init_velocity is not None:  # SGDM's random initial momentum buffers
        for i, p in enumerate(params.values()):
            v = [m.init_velocity[i] for m in members]
            optimizer.state[p]["momentum_buffer"] = torch.stack(v) if batched else v[0]
    init = {n: p.detach().clone() for n, p in params.items()}
    cohort = _Cohort(members, device, batched, params, optimizer, loss, None, init,
                     cuda_graphs=cuda_graphs)
    cohort.train_step = functools.partial(_optimizer_step, cohort)
    if cuda_graphs:
        cohort.train_step = CapturedStep(cohort.train_step, device, label=_label(cohort))
    return cohort


def _label(cohort: _Cohort) -> str:
    cfg = cohort.cfg
    return cfg.name if not cohort.batched else \
        f"{len(cohort.members)} runs ({cfg.optimizer}, batched)"


def _optimizer_step(cohort: _Cohort, x: torch.Tensor, y: torch.Tensor, draws) -> torch.Tensor:
    """The optimizer's step of every member on ``x, y`` with the bias ``draws``; returns the
    loss before it (``[R]`` batched, a scalar alone)."""
    optimizer = cohort.optimizer

    def closure():
        optimizer.zero_grad(set_to_none=True)
        with cohort.autocast():
            loss = cohort.loss(x, y, draws)
        (loss.sum() if cohort.batched else loss).backward()
        return loss
    return optimizer.step(closure)


def _save_checkpoint(cohort: _Cohort) -> None:
    cohort.ckpt_path.parent.mkdir(exist_ok=True)
    weights = (cohort.members[0].model.state_dict() if not cohort.batched
               else {n: p.detach() for n, p in cohort.params.items()})
    run_files.save_atomic({"weights": weights, "optimizer": cohort.optimizer.state_dict(),
                  "step": cohort.step, "elapsed": cohort.elapsed, "tokens": cohort.tokens,
                  "histories": [m.history for m in cohort.members],
                  "window": (cohort.window, cohort.window_start), "init": cohort.init,
                  "rng": _rng_state(cohort.device),
                  "bias_generators": [m.bias_generator.get_state() for m in cohort.members],
                  "configs": [dataclasses.asdict(m.cfg) for m in cohort.members],
                  "ways": cohort.ways},
                 cohort.ckpt_path)


def _resume(cohort: _Cohort) -> None:
    """Continue from the cohort's checkpoint, if there is one (settings checked)."""
    path = cohort.ckpt_path
    if not path.exists():
        return
    try:  # on the CPU: random states must stay there; load_state_dict moves the rest
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
        if not isinstance(ckpt, dict):
            raise ValueError(f"holds a {type(ckpt).__name__}, not a checkpoint")
    except Exception as error:  # noqa: BLE001 - truncated, empty or garbage: any unpickling error
        run_files.set_aside(path, error)
        return
    conflict = run_files.RunFileConflict
    if "configs" not in ckpt:
        raise conflict(f"{path} is a checkpoint of an older format (before batched training): "
                       "delete it to restart this run from step 0")
    configs = ckpt["configs"]
    if len(configs) != len(cohort.members):
        raise conflict(f"{path} holds a cohort of {len(configs)} runs, this one has "
                       f"{len(cohort.members)}: write to another --out")
    for m, stored in zip(cohort.members, configs):
        run_files.check_same_config(m.cfg, stored, path)
    with torch.no_grad():
        if cohort.batched:
            for n, p in cohort.params.items():
                p.copy_(ckpt["weights"][n])
        else:
            cohort.members[0].model.load_state_dict(ckpt["weights"])
        for n, p in ckpt["init"].items():
            cohort.init[n].copy_(p)
    cohort.optimizer.load_state_dict(ckpt["optimizer"])
    cohort.step, cohort.elapsed, cohort.tokens = ckpt["step"], ckpt["elapsed"], ckpt["tokens"]
    for m, history, state in zip(cohort.members, ckpt["histories"], ckpt["bias_generators"]):
        m.history = history
        m.bias_generator.set_state(state)
    cohort.ways = ckpt.get("ways", [])  # (older checkpoints: the earlier ways are unknown)
    window, cohort.window_start = ckpt["window"]
    cohort.window = None if window is None else window.to(cohort.device)
    _set_rng_state(ckpt["rng"], cohort.device)


def _record_way(cohort: _Cohort) -> None:
    """Note how this call trains (compiled, replayed as a CUDA graph, inductor's C++ wrapper)
    from the present step, unless it trains as the call before it did: a run resumed across
    calls that trained it differently keeps each way, with the step it took over from."""
    way = {"compile": cohort.cfg.compile, "cuda_graphs": cohort.cuda_graphs,
           "cpp_wrapper": os.environ.get("TORCHINDUCTOR_CPP_WRAPPER") == "1"}
    if not cohort.ways or {k: v for k, v in cohort.ways[-1].items() if k != "from_step"} != way:
        cohort.ways.append({"from_step": cohort.step, **way})


def _draws(cohort: _Cohort):
    """Each member's training draw of the symmetry-breaking biases, from its own generator:
    alone ``[draw]`` (``None`` for a symmetric run); batched ``(b_Q [R, L, dk], b_V [R, L, dv])``,
    with zeros where a member has no such bias (adding zero changes nothing)."""
    draws = [m.model.draw_biases(m.bias_generator) for m in cohort.members]
    if not cohort.batched:
        return draws
    config = cohort.members[0].model.config
    zeros = torch.zeros(config.n_layer, config.head_size, device=cohort.device)

    def stacked(i):
        return torch.stack([zeros if d is None or d[i] is None else d[i] for d in draws])
    return stacked(0), stacked(1)


class _TrainBatches(torch.utils.data.Dataset):
    """Training batch ``index`` of every member, ``x, y [R, B, T]`` (a pure function of the
    seeds and the index, so worker processes can prefetch it and a resumed run reads on)."""

    def __init__(self, seeds: list[int], batch_size: int, block_size: int):
        self.seeds, self.batch_size, self.block_size = seeds, batch_size, block_size
        self._corpora = None  # built in the process that reads (a worker has its own)

    def __len__(self) -> int:
        return 2**62

    def __getitem__(self, index: int):
        if self._corpora is None:
            self._corpora = [DefaultCorpus(seed=s) for s in self.seeds]
        pairs = [c.batch(index, self.batch_size, self.block_size)[:2] for c in self._corpora]
        return torch.stack([x for x, _ in pairs]), torch.stack([y for _, y in pairs])


def _train_batches(cohort: _Cohort, workers: int):
    """Iterator over the training batches from the cohort's step on, prefetched by ``workers``
    processes (0: in this process), pinned for an asynchronous copy to a GPU."""
    cfg = cohort.cfg
    data = _TrainBatches([m.cfg.seed for m in cohort.members], cfg.batch_size, cfg.block_size)
    loader = torch.utils.data.DataLoader(
        data, batch_size=None, sampler=range(cohort.step, cfg.steps), num_workers=workers,
        pin_memory=cohort.device.type == "cuda", prefetch_factor=8 if workers else None)
    rank, world = _rank_world()
    local = cfg.batch_size // world
    for x, y in loader:
        x, y = (t.to(cohort.device, non_blocking=True) for t in (x, y))
        if not cohort.batched:  # one member; under DDP this rank's share of the batch
            x, y = x[0, rank * local:(rank + 1) * local], y[0, rank * local:(rank + 1) * local]
        yield x, y


def _step(cohort: _Cohort, x: torch.Tensor, y: torch.Tensor) -> None:
    """One optimizer step of every member on ``x, y``; the training loss is summed on the
    device."""
    # a copy: the loss may be a CUDA graph's output, overwritten by its next replay
    loss = cohort.train_step(x, y, _draws(cohort)).detach().float().clone()
    cohort.window = loss if cohort.window is None else cohort.window + loss  # no sync per step
    cohort.step += 1
    cohort.tokens += cohort.cfg.batch_size * cohort.cfg.block_size


def _evaluate(cohort: _Cohort, r: int) -> float:
    """Member ``r``'s mean validation loss over ``eval_batches`` fixed held-out batches (eval
    mode: mean biases)."""
    model, cfg = cohort.sync_member(r), cohort.cfg
    member = cohort.members[r]
    if member.val_batches is None:  # the same held-out batches at every evaluation
        member.val_batches = [member.corpus.batch(i, cfg.batch_size, cfg.block_size, split="val",
                                                  device=cohort.device)[:2]
                              for i in range(cfg.eval_batches)]
    with eval_mode(model), torch.no_grad(), cohort.autocast():
        losses = torch.stack([model(x, y)[1].float() for x, y in member.val_batches])
    return float(np.mean(losses.tolist()))  # (one read to the host)


def _charge_norms(model: GPT, velocity: dict) -> dict:
    """Mean Frobenius norm of the Noether charges J_QK, J_VO per layer, with the last step's
    parameter change as the velocity (optimizer-agnostic)."""
    sectors = mechanics.charges(model, velocity).values()
    return {"J_QK": float(np.mean([s.qk_norm.mean().item() for s in sectors])),
            "J_VO": float(np.mean([s.vo_norm.mean().item() for s in sectors]))}


def _norm(tensors) -> float:
    return math.sqrt(math.fsum(float(t.double().square().sum()) for t in tensors))


def _check_finite(cohort: _Cohort, r: int) -> None:
    params = cohort.member_params(r)
    finite = torch.stack([torch.isfinite(p).all() for p in params.values()]).tolist()  # one read
    for name, ok in zip(params, finite):
        if not ok:
            raise FloatingPointError(f"{cohort.members[r].cfg.name}: parameter {name} is not "
                                     f"finite after step {cohort.step}")


def _measure(cohort: _Cohort, before: dict, start: float) -> None:
    """Append one evaluation to every member's history: mean training loss since the last one,
    validation loss, charges of the last step, path length (ECD: steps x dt), distance from the
    initial weights, skipped steps."""
    window = cohort.window
    if _rank_world()[1] > 1:
        dist.all_reduce(window)
        window /= _rank_world()[1]
    train_losses = (window / (cohort.step - cohort.window_start)).reshape(-1).tolist()
    skipped = getattr(cohort.optimizer, "skipped_steps", 0)
    moved = getattr(cohort.optimizer, "steps", None)
    for r, m in enumerate(cohort.members):
        if not math.isfinite(train_losses[r]):
            raise FloatingPointError(f"{m.cfg.name}: non-finite training loss before step "
                                     f"{cohort.step}")
        _check_finite(cohort, r)
        now = cohort.member_params(r)
        velocity = {n: now[n].detach() - (before[n][r] if cohort.batched else before[n])
                    for n in now}
        charges = _charge_norms(cohort.sync_member(r), velocity)
        init = {n: (t[r] if cohort.batched else t) for n, t in cohort.init.items()}
        path = None
        if m.cfg.optimizer == "ecd":
            hp = m.cfg.optimizer_hp
            moved_r = moved[r] if isinstance(moved, list) else moved
            path = moved_r * ecd_dt(hp["lr"], hp["eta"])
        record = {"step": cohort.step, "train_loss": train_losses[r],
                  "val_loss": _evaluate(cohort, r), **charges,
                  "wall_s": time.perf_counter() - start, "path_length": path,
                  "distance": _norm(now[n].detach() - init[n] for n in now),
                  "skipped_steps": skipped[r] if isinstance(skipped, list) else skipped}
        for key, value in record.items():
            m.history[key].append(value)
    cohort.window, cohort.window_start = None, cohort.step


def _out_of_time(cfg: RunConfig, start: float, device, world: int) -> bool:
    """Whether ``max_wall_s`` has passed since ``start`` (this call's first step: a resumed
    run's earlier time does not count, so a retry gets its whole budget), by rank 0's clock (all
    ranks agree)."""
    if cfg.max_wall_s is None:
        return False
    over = time.perf_counter() - start > cfg.max_wall_s
    if world > 1:
        flag = torch.tensor(float(over), device=device)
        dist.broadcast(flag, src=0)
        over = bool(flag.item())
    return over


def _peak_memory(device: torch.device) -> int:
    """Peak allocated device memory on CUDA; on the CPU the process's peak resident set size."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    import resource
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


ALIGNMENT_BATCHES = 4  # validation batches the end-of-run alignment scores are measured on


def _alignment(model: GPT, member, cohort: _Cohort) -> dict | None:
    """The trained ``model``'s :func:`~gaugebook.interpret.alignment_scores` on the first
    validation batches of its corpus; ``None`` where they do not apply: keys that depend on the
    position (RoPE), a corpus without token categories, or too few tokens of a category."""
    cfg, tokenizer = cohort.cfg, member.corpus.tokenizer
    vocabulary = getattr(tokenizer, "token_categories", None)
    if model.config.rope or vocabulary is None:
        return None
    batches = [member.corpus.batch(i, cfg.batch_size, cfg.block_size, split="val",
                                   device=cohort.device)
               for i in range(min(cfg.eval_batches, ALIGNMENT_BATCHES))]
    if batches[0].categories is None:
        return None
    idx = torch.cat([b.inputs for b in batches])  # (B, T)
    categories = torch.cat([b.categories for b in batches])
    try:
        return alignment_scores(model, idx, categories,
                                torch.as_tensor(np.asarray(vocabulary, dtype=np.int64)))
    except ValueError:  # a structural or noise category absent from these batches
        return None


def _results(cohort: _Cohort, wall: float) -> list[dict]:
    """One result record per member (the schema :data:`gaugebook.results.RESULT_KEYS`)."""
    names = [m.cfg.name for m in cohort.members]
    state_bytes = optimizer_state_bytes(cohort.optimizer) // len(cohort.members)
    peak, origin = _peak_memory(cohort.device), provenance(cohort.device)
    records = []
    for r, m in enumerate(cohort.members):
        model = cohort.sync_member(r)
        model.eval()
        probes = evaluate_probes(model, m.corpus.tokenizer, n_per_task=m.cfg.probe_instances,
                                 device=cohort.device)
        skipped = getattr(cohort.optimizer, "skipped_steps", 0)
        record = {
            "name": m.cfg.name,
            "config": dataclasses.asdict(m.cfg),
            "steps_done": cohort.step,
            "truncated": cohort.step < m.cfg.steps,
            "history": m.history,
            "final_val_loss": m.history["val_loss"][-1] if m.history["val_loss"] else None,
            "probes": probes,
            "alignment": _alignment(model, m, cohort),
            "optimizer_state_bytes": state_bytes,
            "n_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "init_norm": _norm(t[r] if cohort.batched else t for t in cohort.init.values()),
            "skipped_steps": skipped[r] if isinstance(skipped, list) else skipped,
            "wall_s": wall,
            "tokens": cohort.tokens,
            "tokens_per_s": cohort.tokens / wall,
            "peak_memory_bytes": peak,
            "trained_with": names if cohort.batched else [],
            "ways": cohort.ways,
            "provenance": origin,
        }
        assert set(record) == set(RESULT_KEYS), set(record) ^ set(RESULT_KEYS)
        records.append(record)
    return records


# ----------------------------------------------------------------------------- entry points

def _check_cuda_graphs(runs: list[RunConfig], device: torch.device) -> None:
    """Whether the steps of ``runs`` can be captured as CUDA graphs; ValueError naming the fix."""
    if device.type != "cuda":
        raise ValueError(f"cuda_graphs needs a CUDA device, not {device}: drop --cuda-graphs")
    if _rank_world()[1] > 1 or int(os.environ.get("WORLD_SIZE", 1)) > 1:
        raise ValueError("cuda_graphs captures one process's step: do not start it under torchrun")
    for cfg in runs:
        if cfg.optimizer not in BATCHABLE_OPTIMIZERS:
            raise ValueError(f"cuda_graphs captures the steps of {BATCHABLE_OPTIMIZERS} only; "
                             f"{cfg.name} uses {cfg.optimizer}: drop --cuda-graphs")
        if cfg.optimizer == "ecd" and cfg.optimizer_hp.get("nu", 0) != 0:
            raise ValueError(f"{cfg.name}: ECD's chaos (nu > 0) is applied on the host at every "
                             "step, which a CUDA graph cannot replay: drop --cuda-graphs")
        if cfg.optimizer == "ecd" and cfg.optimizer_hp.get("foreach") is False:
            raise ValueError(f"{cfg.name}: ECD's reference path (foreach=False) computes its "
                             "coefficients on the host: drop --cuda-graphs or foreach=False")


def check_distinct_names(runs: list[RunConfig]) -> None:
    """ValueError if two runs have one name: they would write the same result file."""
    names = [cfg.name for cfg in runs]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise ValueError(f"runs {clashes} would write the same result file: on the command line,"
                         " drop the --set that made them equal (--set changes every run alike); "
                         "in Python, give them distinct tags (RunConfig.tag)")


def check_runs(runs: list[RunConfig], out: Path, device: str, cuda_graphs: bool = False) -> None:
    """Everything that would otherwise fail after training started, checked before: the
    device, a writable ``out``, for each optimizer setting that the optimizer accepts it (on a
    one-layer stand-in of the run's model), and with ``cuda_graphs`` that the steps can be
    captured. ValueError naming the problem."""
    try:
        dev = torch.device(device)
    except RuntimeError as error:
        raise ValueError(f"--device {device!r} is not a device name ({error})") from None
    if cuda_graphs:
        _check_cuda_graphs(runs, dev)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: torch sees no CUDA device here; use --device cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"--device {device}: there are {torch.cuda.device_count()} CUDA devices")
    try:  # a CPU always works; CUDA is checked above without a context in this process
        if dev.type not in ("cpu", "cuda"):
            torch.empty(1, device=dev)
    except (RuntimeError, AssertionError) as error:  # e.g. mps where torch was built without it
        said = str(error).strip().split(". ")[0] or repr(error)  # torch's first sentence
        raise ValueError(f"--device {device}: torch cannot use it here ({said}); use "
                         "--device cpu") from None
    probe = Path(out) / f".write-probe-{os.getpid()}"
    try:
        Path(out).mkdir(parents=True, exist_ok=True)
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise ValueError(f"cannot write results to {out}: {error}") from None
    seen = set()
    for cfg in runs:
        key = (cfg.optimizer, json.dumps(cfg.optimizer_hp, sort_keys=True), cfg.symmetry)
        if key in seen:
            continue
        seen.add(key)
        stand_in = dataclasses.replace(cfg.model_config(8), block_size=8, n_layer=1,
                                       n_embd=2 * cfg.n_head)
        model = GPT(stand_in)
        params = dict(model.named_parameters())
        try:
            build_optimizer(cfg, model, params)
        except (TypeError, ValueError) as error:
            hint = (" (--set optimizer_hp=... replaces every entry; --set optimizer_hp.KEY=VALUE "
                    "changes one)" if "missing" in str(error) else
                    " (--set changes every run alike: set one optimizer's option on a preset or"
                    " --part that trains that optimizer alone)" if "unexpected" in str(error)
                    else "")
            raise ValueError(f"{cfg.name}: optimizer_hp {cfg.optimizer_hp} is not accepted by "
                             f"{cfg.optimizer}: {error}{hint}") from None


def _train(cfgs: list[RunConfig], out: Path, device, batched: bool,
           **options) -> list[dict] | None:
    """``options``: the keywords of :func:`_train_locked` after ``batched``."""
    device = torch.device(device)
    if options["cuda_graphs"]:
        _check_cuda_graphs(cfgs, device)
    out.mkdir(parents=True, exist_ok=True)
    if _rank_world()[0] != 0:  # rank 0 writes (and locks) for all
        return _train_locked(cfgs, out, device, batched, **options)
    with run_files.run_locks(out, cfgs):
        run_files.remove_stale_temporaries(out, cfgs, batched)
        return _train_locked(cfgs, out, device, batched, **options)


def _train_locked(cfgs: list[RunConfig], out: Path, device: torch.device, batched: bool, *,
                  position: int, stop_after: int | None, progress: bool,
                  data_workers: int, cuda_graphs: bool) -> list[dict] | None:
    rank, world = _rank_world()
    done = run_files.existing_results(cfgs, out)
    todo = [cfg for cfg in cfgs if cfg.name not in done]
    whole = run_files.checkpoint_path(out, cfgs, batched)
    if not todo:
        if rank == 0:  # a call stopped between its last result and removing the checkpoint
            whole.unlink(missing_ok=True)
        return [done[cfg.name] for cfg in cfgs]
    if batched and len(todo) < len(cfgs) and whole.exists():
        todo = cfgs  # stopped while writing the cohort's results: resume the whole cohort
    cfg = todo[0]
    if cfg.batch_size % world:
        raise ValueError(f"batch_size {cfg.batch_size} is not divisible by world size {world}")
    cohort = _setup(todo, device, batched, cuda_graphs)
    cohort.ckpt_path = run_files.checkpoint_path(out, todo, batched)
    _resume(cohort)
    if cohort.step and rank == 0 and progress:
        tqdm.write(f"resuming {_label(cohort)} at step {cohort.step} of {cfg.steps} "
                   f"({cohort.ckpt_path})", file=sys.stderr)
    _record_way(cohort)
    if cfg.optimizer == "adamw":  # captured: step counts on the device (set after a checkpoint
        for group in cohort.optimizer.param_groups:  # restored its own)
            group["capturable"] = cuda_graphs
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    began = time.perf_counter()  # the time budget counts this call's time only
    start = began - cohort.elapsed  # the run's time, earlier calls included
    bar = tqdm(total=cfg.steps, initial=cohort.step, desc=_label(cohort), position=position,
               leave=position == 0, disable=rank != 0 or not progress, dynamic_ncols=True)
    final, batches = False, _train_batches(cohort, data_workers)
    try:
        while not final:
            # the last step: the planned one, or the one in progress when the time budget ends
            final = cohort.step + 1 >= cfg.steps or _out_of_time(cfg, began, device, world)
            measure = (cohort.step + 1) % cfg.eval_every == 0 or final
            before = ({n: p.detach().clone() for n, p in cohort.params.items()} if measure
                      else None)
            _step(cohort, *next(batches))
            bar.update(1)
            if measure:
                _measure(cohort, before, start)
                best = min(m.history["val_loss"][-1] for m in cohort.members)
                bar.set_postfix(val=f"{best:.3f}")
            cohort.elapsed = time.perf_counter() - start
            if rank == 0 and cohort.step % cfg.checkpoint_every == 0 and not final:
                _save_checkpoint(cohort)
            if stop_after is not None and cohort.step >= stop_after:
                return None
    finally:  # on Ctrl-C too: the bar ends its line, the prefetching workers stop
        bar.close()
        batches.close()  # before the final evaluation
    records = _results(cohort, time.perf_counter() - start)
    if rank == 0:
        # written meanwhile with other settings? refuse, keep it
        run_files.existing_results(todo, out)
        for record in records:
            if record["name"] in done:  # written before an interruption: the same run
                continue
            write_json_atomic(out / f"{record['name']}.json", record)
            (out / f"{record['name']}.error.json").unlink(missing_ok=True)  # an earlier failure
        cohort.ckpt_path.unlink(missing_ok=True)
    done.update({r["name"]: r for r in records if r["name"] not in done})
    return [done[cfg.name] for cfg in cfgs]


def train(cfg: RunConfig, out: Path, device: torch.device | str = "cpu", *,
          position: int = 0, stop_after: int | None = None, progress: bool = True,
          data_workers: int = 0, cuda_graphs: bool = False) -> dict | None:
    """Train one run and write ``<out>/<name>.json``; return the result (``None`` if stopped early
    by ``stop_after``, which simulates an interruption in tests). ``progress=False`` hides the
    progress bar; ``data_workers`` processes prefetch the training batches (0: none);
    ``cuda_graphs`` (CUDA; ECD without chaos, AdamW or SGDM) captures the whole step, forward,
    backward and update, as a CUDA graph after three steps and replays it (the same numbers, one
    launch per step instead of hundreds).

    An existing result or checkpoint of the same name must hold the same configuration, but for
    how the run is executed (:data:`~gaugebook.run_config.EXECUTION_FIELDS`; a result cut by its
    time budget only with the same ``max_wall_s``), ValueError otherwise: the result is returned,
    the checkpoint resumed. A run stopped by ``max_wall_s`` is evaluated at its last step
    (``truncated``: true). ``peak_memory_bytes`` is the peak of allocated device memory on CUDA;
    on the CPU it is the process's peak resident set size since it started (everything the
    process did, not only this run)."""
    results = _train([cfg], Path(out), device, False, position=position, stop_after=stop_after,
                     progress=progress, data_workers=data_workers, cuda_graphs=cuda_graphs)
    return None if results is None else results[0]


def train_batched(cfgs: list[RunConfig], out: Path, device: torch.device | str = "cpu", *,
                  position: int = 0, stop_after: int | None = None, progress: bool = True,
                  data_workers: int = 0, cuda_graphs: bool = False) -> list[dict] | None:
    """Train ``cfgs`` as one batched model and write one ``<out>/<name>.json`` per run, the
    records :func:`train` would write (``trained_with`` names the cohort). The runs must share
    a :func:`~gaugebook.run_config.batch_key` and an optimizer that batches (ECD, AdamW, SGDM);
    the checkpoint ``<out>/checkpoints/batch-<hash>.pt`` holds the whole cohort. Runs whose result
    exists are not retrained."""
    cfgs = list(cfgs)
    if not cfgs:
        raise ValueError("train_batched needs at least one run")
    check_distinct_names(cfgs)
    if cfgs[0].optimizer not in BATCHABLE_OPTIMIZERS:
        raise ValueError(f"--batched trains {BATCHABLE_OPTIMIZERS} only ({cfgs[0].optimizer} "
                         "acts on whole matrices): run these runs without --batched")
    keys = [dict(batch_key(c)) for c in cfgs]
    differing = sorted(k for k in keys[0] if any(key[k] != keys[0][k] for key in keys))
    if differing:
        raise ValueError(f"runs of one batched model must share everything but "
                         f"{', '.join(MEMBER_FIELDS)}; these differ: {differing}")
    if _rank_world()[1] > 1:
        raise ValueError("--batched runs in one process: do not start it under torchrun")
    return _train(cfgs, Path(out), device, True, position=position, stop_after=stop_after,
                  progress=progress, data_workers=data_workers, cuda_graphs=cuda_graphs)


def cohorts(runs: list[RunConfig]) -> list[list[RunConfig]]:
    """``runs`` grouped for :func:`train_batched`: runs with one batch key, in order of first
    appearance; runs of an optimizer that does not batch are refused."""
    groups: dict[tuple, list[RunConfig]] = {}
    for cfg in runs:
        if cfg.optimizer not in BATCHABLE_OPTIMIZERS:
            raise ValueError(f"--batched trains {BATCHABLE_OPTIMIZERS} only; {cfg.name} uses "
                             f"{cfg.optimizer}: run it without --batched")
        groups.setdefault(batch_key(cfg), []).append(cfg)
    return list(groups.values())

