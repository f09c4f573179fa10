"""Training-engine benchmarks, every ratio measured against a baseline in the same run.

1. Trainer throughput: tokens/s of ``gaugebook.experiment.train`` against a plain nanoGPT-style
   loop (same model, data, AdamW, bf16 autocast and ``torch.compile`` on a GPU).
2. Optimizer step: median time of one ECD step against one (fused on CUDA) AdamW step on the
   same parameters and gradients, and the bytes of optimizer state each keeps.
3. Symmetry breaking: throughput of the plain loop with ``symmetry_breaking="bqv"`` against the
   symmetric model.
4. Data: tokens/s at which :class:`gaugebook.data.DefaultCorpus` makes training batches (on the
   CPU, one process) against the tokens/s the plain loop consumes.

Throughput is steady-state: the time of ``steps`` steps after as many warm-up steps (which absorb
compilation), between two device synchronisations. Usage::

    python benchmarks/bench_training.py --device cuda --out benchmarks/results/h200.json
    python benchmarks/bench_training.py --device cpu --out benchmarks/results/cpu.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from gaugebook.data import DefaultCorpus
from gaugebook.experiment import RunConfig, optimizer_state_bytes, provenance, train
from gaugebook.gpt import GPT, GPTConfig
from gaugebook.optim import make_optimizer

SIZES = {
    "cuda": dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch_size=32),
    "cpu": dict(n_layer=2, n_head=2, n_embd=64, block_size=64, batch_size=8),
}


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_loop_tokens_per_s(size: dict, warmup: int, timed: int, device, *,
                            symmetry_breaking=None, compile=True, bf16=True) -> float:
    """Steady-state tokens/s of the nanoGPT-style loop: ``warmup`` steps (compilation), then
    ``timed`` steps between two synchronisations."""
    torch.manual_seed(0)
    corpus = DefaultCorpus(seed=0)
    config = GPTConfig(corpus.vocab_size, size["block_size"], size["n_layer"], size["n_head"],
                       size["n_embd"], activation="prelu", symmetry_breaking=symmetry_breaking)
    model = GPT(config).to(device)
    opt = make_optimizer("adamw", model.parameters(), lr=1e-3)
    fwd = torch.compile(model) if compile else model
    for step in range(warmup + timed):
        if step == warmup:
            _sync(device)
            start = time.perf_counter()
        x, y = corpus.batch(step, size["batch_size"], size["block_size"], split="train",
                            device=device)[:2]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = fwd(x, y)[1]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    _sync(device)
    return timed * size["batch_size"] * size["block_size"] / (time.perf_counter() - start)


def corpus_tokens_per_s(size: dict, batches: int) -> float:
    """Tokens/s of :meth:`DefaultCorpus.batch` for training batches of the benchmark's shape."""
    corpus = DefaultCorpus(seed=0)
    corpus.batch(0, size["batch_size"], size["block_size"], split="train")  # builds the tables
    start = time.perf_counter()
    for step in range(1, batches + 1):
        corpus.batch(step, size["batch_size"], size["block_size"], split="train")
    return batches * size["batch_size"] * size["block_size"] / (time.perf_counter() - start)


def trainer_tokens_per_s(size: dict, steps: int, device, *, compile=True, bf16=True) -> float:
    """Steady-state tokens/s of :func:`gaugebook.experiment.train` between its measurements at
    steps ``steps`` and ``2 steps`` (one one-batch evaluation included)."""
    cfg = RunConfig(optimizer="adamw", symmetry="symmetric", seed=0, steps=2 * steps,
                    eval_every=steps, eval_batches=1, probe_instances=1, checkpoint_every=10**9,
                    autocast_bf16=bf16, compile=compile, optimizer_hp=dict(lr=1e-3), **size)
    with tempfile.TemporaryDirectory() as out:
        history = train(cfg, Path(out), device)["history"]
    steps = history["step"][-1] - history["step"][0]
    seconds = history["wall_s"][-1] - history["wall_s"][0]
    return steps * size["batch_size"] * size["block_size"] / seconds


def median_call_seconds(call, device, reps: int, untimed: int = 3) -> float:
    """Median seconds of ``call()`` over ``reps`` calls after ``untimed`` ones, each between two
    device synchronisations."""
    times = []
    for _ in range(reps + untimed):
        _sync(device)
        start = time.perf_counter()
        call()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[untimed:])


