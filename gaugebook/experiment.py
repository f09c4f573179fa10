"""The experiment runner: grids of (optimizer x symmetry x activation x seed) training runs.

A *preset* names *parts*; a part is a list of runs. Each run trains a reduced GPT-2 on the
default corpus and writes ``<out>/<run>.json`` atomically when it finishes; an existing result is
skipped, so parts accumulate into one results folder. Checkpoints (``<out>/checkpoints/``) are
written every ``checkpoint_every`` steps and an interrupted run resumes exactly (model, optimizer,
random state and data position are restored; the data stream is a pure function of seed and step).
Runs of one folder that differ only in other settings (a sweep's learning rates) need distinct
``tag``s (``--set tag=...``): a result or checkpoint written for other settings is refused.

Command line::

    python -m gaugebook.experiment --preset cpu-smoke --out runs/smoke
    python -m gaugebook.experiment --preset gpu --part seed0 --out results/gpu --workers 16
    torchrun --nproc_per_node 2 -m gaugebook.experiment --preset cpu-smoke --out runs/ddp
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import random
import string
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from gaugebook import mechanics
from gaugebook.data import MIN_PROBE_CONTEXT, DefaultCorpus, evaluate_probes
from gaugebook.gpt import ACTIVATIONS, GPT, GPTConfig
from gaugebook.optim import OPTIMIZERS, make_optimizer

SYMMETRIES = {"symmetric": None, "bq": "bq", "bqv": "bqv"}


def _is_real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


POSITIVE_INTS = ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "steps", "eval_every",
                 "eval_batches", "probe_instances", "checkpoint_every")
TAG_CHARACTERS = set(string.ascii_letters + string.digits + "._=-")
MAX_TAG_LENGTH = 40


@dataclass
class RunConfig:
    """Everything that defines one training run. Its ``name`` (the result's file name) is
    optimizer-symmetry-activation-seed, plus ``tag`` when given: runs of one folder that differ in
    anything else (a sweep's learning rates) need distinct tags."""

    optimizer: str
    symmetry: str = "symmetric"
    activation: str = "prelu"
    seed: int = 0
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    block_size: int = 32
    batch_size: int = 8
    steps: int = 30
    optimizer_hp: dict = field(default_factory=dict)
    mu_v: float = 0.0
    eval_every: int = 10
    eval_batches: int = 2
    probe_instances: int = 16
    checkpoint_every: int = 50
    autocast_bf16: bool = False
    compile: bool = False
    max_wall_s: float | None = None
    tag: str = ""

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; valid: {sorted(OPTIMIZERS)}")
        if self.symmetry not in SYMMETRIES:
            raise ValueError(f"unknown symmetry {self.symmetry!r}; valid: {sorted(SYMMETRIES)}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {self.activation!r}; valid: {list(ACTIVATIONS)}")
        for key in ("seed", *POSITIVE_INTS):
            value, low = getattr(self, key), 0 if key == "seed" else 1
            if type(value) is not int or value < low:
                raise ValueError(f"{key} must be an integer >= {low}, got {value!r}")
        if self.block_size < MIN_PROBE_CONTEXT:
            raise ValueError(f"block_size must be >= {MIN_PROBE_CONTEXT} (the context of the "
                             f"probes evaluated after training), got {self.block_size}")
        if not isinstance(self.optimizer_hp, dict):
            raise ValueError(f"optimizer_hp must be a dict, got {self.optimizer_hp!r}")
        if not _is_real(self.mu_v) or not math.isfinite(self.mu_v):
            raise ValueError(f"mu_v must be a finite number, got {self.mu_v!r}")
        for key in ("autocast_bf16", "compile"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"{key} must be true or false, got {getattr(self, key)!r}")
        if self.max_wall_s is not None and not (_is_real(self.max_wall_s) and self.max_wall_s > 0):
            raise ValueError(f"max_wall_s must be None or a positive number of seconds, "
                             f"got {self.max_wall_s!r}")
        if not isinstance(self.tag, str) or len(self.tag) > MAX_TAG_LENGTH \
                or not set(self.tag) <= TAG_CHARACTERS:
            raise ValueError(f"tag must be a string of at most {MAX_TAG_LENGTH} characters from "
                             f"A-Z a-z 0-9 . _ = -, got {self.tag!r}")

    @property
    def name(self) -> str:
        name = f"{self.optimizer}-{self.symmetry}-{self.activation}-s{self.seed}"
        return f"{name}-{self.tag}" if self.tag else name

    @classmethod
    def from_dict(cls, values: dict) -> "RunConfig":
        valid = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - valid)
        if unknown:
            raise ValueError(f"unknown run config key(s) {unknown}; valid keys: {sorted(valid)}")
        return cls(**values)


# Optimizer settings. The paper's (124M model, 500M tokens): ECD lr 1 (dt 0.1), eta 100,
# F0 ~ 0.6 x final loss; AdamW lr 1e-4, betas (0.9, 0.95); SGDM lr 0.03, momentum 0.95
# (Nesterov); SOAP lr 3e-4, betas (0.95, 0.95). Here ECD and SGDM keep the paper's values (F0 = 1.5
# sits below the losses our short runs reach), and the adaptive methods take 10x the paper's lr,
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


def presets() -> dict[str, dict[str, list[RunConfig]]]:
    """Every preset: ``{preset: {part: [RunConfig, ...]}}``."""
    return {
        "cpu-smoke": {"all": _runs(SMOKE, ["ecd", "adamw"], ["symmetric", "bqv"], ["prelu"], [0])},
        "cpu-small": {"all": _runs(SMALL, ["ecd", "adamw", "sgdm"], ["symmetric", "bqv"],
                                   ["prelu"], [0])},
        "gpu": _gpu_parts(),
        "sweep": _sweep_parts(),
    }


def select_runs(preset: str, part: str | None = None) -> list[RunConfig]:
    """The runs of ``preset`` (all parts, or one); unknown names list the valid ones."""
    table = presets()
    if preset not in table:
        raise ValueError(f"unknown preset {preset!r}; valid presets: {sorted(table)}")
    parts = table[preset]
    if part is None:
        return [run for runs in parts.values() for run in runs]
    if part not in parts:
        raise ValueError(f"preset {preset!r} has no part {part!r}; valid parts: {sorted(parts)}")
    return parts[part]


def override(cfg: RunConfig, assignments: list[str]) -> RunConfig:
    """A copy of ``cfg`` with ``KEY=VALUE`` assignments applied (unknown keys are an error).
    VALUE is read as JSON where it parses, except for the string settings (``tag=1e-3`` is the
    tag ``"1e-3"``)."""
    values = dataclasses.asdict(cfg)
    strings = {f.name for f in dataclasses.fields(RunConfig) if f.type == "str"}
    for item in assignments:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        try:
            values[key] = raw if key in strings else json.loads(raw)
        except json.JSONDecodeError:
            values[key] = raw
    return RunConfig.from_dict(values)


# ----------------------------------------------------------------------------- provenance

def _git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True,
                          cwd=Path(__file__).parent, check=True).stdout.strip()


