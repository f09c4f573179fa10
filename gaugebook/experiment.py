r"""The experiment runner: grids of (optimizer x symmetry x activation x seed) training runs.

A *preset* names *parts*; a part is a list of runs. Each run trains a reduced GPT-2 on the
default corpus and writes ``<out>/<run>.json`` atomically when it finishes; an existing result is
skipped, so parts accumulate into one results folder. Checkpoints (``<out>/checkpoints/``) are
written every ``checkpoint_every`` steps and an interrupted run resumes exactly (model, optimizer,
random state and data position are restored; the data stream is a pure function of seed and step).
Runs of one folder that differ only in other settings (a sweep's learning rates) need distinct
``tag`` values (``--set tag=...``): a result or checkpoint written for other settings is refused,
except for how the run is executed (``compile``, ``max_wall_s``, ``checkpoint_every``).

Command line::

    python -m gaugebook.experiment --preset cpu-smoke --out runs/smoke
    python -m gaugebook.experiment --preset gpu --part seed0 --out results/gpu --workers 16
    python -m gaugebook.experiment --preset paper --part seed0-pt --batched \
        --data-workers 4 --out results/gpu/paper
    torchrun --nproc_per_node 2 -m gaugebook.experiment --preset cpu-smoke --out runs/ddp

``--batched`` trains the runs that share an optimizer setting and a model shape as one batched
model (``gaugebook.training.train_batched``): the same result files, one forward and backward
for all of them; ``--workers K`` then trains K such cohorts concurrently.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from gaugebook.results import read_run
from gaugebook.run_config import RunConfig, override
from gaugebook.run_files import (RunFileConflict, checkpoint_path, existing_results, provenance,
                                 run_locks, write_json_atomic)
from gaugebook.training import (check_distinct_names, check_runs, cohorts,
                                optimizer_state_bytes, train, train_batched)

__all__ = ["RunConfig", "presets", "select_runs", "plan_parts", "override", "train",
           "train_batched", "run_many", "main", "provenance", "write_json_atomic",
           "optimizer_state_bytes", "PAPER_DECISION", "bias_pace"]

# Optimizer settings of the `gpu` preset. The paper's code (124M model, 500M tokens): ECD lr 1
# (dt 0.1), eta 100, F0 2.0; AdamW lr 1e-4; SGDM lr 0.03, momentum 0.95 (Nesterov); SOAP lr 3e-4,
# betas (0.95, 0.95). Here ECD keeps lr and eta with F0 = 1.5 (below the losses our short runs
# reach), SGDM the paper's lr and momentum but starts at rest (the paper draws its initial
# velocity with std 0.1), bqv runs draw b_V with mu_V = 0 (the paper: 0.5), and the adaptive
# methods take 10x the paper's lr,
# the usual choice for a model 10x smaller trained far shorter. These are not tuned: the `sweep`
# preset exists to tune them, and the book reports which settings each result used. SOAP keeps
# pytorch-optimizer's max_precondition_dim = 10,000: our 4,832-word vocabulary falls under it (the
# embedding gets a vocabulary-side preconditioner), GPT-2's 50,257 words do not (chapter 17).
HP = {
    "ecd": dict(lr=1.0, eta=100.0, F0=1.5),
    "adamw": dict(lr=1e-3, betas=(0.9, 0.95), weight_decay=0.0),
    "sgdm": dict(lr=0.03, momentum=0.95),
    "soap": dict(lr=3e-3, betas=(0.95, 0.95)),
    "muon": dict(lr=1e-3),
}

SMOKE = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, batch_size=8, steps=30, eval_every=10,
             eval_batches=2, probe_instances=8)
SMALL = dict(n_layer=4, n_head=4, n_embd=128, block_size=128, batch_size=16, steps=400,
             eval_every=50, eval_batches=4, probe_instances=32, checkpoint_every=100)
GPU = dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch_size=32, steps=2000,
           eval_every=100, eval_batches=8, probe_instances=128, checkpoint_every=500,
           autocast_bf16=True, max_wall_s=420.0)


# The preset `paper`: the symmetry-breaking paper's protocol (Silverstein, Kunin, Shyam 2026; its
# code's settings) at reduced scale. ECD: lr 1 (dt = 0.1), eta 100, F0 2, nu 0, per-tensor over
# GPT-2's tensors or global; AdamW: betas (0.9, 0.999), weight decay 0 (the paper's logged runs)
# at lr PAPER_ADAMW_LR; PReLU slopes drawn per unit from N(0.2, 1.0^2); mu_V 0.5. Steps: the
# initial parameter norm of this model is 134 (seed 0), so 28,000 steps of dt 0.1 make a nominal
# path (steps x dt) of 2,800 = 20.9 initial norms.
PAPER_ADAMW_LR = 1e-4
PAPER = dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch_size=8, steps=28_000,
             eval_every=500, eval_batches=16, probe_instances=128, checkpoint_every=4000,
             autocast_bf16=True, compile=True, prelu_init="paper")
PAPER_SMOKE = dict(SMOKE, steps=40, prelu_init="paper")
# The preset `paper-cpu`: the same 21 runs on the smoke model (2 layers, 2 heads, width 32,
# context 32), as long as the GPU preset's horizon: its initial parameter norm is 22.9, 22.5 and
# 21.4 (seeds 0, 1, 2), so 5,000 steps of dt 0.1 make a nominal path of 500 = 21.8 to 23.4
# initial norms.
# A CPU trains it in about 20 minutes; the same decision rule applies (PAPER_DECISION), and what
# it decides is about this model only.
PAPER_CPU = dict(PAPER_SMOKE, steps=5_000, eval_every=100, eval_batches=16, probe_instances=32,
                 checkpoint_every=500)
PAPER_ECD = dict(lr=1.0, eta=100.0, F0=2.0)
PAPER_ARMS = (  # (optimizer, tag, optimizer_hp, symmetries)
    ("ecd", "pt", dict(PAPER_ECD, projection="per_tensor", partition="gpt2"),
     ("symmetric", "bq", "bqv")),
    ("ecd", "global", PAPER_ECD, ("symmetric", "bqv")),
    ("adamw", "", dict(lr=PAPER_ADAMW_LR, betas=(0.9, 0.999), weight_decay=0.0),
     ("symmetric", "bqv")),
)
PAPER_DECISION = """Pre-registered decision rule of the preset `paper` (fixed before any GPU result).
For each run the statistic is the mean validation loss of its last 5 evaluations. For each ECD
arm (per-tensor, global) and each broken symmetry (bq, bqv), Delta = broken - symmetric, paired
by seed (0, 1, 2). "Breaking helps ECD at this scale" holds for that pair iff Delta < 0 in every
seed and the mean Delta < -0.1. Reported whatever they show: the mean, the per-seed values and a
95% t-interval (2 degrees of freedom). AdamW's Delta is reported the same way, as the control."""
"""The pre-registered decision rule of the preset ``paper`` as plain text, committed before any
GPU result: the statistic, the Delta paired by seed, and the threshold at which breaking helps
ECD. :func:`gaugebook.results.decide` applies it; chapter 17 prints it and
``results/README.md`` records it.

:meta hide-value:
"""