def median_step_seconds(opt, loss: torch.Tensor, device, reps: int) -> float:
    """Median seconds of ``opt.step`` over ``reps`` steps after three untimed ones
    (:func:`median_call_seconds`). The gradients stay in ``.grad`` and the closure returns
    ``loss``: this times the update alone."""
    return median_call_seconds(lambda: opt.step(lambda: loss), device, reps)


def optimizer_step_times(size: dict, device, reps: int) -> dict:
    """Median seconds of one ECD and one AdamW step on identical parameters and gradients.

    The model is the GPU benchmark's on every device (the step's cost grows with the number of
    parameters); on a CPU the gradients come from a smaller batch."""
    size = dict(SIZES["cuda"], batch_size=size["batch_size"])
    corpus = DefaultCorpus(seed=0)
    config = GPTConfig(corpus.vocab_size, size["block_size"], size["n_layer"], size["n_head"],
                       size["n_embd"], activation="prelu")
    out = {}
    for name, hp in [("adamw", dict(lr=1e-3)), ("ecd", dict(lr=1.0, eta=100.0, F0=0.0))]:
        torch.manual_seed(0)
        model = GPT(config).to(device)
        x, y = corpus.batch(0, size["batch_size"], size["block_size"], device=device)[:2]
        loss = model(x, y)[1]
        loss.backward()
        loss = loss.detach()
        opt = make_optimizer(name, model.parameters(), **hp)
        out[name] = {"step_s": median_step_seconds(opt, loss, device, reps),
                     "fused": name == "adamw" and
                     bool(opt.defaults.get("fused")),
                     "state_bytes": optimizer_state_bytes(opt),
                     "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters())}
    out["ecd_over_adamw_step_time"] = out["ecd"]["step_s"] / out["adamw"]["step_s"]
    out["ecd_over_adamw_state_bytes"] = out["ecd"]["state_bytes"] / out["adamw"]["state_bytes"]
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=None,
                        help="untimed warm-up steps (compilation), then as many timed steps")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    gpu = device.type == "cuda"
    size = SIZES["cuda" if gpu else "cpu"]
    steps = args.steps or (100 if gpu else 10)
    settings = dict(compile=gpu, bf16=gpu)

    results = {"size": size, "warmup_steps": steps, "timed_steps": steps, "settings": settings}
    results["command"] = "python benchmarks/bench_training.py " + " ".join(
        f"--{k} {v}" for k, v in vars(args).items() if v is not None)
    results["provenance"] = provenance(device)
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save():  # after every stage, so a run cut short keeps what it measured
        args.out.write_text(json.dumps(results, indent=1, default=str))

    results["optimizer"] = optimizer_step_times(size, device, reps=50 if gpu else 10)
    save()
    # The plain loop runs first and last: the spread of the two says how stable the machine is,
    # and their mean is the baseline for the ratios.
    tp = results["throughput"] = {}
    tp["plain_loop_tokens_per_s"] = [plain_loop_tokens_per_s(size, steps, steps, device, **settings)]
    save()
    tp["trainer_tokens_per_s"] = trainer_tokens_per_s(size, steps, device, **settings)
    tp["trainer_over_plain"] = tp["trainer_tokens_per_s"] / tp["plain_loop_tokens_per_s"][0]
    save()
    tp["bqv_tokens_per_s"] = plain_loop_tokens_per_s(size, steps, steps, device,
                                                     symmetry_breaking="bqv", **settings)
    tp["bqv_over_symmetric"] = tp["bqv_tokens_per_s"] / tp["plain_loop_tokens_per_s"][0]
    save()
    tp["plain_loop_tokens_per_s"].append(plain_loop_tokens_per_s(size, steps, steps, device,
                                                                 **settings))
    plain = sum(tp["plain_loop_tokens_per_s"]) / 2
    tp["trainer_over_plain"] = tp["trainer_tokens_per_s"] / plain
    tp["bqv_over_symmetric"] = tp["bqv_tokens_per_s"] / plain
    tp["corpus_tokens_per_s"] = corpus_tokens_per_s(size, batches=50)
    tp["corpus_over_plain"] = tp["corpus_tokens_per_s"] / plain
    save()
    print(json.dumps({k: results[k] for k in ("throughput", "optimizer")}, indent=1))


if __name__ == "__main__":
    main()