def _cpu_name() -> str:
    """The processor's model name (from /proc/cpuinfo on Linux) and its number of cores."""
    name = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{name or 'cpu'} ({os.cpu_count()} cores)"


def provenance(device: torch.device) -> dict:
    """Where and with what a result was produced. ``git_dirty``: tracked files differed from the
    commit (``None`` where git is unavailable and the commit comes from ``GAUGEBOOK_COMMIT``)."""
    try:
        commit, dirty = _git("rev-parse", "HEAD"), bool(_git("status", "--porcelain",
                                                            "--untracked-files=no"))
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = os.environ.get("GAUGEBOOK_COMMIT", "unknown"), None
    return {
        "git_commit": commit,
        "git_dirty": dirty,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name(),
        "hostname_platform": platform.platform(),
        "world_size": dist.get_world_size() if dist.is_initialized() else 1,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_json_atomic(path: Path, payload: dict) -> None:
    """Write to a temporary file in the same folder, then rename: never a half-written result."""
    tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(payload, indent=1))
    os.replace(tmp, path)


def _save_atomic(obj, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- training

def _rank_world() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def _rng_state(device) -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": np.random.get_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict, device) -> None:
    """Restore :func:`_rng_state` (torch wants its generator states as CPU byte tensors)."""
    torch.set_rng_state(state["torch"].cpu())
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)


