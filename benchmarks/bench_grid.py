"""Grid benchmark: parts of a preset on one device, trained batched against separate
processes; ECD's step against fused AdamW's, alone and stacked; the cost of the biases.

1. Aggregate tokens/s of the parts' runs trained (a) batched (``--batched``: one process per
   cohort, the cohorts concurrently) and (b) as one process per run, all concurrently. Each run is
   timed in its steady state, between its evaluations at steps N and 2N (the first N steps absorb
   compilation); the aggregate is the sum over the runs, which train at the same time. The whole
   phase's tokens over its wall time (compilation included) are recorded too.
2. Median seconds of one ECD step (each projection among the part's ECD runs: its fused kernels
   where it takes them, and its PyTorch operators) and one fused AdamW step on the preset's
   model, alone and with the weights of R models stacked (``ECD(members=R)``, R the part's
   largest cohort): launched from Python, and on CUDA also captured as a CUDA graph and
   replayed (the device's time alone, as in training with ``--cuda-graphs``).
3. The cost of the biases: the steady-state tokens/s of the AdamW run with ``bqv`` over the
   symmetric one, both trained as separate processes in stage 1 at the same time (when the
   parts hold both).

Every ratio is measured in this run; ``--steps-only`` measures stage 2 alone (seconds). Usage::

    python benchmarks/bench_grid.py --device cuda --out benchmarks/results/grid_h200.json
    python benchmarks/bench_grid.py --device cpu --preset paper-smoke --steps 5 --out /tmp/g.json
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from torch.func import stack_module_state

from gaugebook.data import DefaultCorpus
from gaugebook.experiment import bias_pace, override, run_many, select_runs
from gaugebook.gpt import GPT
from gaugebook.optim import make_optimizer
from gaugebook.step_graph import CapturedStep
from gaugebook.run_files import provenance
from gaugebook.training import build_optimizer, cohorts, optimizer_state_bytes

from bench_training import median_call_seconds, median_step_seconds


def timing_runs(preset: str, part: str, steps: int):
    """The part's runs, shortened to ``2 steps`` with evaluations at ``steps`` and ``2 steps``."""
    return [override(cfg, [f"steps={2 * steps}", f"eval_every={steps}", "eval_batches=1",
                           "probe_instances=1", "checkpoint_every=1000000000",
                           "max_wall_s=null"])
            for cfg in select_runs(preset, part)]


def aggregate(runs, device: str, *, batched: bool, data_workers: int,
              cuda_graphs: bool) -> dict:
    """Train ``runs`` concurrently (batched cohorts, or one process per run) and sum their
    steady-state tokens/s."""
    workers = len(cohorts(runs)) if batched else len(runs)
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        run_many(runs, Path(out), device, workers, batched=batched, data_workers=data_workers,
                 cuda_graphs=cuda_graphs)
        wall = time.perf_counter() - start
        results = [json.loads(p.read_text()) for p in sorted(Path(out).glob("*.json"))]
    per_run = {}
    for r in results:
        h, cfg = r["history"], r["config"]
        tokens = (h["step"][-1] - h["step"][0]) * cfg["batch_size"] * cfg["block_size"]
        per_run[r["name"]] = tokens / (h["wall_s"][-1] - h["wall_s"][0])
    return {"processes": workers, "per_run_tokens_per_s": per_run,
            "tokens_per_s": sum(per_run.values()),
            "phase_tokens_per_s": sum(r["tokens"] for r in results) / wall, "phase_wall_s": wall}


