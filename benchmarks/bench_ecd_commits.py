"""ECD step time of the working tree against an earlier commit's ECD, and fused AdamW, in one run.

The earlier ``gaugebook/optim.py`` is read with ``git show`` (or from ``--old-file``, a copy made
where git is available) and loaded as a separate module (it imports only torch), so both versions
step the same model with the same gradients in one process. Each number is the median of
``--reps`` steps after three untimed ones. Usage::

    python benchmarks/bench_ecd_commits.py --old a5b7169 --out benchmarks/results/ecd_commits_cpu.json
    git show 303d9f3:gaugebook/optim.py > .whl/optim_303d9f3.py   # for a machine without git
    python benchmarks/bench_ecd_commits.py --old 303d9f3 --old-file .whl/optim_303d9f3.py --reps 50
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import tempfile
from pathlib import Path

import torch

from bench_training import median_step_seconds  # this folder is on sys.path
from gaugebook import optim
from gaugebook.experiment import provenance
from gaugebook.gpt import GPT, GPTConfig

ROOT = Path(__file__).resolve().parents[1]
MODEL = GPTConfig(4096, 256, n_layer=6, n_head=6, n_embd=384)  # 12.6 M parameters
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


def median_step_ms(make_optimizer, device: torch.device, reps: int) -> float:
    """Median milliseconds of ``step`` on the benchmark model with fixed random gradients."""
    torch.manual_seed(0)
    model = GPT(MODEL).to(device)
    for p in model.parameters():
        p.grad = 1e-2 * torch.randn_like(p)
    loss = torch.tensor(3.0, device=device)
    return 1e3 * median_step_seconds(make_optimizer(model.parameters()), loss, device, reps)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", required=True, help="the earlier commit (any git revision)")
    parser.add_argument("--old-file", type=Path, help="that commit's optim.py, if git is absent")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--out", type=Path, help="also write the result (with provenance) here")
    args = parser.parse_args(argv)
    device, old = torch.device(args.device), optim_at(args.old, args.old_file)
    ms = {
        "adamw_fused": median_step_ms(lambda ps: torch.optim.AdamW(ps, lr=1e-3, fused=True),
                                      device, args.reps),
        f"ecd_{args.old}": median_step_ms(lambda ps: old.ECD(ps, **ECD_HP), device, args.reps),
        "ecd_working_tree": median_step_ms(lambda ps: optim.ECD(ps, **ECD_HP), device, args.reps),
    }
    result = {"step_ms": ms, "over_adamw": {k: v / ms["adamw_fused"] for k, v in ms.items()},
              "old_commit": args.old, "reps": args.reps, "provenance": provenance(device)}
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return result


if __name__ == "__main__":
    main()