def _as_json(config: dict) -> dict:
    """``config`` as it reads back from JSON (tuples become lists)."""
    return json.loads(json.dumps(config))


def _check_same_config(cfg: RunConfig, stored: dict | None, path: Path) -> None:
    """ValueError when ``path`` (a result or checkpoint of ``cfg.name``) was written for another
    configuration; ``stored`` ``None`` (a checkpoint from before configs were saved) passes."""
    if stored is None:
        return
    expected = _as_json(dataclasses.asdict(cfg))
    stored = _as_json(dataclasses.asdict(RunConfig.from_dict(stored)))  # fills newer fields
    differing = [f"{k}: {stored[k]!r} there, {expected[k]!r} here"
                 for k in sorted(expected) if stored[k] != expected[k]]
    if differing:
        raise ValueError(f"{path} holds run {cfg.name} with other settings ({'; '.join(differing)})"
                         ": write to another --out, or give this run a tag (--set tag=...)")


def _model_config(cfg: RunConfig, corpus: DefaultCorpus) -> GPTConfig:
    return GPTConfig(vocab_size=corpus.vocab_size, block_size=cfg.block_size, n_layer=cfg.n_layer,
                     n_head=cfg.n_head, n_embd=cfg.n_embd, activation=cfg.activation,
                     symmetry_breaking=SYMMETRIES[cfg.symmetry], mu_v=cfg.mu_v)


def _charge_norms(model: GPT, before: dict, after: dict) -> dict:
    """Mean Frobenius norm of the Noether charges J_QK, J_VO per layer, with the last step's
    parameter change as the velocity (optimizer-agnostic)."""
    velocity = {name: after[name] - before[name] for name in after}
    sectors = mechanics.charges(model, velocity).values()
    return {"J_QK": float(np.mean([s.qk_norm.mean().item() for s in sectors])),
            "J_VO": float(np.mean([s.vo_norm.mean().item() for s in sectors]))}


def _evaluate(model, corpus, cfg, device, autocast) -> float:
    """Mean validation loss over ``eval_batches`` fixed held-out batches (eval mode: mean biases)."""
    model.eval()
    losses = []
    with torch.no_grad(), autocast():
        for i in range(cfg.eval_batches):
            x, y = corpus.batch(i, cfg.batch_size, cfg.block_size, split="val", device=device)[:2]
            losses.append(model(x, y)[1].float().item())
    model.train()
    return float(np.mean(losses))


def _out_of_time(cfg: RunConfig, start: float, device, world: int) -> bool:
    """Whether ``max_wall_s`` has passed since ``start``, by rank 0's clock (all ranks agree)."""
    if cfg.max_wall_s is None:
        return False
    over = time.perf_counter() - start > cfg.max_wall_s
    if world > 1:
        flag = torch.tensor(float(over), device=device)
        dist.broadcast(flag, src=0)
        over = bool(flag.item())
    return over