def step_times(cfg, device: torch.device, members: int, reps: int) -> dict:
    """Median step seconds of ECD (``cfg``'s settings, ``members`` stacked models or one), its
    fused kernels (where it takes them: CUDA and Triton) against its PyTorch operators, and of
    fused AdamW, on the same weights and gradients."""
    corpus = DefaultCorpus(seed=0)
    models = []
    for seed in range(members):
        torch.manual_seed(seed)
        models.append(GPT(cfg.model_config(corpus.vocab_size)).to(device))
    if members == 1:
        named = dict(models[0].named_parameters())
    else:
        stacked, _ = stack_module_state(models)
        named = {n: p.detach().requires_grad_(True) for n, p in stacked.items()}
    for p in named.values():
        p.grad = 1e-3 * torch.randn_like(p)
    loss = torch.full((members,) if members > 1 else (), 5.0, device=device)
    ecd = {fused: build_optimizer(cfg, models[0], named, fused=fused,
                                  members=members if members > 1 else None)
           for fused in (None, False)}  # as the trainer builds it
    adamw = make_optimizer("adamw", list(named.values()), lr=1e-4)
    out = {"members": members, "projection": cfg.optimizer_hp.get("projection", "global"),
           "ecd_step_s": median_step_seconds(ecd[None], loss, device, reps),
           "ecd_fused": ecd[None]._kernels is not None,
           "ecd_operators_step_s": median_step_seconds(ecd[False], loss, device, reps),
           "adamw_step_s": median_step_seconds(adamw, loss, device, reps),
           "adamw_fused": bool(adamw.defaults.get("fused")),
           "ecd_state_bytes": optimizer_state_bytes(ecd[None]),
           "adamw_state_bytes": optimizer_state_bytes(adamw)}
    out["ecd_over_adamw"] = out["ecd_step_s"] / out["adamw_step_s"]
    if device.type == "cuda":
        out["ecd_replayed_step_s"] = replayed_step_seconds(ecd[None], loss, device, reps)
        out["ecd_operators_replayed_step_s"] = replayed_step_seconds(ecd[False], loss, device,
                                                                     reps)
        out["adamw_replayed_step_s"] = replayed_step_seconds(adamw, loss, device, reps)
        out["ecd_over_adamw_replayed"] = out["ecd_replayed_step_s"] / out["adamw_replayed_step_s"]
    return out


def replayed_step_seconds(opt, loss: torch.Tensor, device: torch.device, reps: int) -> float:
    """Median seconds of ``opt.step`` captured as a CUDA graph and replayed, each replay between
    two synchronisations: the update's time on the device, without the Python that launches its
    kernels. AdamW is switched to ``capturable`` (its step count on the device)."""
    for group in opt.param_groups:
        if "capturable" in group:
            group["capturable"] = True
    step = CapturedStep(lambda: opt.step(lambda: loss), device, label=type(opt).__name__)
    # untimed: the warm-up steps and the capture
    return median_call_seconds(step, device, reps, untimed=step.warmup + 1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--preset", default="paper")
    parser.add_argument("--part", default="seed0-pt,seed0-global,seed0-adamw",
                        help="the preset's parts, separated by commas")
    parser.add_argument("--steps", type=int, default=100,
                        help="N: warm-up steps, then N timed steps (per run)")
    parser.add_argument("--reps", type=int, default=30, help="timed optimizer steps")
    parser.add_argument("--data-workers", type=int, default=2)
    parser.add_argument("--steps-only", action="store_true",
                        help="measure only the optimizer steps (stage 2)")
    parser.add_argument("--skip-separate", action="store_true",
                        help="measure only the batched aggregate (not the separate processes)")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="train with the compiled model replayed as CUDA graphs")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    runs = timing_runs(args.preset, args.part, args.steps)
    results = {"preset": args.preset, "part": args.part, "steps": args.steps,
               "runs": [r.name for r in runs],
               "command": "python benchmarks/bench_grid.py " + " ".join(
                   f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}")
                   for k, v in vars(args).items() if v not in (None, False)),
               "provenance": provenance(device)}
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save():  # after every measurement, so a run cut short keeps what it measured
        args.out.write_text(json.dumps(results, indent=1, default=str))
        print(json.dumps({k: results[k] for k in results if k not in ("provenance", "runs")},
                         indent=1, default=str))

    ecd = {}  # the first ECD run of each projection
    for r in runs:
        if r.optimizer == "ecd":
            ecd.setdefault(r.optimizer_hp.get("projection", "global"), r)
    if not ecd:
        parser.error(f"part {args.part!r} of {args.preset!r} has no ECD run to time")
    largest = max(len(group) for group in cohorts(runs))
    results["step"] = []
    for cfg in ecd.values():
        for members in (1, largest):
            results["step"].append(step_times(cfg, device, members, args.reps))
            save()
    if args.steps_only:
        return
    engine = dict(data_workers=args.data_workers, cuda_graphs=args.cuda_graphs)
    results["batched"] = aggregate(runs, args.device, batched=True, **engine)
    save()
    if args.skip_separate:
        return
    results["separate"] = aggregate(runs, args.device, batched=False, **engine)
    results["batched_over_separate"] = (results["batched"]["tokens_per_s"]
                                        / results["separate"]["tokens_per_s"])
    save()
    try:
        results["bias"] = {"bqv_over_symmetric": bias_pace(results)}
    except ValueError as missing:
        print(f"{missing}: the bias stage is skipped")
        return
    save()


if __name__ == "__main__":
    main()