def _paper_parts(base: dict, by_arm: bool = False) -> dict[str, list[RunConfig]]:
    """The 7 runs of the paper's arms per seed (see ``PAPER_DECISION``): one part per seed
    (``seed0``), or with ``by_arm`` one per seed and arm, each one cohort of ``--batched`` (the
    smallest unit a GPU call can finish), arm by arm: ``seed0-pt``, ``seed1-pt``, ``seed2-pt``,
    then ``-global``, then ``-adamw``. So the parts planned first decide the main question (ECD
    per-tensor, the paper's own optimizer, broken against symmetric in every seed), and parts of
    one arm planned together train as one cohort."""
    parts: dict[str, list[RunConfig]] = {}
    for optimizer, tag, hp, symmetries in PAPER_ARMS:
        for seed in range(3):
            part = f"seed{seed}-{tag or optimizer}" if by_arm else f"seed{seed}"
            parts.setdefault(part, []).extend(
                RunConfig(optimizer=optimizer, symmetry=s, seed=seed, tag=tag,
                          optimizer_hp=dict(hp), mu_v=0.5 if s == "bqv" else 0.0, **base)
                for s in symmetries)
    return parts


def _paper_lr_parts(base: dict, adamw_rates=(1e-4, 3e-4, 1e-3, 3e-3),
                    ecd_rates=(), seed: int = 0) -> dict[str, list[RunConfig]]:
    """AdamW on the model of ``base`` at ``adamw_rates``, and per-tensor ECD at ``ecd_rates``
    (``dt = lr / sqrt(eta)``; part ``ecd`` when any), symmetric and bqv, at ``seed``, every
    other setting as in ``PAPER_ARMS``: the sweep behind ``PAPER_ADAMW_LR`` (`paper-lr`; on a
    CPU: ``--set steps=... --set compile=false``), and on the toy model of `paper-cpu`
    (`paper-cpu-lr`, with higher AdamW rates and ECD's own sweep)."""
    arms = {(o, tag): hp for o, tag, hp, _ in PAPER_ARMS}
    sweeps = {"adamw": (arms["adamw", ""], "lr={:g}", adamw_rates),
              "ecd": (arms["ecd", "pt"], "pt-lr={:g}", ecd_rates)}
    return {optimizer: [RunConfig(optimizer=optimizer, symmetry=s, seed=seed, tag=tag.format(lr),
                                  optimizer_hp=dict(hp, lr=lr),
                                  mu_v=0.5 if s == "bqv" else 0.0, **base)
                        for s in ("symmetric", "bqv") for lr in rates]
            for optimizer, (hp, tag, rates) in sweeps.items() if rates}