def train(cfg: RunConfig, out: Path, device: torch.device | str = "cpu", *,
          position: int = 0, stop_after: int | None = None, progress: bool = True) -> dict | None:
    """Train one run and write ``<out>/<name>.json``; return the result (``None`` if stopped early
    by ``stop_after``, which simulates an interruption in tests). ``progress=False`` hides the
    progress bar.

    An existing result or checkpoint of the same name must hold the same configuration
    (ValueError otherwise): the result is returned, the checkpoint resumed. A run stopped by
    ``max_wall_s`` is evaluated at its last step (``truncated``: true). ``peak_memory_bytes`` is
    the peak of allocated device memory on CUDA; on the CPU it is the process's peak resident set
    size since it started (everything the process did, not only this run)."""
    device = torch.device(device)
    rank, world = _rank_world()
    out.mkdir(parents=True, exist_ok=True)
    result_path = out / f"{cfg.name}.json"
    if result_path.exists():
        result = json.loads(result_path.read_text())
        _check_same_config(cfg, result.get("config"), result_path)
        return result
    if cfg.batch_size % world:
        raise ValueError(f"batch_size {cfg.batch_size} is not divisible by world size {world}")
    ckpt_dir = out / "checkpoints"
    ckpt_path = ckpt_dir / f"{cfg.name}.pt"

    torch.manual_seed(cfg.seed)
    corpus = DefaultCorpus(seed=cfg.seed)
    model = GPT(_model_config(cfg, corpus)).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    # Muon sends 2-D weights to Muon and the rest (embeddings by name) to AdamW: it needs names.
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    optimizer = make_optimizer(cfg.optimizer, named if cfg.optimizer == "muon" else params,
                               **cfg.optimizer_hp)
    train_model = model
    if world > 1:
        train_model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    if cfg.compile:
        train_model = torch.compile(train_model)

    def autocast():
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.autocast_bf16)

    history = {"step": [], "train_loss": [], "val_loss": [], "J_QK": [], "J_VO": [], "wall_s": []}
    step, elapsed, tokens = 0, 0.0, 0
    # summed training loss since the last measurement, and the step it started at
    window, history_start = None, 0
    if ckpt_path.exists():
        # on the CPU: random states must stay there; load_state_dict moves the rest
        ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        _check_same_config(cfg, ckpt.get("config"), ckpt_path)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        step, elapsed, tokens, history = ckpt["step"], ckpt["elapsed"], ckpt["tokens"], ckpt["history"]
        _set_rng_state(ckpt["rng"], device)
        window, history_start = ckpt["window"]
        window = None if window is None else window.to(device)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    local = cfg.batch_size // world
    start = time.perf_counter() - elapsed
    bar = tqdm(total=cfg.steps, initial=step, desc=cfg.name, position=position, leave=position == 0,
               disable=rank != 0 or not progress, dynamic_ncols=True)
    final = False
    while not final:
        # the last step: the planned one, or the one in progress when the time budget runs out
        final = step + 1 >= cfg.steps or _out_of_time(cfg, start, device, world)
        x, y = corpus.batch(step, cfg.batch_size, cfg.block_size, split="train", device=device)[:2]
        x, y = x[rank * local:(rank + 1) * local], y[rank * local:(rank + 1) * local]

        def closure():
            optimizer.zero_grad(set_to_none=True)
            with autocast():
                loss = train_model(x, y)[1]
            loss.backward()
            return loss

        measure = (step + 1) % cfg.eval_every == 0 or final
        before = {n: p.detach().clone() for n, p in model.named_parameters()} if measure else None
        loss = optimizer.step(closure).detach().float()
        window = loss if window is None else window + loss  # on the device: no sync per step
        step += 1
        tokens += cfg.batch_size * cfg.block_size
        bar.update(1)
        if measure:
            if world > 1:
                dist.all_reduce(window)
                window /= world
            train_loss = window.item() / (step - history_start)
            if not math.isfinite(train_loss):
                raise FloatingPointError(f"{cfg.name}: non-finite training loss before step {step}")
            after = {n: p.detach() for n, p in model.named_parameters()}
            charges = _charge_norms(model, before, after)
            history["step"].append(step)
            history["train_loss"].append(train_loss)
            history["val_loss"].append(_evaluate(model, corpus, cfg, device, autocast))
            history["J_QK"].append(charges["J_QK"])
            history["J_VO"].append(charges["J_VO"])
            history["wall_s"].append(time.perf_counter() - start)
            window, history_start = None, step
            bar.set_postfix(val=f"{history['val_loss'][-1]:.3f}")
        if rank == 0 and (step % cfg.checkpoint_every == 0) and not final:
            ckpt_dir.mkdir(exist_ok=True)
            _save_atomic({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                          "step": step, "elapsed": time.perf_counter() - start, "tokens": tokens,
                          "history": history, "window": (window, history_start),
                          "rng": _rng_state(device), "config": dataclasses.asdict(cfg)},
                         ckpt_path)
        if stop_after is not None and step >= stop_after:
            bar.close()
            return None
    bar.close()
    wall = time.perf_counter() - start
    model.eval()
    probes = evaluate_probes(model, corpus.tokenizer, n_per_task=cfg.probe_instances, device=device)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
    else:
        import resource
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result = {
        "name": cfg.name,
        "config": dataclasses.asdict(cfg),
        "steps_done": step,
        "truncated": step < cfg.steps,
        "history": history,
        "final_val_loss": history["val_loss"][-1] if history["val_loss"] else None,
        "probes": probes,
        "optimizer_state_bytes": optimizer_state_bytes(optimizer),
        "n_params": sum(p.numel() for p in params),
        "skipped_steps": getattr(optimizer, "skipped_steps", 0),
        "wall_s": wall,
        "tokens": tokens,
        "tokens_per_s": tokens / wall,
        "peak_memory_bytes": int(peak),
        "provenance": provenance(device),
    }
    if rank == 0:
        write_json_atomic(result_path, result)
        ckpt_path.unlink(missing_ok=True)
        (out / f"{cfg.name}.error.json").unlink(missing_ok=True)  # a failure of an earlier try
    return result


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


