"""ECD step time of the working tree against an earlier commit's ECD, and fused AdamW, in one run.

The earlier ``gaugebook/optim.py`` is read with ``git show`` (or from ``--old-file``, a copy made
where git is available) and loaded as a separate module, so both versions step the same model
with the same gradients in one process. Only that file is the earlier one: what it imports from
``gaugebook`` (since 5 December: ``ecd_kernels``, ``checks``) comes from the working tree, so
the old fused path runs this tree's kernels; compare operator paths (``fused=False``) across
commits, or kernels within one tree. Each number is the median of
``--reps`` steps after three untimed ones. ``--projection per_tensor`` partitions as the preset
``paper`` does (GPT-2's tensors); ``--members R`` steps R stacked models, as a batched cohort
does (AdamW then steps the stacked parameters). ``--tiny`` keeps the model's 6 layers and 6 heads
at width 12 and a vocabulary of 64: the step then costs almost only its host-side work (the
operators it dispatches, which the result also counts), which is what limits a GPU step of a
small model; on a CPU add ``--segmented`` to take the GPU's way to the per-tensor dot products
(one segmented reduction instead of one BLAS dot per tensor and member). Usage::

    python benchmarks/bench_ecd_commits.py --old a5b7169 --out benchmarks/results/ecd_commits_cpu.json
    python benchmarks/bench_ecd_commits.py --old HEAD --projection per_tensor --members 3 --tiny \
        --segmented
    git show 303d9f3:gaugebook/optim.py > .whl/optim_303d9f3.py   # for a machine without git
    python benchmarks/bench_ecd_commits.py --old 303d9f3 --old-file .whl/optim_303d9f3.py --reps 50
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from bench_training import median_step_seconds  # this folder is on sys.path
from gaugebook import optim
from gaugebook.experiment import provenance
from gaugebook.gpt import GPT, GPTConfig

ROOT = Path(__file__).resolve().parents[1]
MODEL = GPTConfig(4096, 256, n_layer=6, n_head=6, n_embd=384)  # 12.6 M parameters
TINY = GPTConfig(64, 32, n_layer=6, n_head=6, n_embd=12)  # the same tensors, nearly no work
ECD_HP = dict(lr=1.0, eta=100.0, F0=0.0)


def optim_at(commit: str, file: Path | None = None):
    """``gaugebook/optim.py`` as it was at ``commit`` (or the copy ``file``), loaded as a module."""
    source = file.read_text() if file else subprocess.run(
        ["git", "show", f"{commit}:gaugebook/optim.py"], cwd=ROOT, check=True,
        capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / f"optim_{commit}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stacked_parameters(config: GPTConfig, members: int, device) -> dict[str, torch.Tensor]:
    """The benchmark model's parameters (``[members, ...]`` stacked when ``members > 1``), each
    with a fixed random gradient."""
    torch.manual_seed(0)
    model = GPT(config).to(device)
    params = {n: (p.detach().clone() if members == 1 else
                  torch.stack([p.detach()] * members)).requires_grad_(True)
              for n, p in model.named_parameters()}
    for p in params.values():
        p.grad = 1e-2 * torch.randn_like(p)
    return params


def median_step_ms(make_optimizer, config: GPTConfig, members: int, device: torch.device,
                   reps: int) -> tuple[float, float]:
    """Median milliseconds of ``step`` with fixed random gradients, and the operators one step
    dispatches (counted by torch's profiler)."""
    params = stacked_parameters(config, members, device)
    opt = make_optimizer(params)
    loss = torch.full((members,) if members > 1 else (), 3.0, device=device)
    ms = 1e3 * median_step_seconds(opt, loss, device, reps)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        opt.step(lambda: loss)
    ops = sum(e.name.startswith("aten::") and not (e.cpu_parent and e.cpu_parent.name.startswith(
        "aten::")) for e in prof.events())  # dispatched by the step, not inside an operator
    return ms, ops


def ecd_maker(module, projection: str, members: int, config: GPTConfig):
    """``params -> ECD`` of ``module`` (this tree's optim or an earlier one) in the given
    projection, over GPT-2's tensors for ``per_tensor``."""
    hp = dict(ECD_HP, projection=projection)
    if members > 1:
        hp["members"] = members

    def make(params):
        if projection == "per_tensor":
            groups = GPT(config).gpt2_tensors()
            hp["blocks"] = [[params[n] for n in group] for group in groups]
        return module.ECD(list(params.values()), **hp)
    return make


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", required=True, help="the earlier commit (any git revision)")
    parser.add_argument("--old-file", type=Path, help="that commit's optim.py, if git is absent")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--projection", choices=optim.PROJECTIONS, default="global")
    parser.add_argument("--members", type=int, default=1, help="stacked models (a cohort)")
    parser.add_argument("--tiny", action="store_true",
                        help="width 12, vocabulary 64: time the host-side work of a step")
    parser.add_argument("--segmented", action="store_true",
                        help="per-tensor dot products as off the CPU (one segmented reduction)")
    parser.add_argument("--out", type=Path, help="also write the result (with provenance) here")
    args = parser.parse_args(argv)
    if args.members < 1:
        parser.error(f"--members must be >= 1, got {args.members}")
    device, old = torch.device(args.device), optim_at(args.old, args.old_file)
    if args.segmented:  # the working tree's ECD reduces per tensor as it does on a GPU
        optim._segment_dots = functools.partial(optim._segment_dots, segmented=True)
    config = TINY if args.tiny else MODEL
    makers = {
        "adamw_fused": lambda ps: torch.optim.AdamW(list(ps.values()), lr=1e-3, fused=True),
        f"ecd_{args.old}": ecd_maker(old, args.projection, args.members, config),
        "ecd_working_tree": ecd_maker(optim, args.projection, args.members, config),
    }
    timed = {name: median_step_ms(make, config, args.members, device, args.reps)
             for name, make in makers.items()}
    ms = {name: t for name, (t, _) in timed.items()}
    result = {"step_ms": ms, "over_adamw": {k: v / ms["adamw_fused"] for k, v in ms.items()},
              "operators_per_step": {name: ops for name, (_, ops) in timed.items()},
              "model": dataclasses.asdict(config), "projection": args.projection,
              "members": args.members, "old_commit": args.old, "reps": args.reps,
              "command": "python benchmarks/bench_ecd_commits.py " + " ".join(argv or sys.argv[1:]),
              "provenance": provenance(device)}
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return result


if __name__ == "__main__":
    main()