# The preset `paper-cpu-tuned`: AdamW on the toy model at the best rate of `paper-cpu-lr`
# (seed 0), now at seeds 0, 1 and 2, so that its gap to ECD at ECD's best rate (lr 1, the runs
# of `paper-cpu`) is paired by seed and has an interval; registered in results/README.md.
PAPER_CPU_ADAMW_LR = 3e-3


def _paper_tuned_parts(base: dict, lr: float) -> dict[str, list[RunConfig]]:
    """One part per seed (0, 1, 2): AdamW at ``lr``, symmetric and bqv, every other setting
    as in :func:`_paper_lr_parts` (seed 0 repeats that sweep's run of the same name)."""
    return {f"seed{seed}": _paper_lr_parts(base, (lr,), seed=seed)["adamw"] for seed in range(3)}


def _runs(base: dict, optimizers, symmetries, activations, seeds, hp=HP) -> list[RunConfig]:
    return [RunConfig(optimizer=o, symmetry=s, activation=a, seed=seed,
                      optimizer_hp=dict(hp[o]), **base)
            for seed in seeds for a in activations for o in optimizers for s in symmetries]


def _gpu_parts() -> dict[str, list[RunConfig]]:
    """One part per seed: 12 PReLU runs (4 optimizers x 3 symmetries) and 4 GELU runs (ECD and
    AdamW, symmetric and bqv), trained concurrently (``--workers 16``)."""
    return {f"seed{s}": _runs(GPU, ["ecd", "adamw", "sgdm", "soap"], ["symmetric", "bq", "bqv"],
                              ["prelu"], [s])
            + _runs(GPU, ["ecd", "adamw"], ["symmetric", "bqv"], ["gelu"], [s])
            for s in range(3)}


def _sweep_parts() -> dict[str, list[RunConfig]]:
    base = dict(GPU, steps=600)
    ecd = [RunConfig(optimizer="ecd", symmetry=s, seed=0, **base, tag=f"lr={lr:g}-F0={F0:g}",
                     optimizer_hp=dict(HP["ecd"], lr=lr, F0=F0))
           for s in ["symmetric", "bqv"] for lr in (0.5, 1.0, 2.0) for F0 in (1.0, 2.0)]
    adamw = [RunConfig(optimizer="adamw", symmetry=s, seed=0, **base, tag=f"lr={lr:g}",
                       optimizer_hp=dict(HP["adamw"], lr=lr))
             for s in ["symmetric", "bqv"] for lr in (3e-4, 1e-3, 3e-3)]
    return {"sweep": ecd + adamw}