# ----------------------------------------------------------------------------- orchestration

def _worker(queue, out: str, device: str, position: int) -> None:
    """Take runs from ``queue`` until a ``None``; a failing run is recorded in
    ``<out>/<name>.error.json`` and does not stop the others."""
    while True:
        item = queue.get()
        if item is None:
            return
        cfg = RunConfig.from_dict(item)
        try:
            train(cfg, Path(out), device, position=position)
        except Exception as error:  # noqa: BLE001 - reported in a file, then the next run
            write_json_atomic(Path(out) / f"{cfg.name}.error.json",
                              {"name": cfg.name, "error": repr(error),
                               "config": dataclasses.asdict(cfg)})
            print(f"{cfg.name} failed: {error!r}", file=sys.stderr)


def run_many(runs: list[RunConfig], out: Path, device: str, workers: int = 1) -> None:
    """Train ``runs``; with ``workers > 1`` that many processes share the device (useful when one
    small run does not fill a GPU)."""
    if workers <= 1:
        for cfg in runs:
            train(cfg, out, device)
        return
    ctx = torch.multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    for cfg in runs:
        queue.put(dataclasses.asdict(cfg))
    for _ in range(workers):
        queue.put(None)
    procs = [ctx.Process(target=_worker, args=(queue, str(out), device, i + 1))
             for i in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    failed = sorted(path.name for path in out.glob("*.error.json"))
    if failed or any(p.exitcode for p in procs):
        raise RuntimeError(f"runs failed: {failed or 'a worker crashed'}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gaugebook.experiment", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", help=f"one of {sorted(presets())} (required unless --list)")
    parser.add_argument("--part", default=None, help="one part of the preset (default: all)")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default runs/PRESET)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--workers", type=int, default=1, help="concurrent runs on the device")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a run setting for every run, e.g. --set max_wall_s=200 "
                             "(VALUE is read as JSON where it parses, else as a string; the "
                             "string settings, e.g. tag, are always strings)")
    parser.add_argument("--list", action="store_true",
                        help="list the runs of --preset (or every preset and its parts) and exit")
    args = parser.parse_args(argv)
    if args.preset is None:
        if not args.list:
            parser.error(f"--preset is required; valid presets: {sorted(presets())}")
        for preset, parts in presets().items():
            print(f"{preset}: " + ", ".join(f"{part} ({len(runs)} runs)"
                                            for part, runs in parts.items()))
        return
    try:
        runs = [override(cfg, args.set) for cfg in select_runs(args.preset, args.part)]
    except ValueError as e:
        parser.error(str(e))
    if args.list:
        for cfg in runs:
            print(cfg.name)
        return
    out = args.out or Path("runs") / args.preset
    if "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1:
        device = args.device
        if device.startswith("cuda"):
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
            torch.cuda.set_device(device)  # before the process group: NCCL binds to it
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
        for cfg in runs:
            train(cfg, out, device)
        dist.destroy_process_group()
        return
    run_many(runs, out, args.device, args.workers)
    print(f"results in {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