#: What each preset is for, and where it runs (``--list`` prints it).
PRESET_PURPOSES = {
    "cpu-smoke": "the pipeline end to end on a tiny model (seconds, CPU)",
    "cpu-small": "a small model for a few hundred steps (minutes a run, CPU)",
    "gpu": "the first recorded GPU grid, results/gpu/seed0 (GPU)",
    "sweep": "ECD's (lr, F0) and AdamW's lr on the gpu model, 600 steps (GPU)",
    "paper": "the paper's protocol at reduced scale, 28,000 steps a run (GPU, bf16, compiled)",
    "paper-smoke": "paper's 21 runs on the tiny model for 40 steps: a pipeline check (CPU)",
    "paper-cpu": "paper's 21 runs on the tiny model for 5,000 steps (about 20 min, 2 cores)",
    "paper-lr": "AdamW's learning rate for paper, 4 rates x 2 symmetries (GPU)",
    "paper-cpu-lr": "AdamW's and ECD's learning rates for paper-cpu (CPU)",
    "paper-cpu-tuned": "paper-cpu's AdamW at its best rate, 3 seeds (CPU)",
}


def presets() -> dict[str, dict[str, list[RunConfig]]]:
    """Every preset: ``{preset: {part: [RunConfig, ...]}}``."""
    return {
        "cpu-smoke": {"all": _runs(SMOKE, ["ecd", "adamw"], ["symmetric", "bqv"], ["prelu"], [0])},
        "cpu-small": {"all": _runs(SMALL, ["ecd", "adamw", "sgdm"], ["symmetric", "bqv"],
                                   ["prelu"], [0])},
        "gpu": _gpu_parts(),
        "sweep": _sweep_parts(),
        "paper": _paper_parts(PAPER, by_arm=True),
        "paper-smoke": _paper_parts(PAPER_SMOKE, by_arm=True),
        "paper-cpu": _paper_parts(PAPER_CPU),
        "paper-lr": _paper_lr_parts(PAPER),
        "paper-cpu-lr": _paper_lr_parts(PAPER_CPU, (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2),
                                        ecd_rates=(0.3, 3.0, 10.0)),
        "paper-cpu-tuned": _paper_tuned_parts(PAPER_CPU, PAPER_CPU_ADAMW_LR),
    }


def _parts(preset: str) -> dict[str, list[RunConfig]]:
    """``presets()[preset]``; an unknown name lists the valid ones."""
    table = presets()
    if preset not in table:
        raise ValueError(f"unknown preset {preset!r}; valid presets: {sorted(table)}")
    return table[preset]


def select_runs(preset: str, part: str | None = None) -> list[RunConfig]:
    """The runs of ``preset``: all parts, one, or several separated by commas
    (``"seed1,seed2"``; ``--batched`` then trains each arm of them as one cohort); unknown names
    list the valid ones."""
    parts = _parts(preset)
    if part is None:
        return [run for runs in parts.values() for run in runs]
    names = part.split(",")
    for name in names:
        if name not in parts:
            raise ValueError(f"preset {preset!r} has no part {name!r}; valid parts: "
                             f"{sorted(parts)}")
    if len(set(names)) < len(names):
        raise ValueError(f"part {part!r} names a part twice")
    return [run for name in names for run in parts[name]]


def bias_pace(benchmark: dict, *, activation: str = "prelu") -> float:
    """What the biases cost in a grid benchmark (``benchmarks/bench_grid.py``): the steady-state
    tokens/s of the AdamW run with ``bqv`` over that of its symmetric twin (same ``activation``,
    seed and tag), both trained as separate processes at the same time. The runs are told apart
    by the configs of the benchmark's ``preset`` and ``part``; ValueError unless its separate
    phase holds exactly one such pair."""
    speed = benchmark.get("separate", {}).get("per_run_tokens_per_s", {})
    pairs: dict[tuple, dict[str, str]] = {}  # (seed, tag) -> {symmetry: run name}
    for c in select_runs(benchmark["preset"], benchmark["part"]):
        if c.optimizer == "adamw" and c.activation == activation and c.name in speed:
            pairs.setdefault((c.seed, c.tag), {})[c.symmetry] = c.name
    complete = [p for p in pairs.values() if {"symmetric", "bqv"} <= set(p)]
    if len(complete) != 1:
        raise ValueError(f"the benchmark's separate phase has {len(complete)} pairs of "
                         f"symmetric and bqv {activation} AdamW runs of one seed and tag, not "
                         f"one (parts {benchmark['part']!r} of preset {benchmark['preset']!r})")
    (pair,) = complete
    return speed[pair["bqv"]] / speed[pair["symmetric"]]


def plan_parts(preset: str, recorded, wall_s: float, margin: float = 0.9, *,
               at_least_one: bool = True) -> list[str]:
    """The parts of ``preset`` for the next ``wall_s`` seconds: those without complete results
    in ``recorded`` (a folder, or several: a run's result in a later one replaces an earlier
    one), in order, as many as fit. A part's time is estimated from the recorded runs: a run's
    ``wall_s`` scaled to all its steps (``steps / steps_done``, for a truncated run), divided by
    the number of parts its cohort trained at once; the slowest run gives the part's time ``t``,
    and ``k`` parts fit when ``k t <= margin * wall_s`` (linear in the number of members, as on
    a saturated device: cautious where the host limits a step). Without recorded runs, one part;
    with every part complete, none; where not even one fits, one, or none if not
    ``at_least_one``."""
    table = _parts(preset)
    part_of = {cfg.name: part for part, runs in table.items() for cfg in runs}
    folders = [recorded] if isinstance(recorded, (str, Path)) else list(recorded)
    results = {}
    for folder in folders:
        for cfg in (c for runs in table.values() for c in runs):
            path = Path(folder) / f"{cfg.name}.json"
            if path.exists():
                results[cfg.name] = read_run(path)
    missing, per_part = [], []
    for part, runs in table.items():
        complete = True
        for cfg in runs:
            run = results.get(cfg.name)
            complete = complete and run is not None and run.complete
            if run and run["steps_done"] > 0:
                # older files (results/gpu/seed0) lack "trained_with": one part at once
                cohort = run.data.get("trained_with") or [cfg.name]
                parts_at_once = len({part_of.get(n, part) for n in cohort})
                full = run["wall_s"] * run["config"]["steps"] / run["steps_done"]
                per_part.append(full / parts_at_once)
        if not complete:
            missing.append(part)
    if not per_part:
        return missing[:1]
    count = int(margin * wall_s // max(per_part))
    return missing[:max(count, int(at_least_one))]


# ----------------------------------------------------------------------------- orchestration

def _worker(queue, out: str, device: str, position: int, batched: bool,
            data_workers: int, cuda_graphs: bool, threads: int) -> None:
    """Take cohorts (lists of runs) from ``queue`` until a ``None``; a failing cohort is recorded
    in ``<out>/<name>.error.json`` for each of its runs and does not stop the others. Ctrl-C
    (which reaches every worker) stops it quietly: the parent reports. ``threads``: this
    worker's share of the host's threads (with all of them each, two workers on two cores
    trained about 12 times slower, their threads waiting for each other)."""
    signal.signal(signal.SIGINT, _interrupt_once)
    torch.set_num_threads(threads)
    try:
        while (item := queue.get()) is not None:
            cfgs = [RunConfig.from_dict(c) for c in item]
            try:
                _train_cohort(cfgs, Path(out), device, batched, position=position,
                              data_workers=data_workers, cuda_graphs=cuda_graphs)
            except RunFileConflict as error:  # the parent reports it with the failures
                _record_failure(cfgs, Path(out), error)
    except KeyboardInterrupt:
        return


def _interrupt_once(signum, frame) -> None:
    """A worker's SIGINT handler: KeyboardInterrupt, then SIGINT ignored, so that the cleanup
    that follows (progress bars, prefetching threads, the run's lock) is not interrupted when
    the parent repeats its signal. Installed by each worker itself: a runner started with SIGINT
    ignored (a background job of a script) passes that on, and its workers ignored the parent's
    signal, were killed after the grace period, and left their locks to the resource tracker."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def _train_cohort(cfgs, out: Path, device: str, batched: bool, **kw) -> None:
    """Train one cohort. A failure in training is recorded (:func:`_record_failure`) and does
    not stop the next cohort; a :class:`RunFileConflict` (a file of other settings) is raised."""
    try:
        if batched:
            train_batched(cfgs, out, device, **kw)
        else:
            train(cfgs[0], out, device, **kw)
    except RunFileConflict:
        raise
    except Exception as error:  # noqa: BLE001 - reported in a file, then the next cohort
        _record_failure(cfgs, out, error)


def _record_failure(cfgs, out: Path, error: Exception) -> None:
    """``<out>/<name>.error.json`` for each run of the cohort: the error, its traceback and the
    run's config; a line on stderr."""
    for cfg in cfgs:
        write_json_atomic(out / f"{cfg.name}.error.json",
                          {"name": cfg.name, "error": repr(error),
                           "traceback": "".join(traceback.format_exception(error)),
                           "config": dataclasses.asdict(cfg)})
    print(f"{[c.name for c in cfgs]} failed: {error!r}", file=sys.stderr)


@contextlib.contextmanager
def _terminate_as_interrupt():
    """SIGTERM (``kill``, ``timeout``) and SIGHUP (a closed terminal) raise KeyboardInterrupt,
    as Ctrl-C does: the runner stops its worker processes, ends its progress bars and says how
    to resume. (Signal handlers belong to the main thread; elsewhere nothing changes.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    saved = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def run_many(runs: list[RunConfig], out: str | Path, device: str = "cpu", workers: int = 1, *,
             batched: bool = False, data_workers: int = 0, cuda_graphs: bool = False) -> None:
    """Train ``runs`` into the folder ``out``, alone or (``batched``) grouped into batched
    cohorts (:func:`gaugebook.training.cohorts`); with ``workers > 1`` that many processes share
    the device (useful when one run or cohort does not fill a GPU). A run that fails does not
    stop the others; RuntimeError at the end names the failed ones."""
    check_distinct_names(runs)
    out = Path(out)
    groups = cohorts(runs) if batched else [[cfg] for cfg in runs]
    crashed = False
    with _terminate_as_interrupt():
        if workers <= 1:
            for group in groups:
                _train_cohort(group, out, device, batched, data_workers=data_workers,
                              cuda_graphs=cuda_graphs)
        else:
            crashed = _train_in_processes(groups, out, device, workers, batched=batched,
                                          data_workers=data_workers, cuda_graphs=cuda_graphs)
    _report_failures(runs, out, crashed)


STOP_GRACE_S = 15.0  # seconds the workers have, together, to stop after Ctrl-C (on a busy
# machine a worker takes several to start listening or to shut down); then they are terminated


def _train_in_processes(groups, out: Path, device: str, workers: int, *, batched: bool,
                        data_workers: int, cuda_graphs: bool) -> bool:
    """Train the cohorts ``groups`` in ``workers`` processes, each taking the next cohort when
    it is done; whether a worker crashed."""
    ctx = torch.multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    for group in groups:
        queue.put([dataclasses.asdict(cfg) for cfg in group])
    for _ in range(workers):
        queue.put(None)
    threads = max(1, torch.get_num_threads() // workers)
    procs = [ctx.Process(target=_worker, args=(queue, str(out), device, i + 1, batched,
                                               data_workers, cuda_graphs, threads))
             for i in range(workers)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join()
    except KeyboardInterrupt:  # Ctrl-C reaches the workers too; SIGTERM or SIGHUP reached
        # this process alone: the workers are told by SIGINT, repeated while they run (one still
        # starting does not listen yet; each takes only the first), then stopped
        deadline = time.monotonic() + STOP_GRACE_S
        while (alive := [p for p in procs if p.is_alive()]) and time.monotonic() < deadline:
            for p in alive:
                os.kill(p.pid, signal.SIGINT)
            alive[0].join(timeout=0.5)
        for p in procs:
            p.terminate()
        raise
    return any(p.exitcode for p in procs)


class _RunsFailed(RuntimeError):
    """Runs of this call failed in training (each recorded) or a worker crashed: the command
    line prints the message alone, while any other error keeps its traceback."""


def _report_failures(runs: list[RunConfig], out: Path, crashed: bool = False) -> None:
    """:class:`_RunsFailed` (a RuntimeError) naming this call's failed runs (their
    ``.error.json``; a success removes its run's) or a crashed worker."""
    failed = [cfg.name for cfg in runs if (out / f"{cfg.name}.error.json").exists()]
    if failed:
        raise _RunsFailed(f"{len(failed)} of {len(runs)} runs failed: {', '.join(failed)}; "
                           f"the error and traceback of each are in {out}/<run>.error.json "
                           "(rerun the same command to train them again)")
    if crashed:
        raise _RunsFailed("a worker process crashed (killed, or out of memory?): rerun the "
                           "same command to resume")


def main(argv=None) -> None:
    """The command line ``python -m gaugebook.experiment`` (``--help`` lists its options)."""
    parser = argparse.ArgumentParser(prog="python -m gaugebook.experiment", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", help=f"one of {sorted(presets())} (required unless --list)")
    parser.add_argument("--part", default=None,
                        help="a part of the preset, or several separated by commas (default: all)")
    parser.add_argument("--out", type=Path, default=None,
                        help="results folder (default runs/PRESET)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cpu or cuda[:i] (default: cuda if available, else cpu)")
    parser.add_argument("--workers", type=int, default=1,
                        help="concurrent runs (or, with --batched, cohorts) on the device")
    parser.add_argument("--batched", action="store_true",
                        help="train the runs that share an optimizer setting and a model shape "
                             "as one batched model (ECD, AdamW, SGDM)")
    parser.add_argument("--data-workers", type=int, default=0, metavar="N",
                        help="processes that prefetch the training batches of each run or "
                             "cohort (default 0: none)")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="capture each run's (or cohort's) whole training step as a CUDA "
                             "graph and replay it (CUDA: the same numbers, one launch per step)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a run setting for every run, e.g. --set max_wall_s=200 "
                             "(VALUE is read as JSON where it parses, else as a string; the "
                             "string settings, e.g. tag, are always strings; mu_v applies to "
                             "the bqv runs)")
    parser.add_argument("--list", action="store_true",
                        help="list the runs of --preset (or every preset and its parts) and exit")
    args = parser.parse_args(argv)
    if args.preset is None:
        if not args.list:
            parser.error(f"--preset is required; valid presets: {sorted(presets())}")
        for preset, parts in presets().items():
            print(f"{preset}: " + ", ".join(f"{part} ({len(runs)} runs)"
                                            for part, runs in parts.items()))
            print(f"    {PRESET_PURPOSES[preset]}")
        return
    distributed = int(os.environ.get("WORLD_SIZE", 1)) > 1
    try:
        runs = [override(cfg, args.set) for cfg in select_runs(args.preset, args.part)]
        if any(a.startswith("mu_v=") for a in args.set) and not any(
                cfg.symmetry == "bqv" for cfg in runs):
            raise ValueError("--set mu_v: the mean of the value bias is a setting of the bqv "
                             "runs, and this selection has none")
        check_distinct_names(runs)
        if args.batched:
            cohorts(runs)  # refuses optimizers that do not batch, before any training
        if args.workers < 1 or args.data_workers < 0:
            raise ValueError("--workers must be >= 1 and --data-workers >= 0")
        if distributed and (args.batched or args.workers > 1):
            raise ValueError("under torchrun every process trains its share of each run in "
                             "turn: drop --batched and --workers")
        if args.list:
            for cfg in runs:
                print(cfg.name)
            return
        out = args.out or Path("runs") / args.preset
        check_runs(runs, out, args.device, args.cuda_graphs)
        done = existing_results(runs, out)  # refuses results written with other settings
        if not distributed:  # another process training one of these runs: say so now
            with run_locks(out, runs):
                pass
    except (ValueError, RuntimeError) as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")  # a message naming the fix, no usage
    first = int(os.environ.get("RANK", 0)) == 0  # the process that reports
    stale = _other_checkpoints(runs, out, args.batched, done)
    if stale and first:
        print(f"note: {len(stale)} checkpoint(s) in {out / 'checkpoints'} belong to no run or "
              f"cohort of this call ({', '.join(p.name for p in stale)}): a checkpoint resumes "
              "only under the command that wrote it (the same runs, with or without --batched "
              "as then)", file=sys.stderr)
    if done and first:
        cut = sum(bool(result.get("truncated")) for result in done.values())
        print(f"{len(done)} of {len(runs)} runs already finished in {out}"
              + (f" ({cut} of them cut short by max_wall_s)" if cut else "")
              + ": skipped (delete a result to train its run again)", file=sys.stderr)
    try:
        _run(args, runs, out, distributed)
    except RunFileConflict as e:  # a checkpoint met in training: the runs before it are saved
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    except _RunsFailed as e:  # recorded in their error files; the other runs are saved
        parser.exit(1, f"{parser.prog}: error: {e}\n")
    except KeyboardInterrupt:
        print(_interrupted(out), file=sys.stderr)
        sys.exit(130)
    if first:
        print(_summary(runs, out), file=sys.stderr)


def _run(args: argparse.Namespace, runs: list[RunConfig], out: Path, distributed: bool) -> None:
    """Train ``runs`` as the command line asks: one share per process under torchrun, else
    :func:`run_many`."""
    if distributed:
        device = args.device
        if device.startswith("cuda"):
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
            torch.cuda.set_device(device)  # before the process group: NCCL binds to it
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
        for cfg in runs:
            train(cfg, out, device, data_workers=args.data_workers)
        dist.destroy_process_group()
        return
    run_many(runs, out, args.device, args.workers, batched=args.batched,
             data_workers=args.data_workers, cuda_graphs=args.cuda_graphs)


def _other_checkpoints(runs: list[RunConfig], out: Path, batched: bool,
                       done: dict) -> list[Path]:
    """The checkpoints in ``out`` that none of this call's runs or cohorts would resume: written
    by another ``--part``, or with(out) ``--batched`` (a cohort's is named after its runs, and
    after those left to train when some have finished)."""
    groups = cohorts(runs) if batched else [[cfg] for cfg in runs]
    planned = {checkpoint_path(out, group, batched) for group in groups}
    planned |= {checkpoint_path(out, todo, batched) for group in groups
                if (todo := [cfg for cfg in group if cfg.name not in done])}
    return sorted(set((out / "checkpoints").glob("*.pt")) - planned)


def _summary(runs: list[RunConfig], out: Path) -> str:
    """The call's last lines: each run's steps and last validation loss, then the folder."""
    width = max(len(cfg.name) for cfg in runs)
    lines = [f"{'run':<{width}}  {'steps':>7}  val loss"]
    for cfg in runs:
        run = read_run(out / f"{cfg.name}.json")
        lines.append(f"{cfg.name:<{width}}  {run['steps_done']:>7}  "
                     f"{run.history['val_loss'][-1]:8.4f}"
                     + ("" if run.complete else "  (cut short by max_wall_s)"))
    return "\n".join([*lines, f"results in {out}"])


def _interrupted(out: Path) -> str:
    """The line that Ctrl-C prints: where the newest checkpoint is, and how to resume."""
    checkpoints = sorted((out / "checkpoints").glob("*.pt"), key=lambda p: p.stat().st_mtime)
    where = (f"the latest checkpoint is {checkpoints[-1]}" if checkpoints
             else f"no checkpoint in {out / 'checkpoints'} yet (finished runs are kept)")
    return f"interrupted: {where}; rerun the same command to resume"


if __name__ == "__main__":
    main()
