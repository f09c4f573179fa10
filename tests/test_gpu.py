"""Checks of the training engine that need a GPU (skipped without one; the GPU session script
runs them): batched training under bf16 and torch.compile, the step captured as a CUDA graph,
and the batched paths on CUDA."""
import dataclasses
import json

import pytest
import torch

from gaugebook.experiment import main, override, select_runs, train, train_batched
from gaugebook.optim import ECD
from gaugebook.step_graph import CapturedStep

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def test_batched_paper_cohort_trains_under_bf16_and_compile(tmp_path):
    main(["--preset", "paper-smoke", "--part", "seed0-pt,seed0-global,seed0-adamw", "--batched",
          "--device", "cuda",
          "--out", str(tmp_path), "--set", "autocast_bf16=true", "--set", "compile=true",
          "--set", "steps=20"])
    results = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
    assert len(results) == 7
    for r in results:
        h = r["history"]
        assert h["val_loss"][-1] < h["val_loss"][0] and len(r["trained_with"]) in (2, 3)
        assert r["config"]["autocast_bf16"] and r["config"]["compile"]


def test_a_batched_member_is_its_run_alone_on_cuda(tmp_path):
    cfgs = [override(c, ["steps=20", "eval_every=5"])
            for c in select_runs("paper-smoke", "seed0-pt")]
    batched = train_batched(cfgs, tmp_path / "b", "cuda", progress=False)
    for cfg, result in zip(cfgs, batched):
        alone = train(cfg, tmp_path / "a", "cuda", progress=False)
        for x, y in zip(result["history"]["val_loss"], alone["history"]["val_loss"]):
            assert abs(x - y) <= 1e-4 * abs(y), cfg.name


def histories_agree(plain, graphs, rel=1e-5):
    for a, b in zip(plain, graphs):
        for key in ("train_loss", "val_loss"):
            for x, y in zip(a["history"][key], b["history"][key]):
                assert abs(x - y) <= rel * abs(x), (a["name"], key)
        assert a["history"]["path_length"] == b["history"]["path_length"], a["name"]
        assert a["history"]["skipped_steps"] == b["history"]["skipped_steps"], a["name"]


@pytest.mark.parametrize("part, compiled", [("seed0-pt", True), ("seed0-global", False),
                                            ("seed0-adamw", False), ("sgdm", False)])
def test_a_captured_step_trains_the_cohort_as_the_plain_step(tmp_path, part, compiled, capsys):
    """The whole step replayed as a CUDA graph (forward, backward, ECD's, fused AdamW's or SGDM's
    update) gives the histories of the step launched kernel by kernel, compiled or not (the
    last warm-up step runs with synchronisations made errors)."""
    runs = select_runs("paper-smoke", "seed0-adamw" if part == "sgdm" else part)
    if part == "sgdm":
        runs = [dataclasses.replace(c, optimizer="sgdm", tag="sgdm",
                                    optimizer_hp=dict(lr=0.03, init_velocity_std=0.1))
                for c in runs]
    cfgs = [override(c, ["steps=30", "eval_every=10", f"compile={str(compiled).lower()}",
                         "autocast_bf16=true"]) for c in runs]
    plain = train_batched(cfgs, tmp_path / "plain", "cuda", progress=False)
    graphs = train_batched(cfgs, tmp_path / "graphs", "cuda", progress=False, cuda_graphs=True)
    assert "captured as a CUDA graph at call 4" in capsys.readouterr().err
    histories_agree(plain, graphs)


def test_a_captured_step_trains_a_run_alone_as_the_plain_step(tmp_path, capsys):
    (cfg,) = [override(c, ["steps=30", "eval_every=10", "compile=false"])
              for c in select_runs("paper-smoke", "seed0-pt") if c.symmetry == "bqv"]
    plain = train(cfg, tmp_path / "plain", "cuda", progress=False)
    graphs = train(cfg, tmp_path / "graphs", "cuda", progress=False, cuda_graphs=True)
    assert "captured as a CUDA graph" in capsys.readouterr().err
    histories_agree([plain], [graphs])


def test_captured_step_warms_up_then_replays_on_new_inputs():
    weight = torch.zeros(3, device="cuda")

    def step(x, extra):
        weight.add_(x)
        return weight.sum() + (0 if extra is None else extra.sum())
    captured = CapturedStep(step, "cuda", warmup=2)
    for k in range(1, 6):
        out = captured(torch.full((3,), float(k), device="cuda"), None)
        assert (captured.graph is None) == (k <= 2)
        assert out.item() == 3 * k * (k + 1) / 2  # each call added its own input
    with pytest.raises(ValueError, match="differ in structure"):
        captured(torch.ones(3, device="cuda"), torch.ones(1, device="cuda"))
    with pytest.raises(ValueError, match=r"shape \(1,\), torch.float32 replaces one captured"):
        captured(torch.ones(1, device="cuda"), None)  # would broadcast into the buffer


def _stacked_problem(projection: str, **hp):
    """Three stacked members of a linear model whose weight (40,000 scalars per member) spans
    several pieces of the per-tensor reduction and of the fused kernels; ECD over it (for
    per-tensor, weight and bias one tensor of the partition) and its closure."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(3, 500, 80, device="cuda")),
              torch.nn.Parameter(torch.randn(3, 80, device="cuda"))]
    targets = torch.randn(3, 64, 80, device="cuda")
    inputs = torch.randn(3, 64, 500, device="cuda")
    blocks = [params] if projection == "per_tensor" else None
    opt = ECD(params, lr=0.1, eta=4.0, F0=-1.0, members=3, projection=projection,
              blocks=blocks, chaos_seeds=[1, 2, 3], **hp)

    def closure():
        opt.zero_grad()
        out = torch.bmm(inputs, params[0]) + params[1][:, None]
        loss = ((out - targets) ** 2).mean(dim=(1, 2))
        loss.sum().backward()
        return loss
    return params, opt, closure


@pytest.mark.parametrize("projection", ["global", "per_tensor"])
def test_ecd_members_fast_path_equals_reference_on_cuda(projection):
    """With chaos, every step on the host path (the reference and the fast path)."""
    finals = []
    for foreach in (False, True):
        params, opt, closure = _stacked_problem(projection, nu=0.1, foreach=foreach)
        for _ in range(10):
            opt.step(closure)
        finals.append([p.detach() for p in params])
    for a, b in zip(*finals):
        assert (a - b).abs().max() < 1e-4 * b.abs().max()


@pytest.mark.parametrize("projection", ["global", "per_tensor"])
def test_fused_ecd_steps_equal_the_operators_on_cuda(projection):
    """ECD's fused kernels (Triton, compiled for this GPU) against its PyTorch operators: 20
    steps of 3 members, launched from Python, and with the step captured as a CUDA graph."""
    finals = []
    for fused, captured in ((False, False), (True, False), (True, True)):
        params, opt, closure = _stacked_problem(projection, fused=fused)
        step = lambda: opt.step(closure)  # noqa: E731
        if captured:
            step = CapturedStep(step, "cuda", label="fused ECD")
        for _ in range(20):
            step()
        assert (opt._kernels is not None) == fused
        assert opt.steps == [20, 20, 20]
        finals.append([p.detach().clone() for p in params])
    for other in finals[1:]:
        for a, b in zip(finals[0], other):
            assert (a - b).abs().max() < 1e-5 * b.abs().max()


@pytest.mark.parametrize("projection", ["global", "per_tensor"])
@pytest.mark.parametrize("nu, fused, expected", [(0.1, None, 3), (0.0, False, 0),
                                                 (0.0, True, 0)])
def test_an_ecd_step_synchronises_once_or_never(projection, nu, fused, expected):
    """A step of the fast path (3 members) with chaos reads its scalars to the host once and
    sends nothing back: the one synchronisation torch's sync debug mode reports. Without chaos
    the step stays on the device, with its PyTorch operators or its fused kernels: none."""
    import warnings

    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(3, 50, 40, device="cuda")),
              torch.nn.Parameter(torch.randn(3, 40, device="cuda"))]
    blocks = [params] if projection == "per_tensor" else None
    opt = ECD(params, lr=0.1, eta=4.0, F0=-1.0, nu=nu, members=3, projection=projection,
              blocks=blocks, chaos_seeds=[1, 2, 3], fused=fused)

    def closure():
        opt.zero_grad()
        loss = (params[0] ** 2).mean(dim=(1, 2)) + params[1].sum(1)
        loss.sum().backward()
        return loss
    opt.step(closure)  # the first step sets the velocities up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                opt.step(closure)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    assert len(syncs) == expected, [str(w.message) for w in syncs]


def test_grid_benchmark_times_the_steps_replayed_as_cuda_graphs(tmp_path, bench_grid):
    """On CUDA `bench_grid.py --steps-only` also times each optimizer step captured as a CUDA
    graph and replayed (the device's time alone)."""
    out = tmp_path / "steps.json"
    bench_grid.main(["--device", "cuda", "--preset", "paper-smoke", "--steps-only",
                     "--reps", "3", "--out", str(out)])
    for s in json.loads(out.read_text())["step"]:
        assert s["ecd_replayed_step_s"] > 0 and s["adamw_replayed_step_s"] > 0
        assert s["ecd_over_adamw_replayed"] > 0


def test_a_layer_made_on_cuda_equals_the_same_draws_moved_there():
    from gaugebook.attention import MultiHeadAttention

    made = MultiHeadAttention(16, 4, 4, rope=True, bias=True, device="cuda",
                              generator=torch.Generator().manual_seed(0))
    moved = MultiHeadAttention(16, 4, 4, rope=True, bias=True,
                               generator=torch.Generator().manual_seed(0)).to("cuda")
    x = torch.randn(2, 9, 16, device="cuda")
    assert made.rope_freqs.is_cuda and made.rope_freqs.dtype == torch.float64
    assert torch.equal(made(x), moved(x))


def test_the_library_measures_a_cuda_model_as_its_cpu_copy():
    """Directions and bases drawn on the CPU go to the model's device (projection, lie,
    rope, the probes), so each measurement of a CUDA model equals that of its CPU copy."""
    from gaugebook.data import WordTokenizer, evaluate_probes
    from gaugebook.gpt import GPT, GPTConfig
    from gaugebook.gpt_redundancy import LogProbabilities, make_generic_, redundant_directions
    from gaugebook.projection import sketched_rank, zero_change_estimate
    from gaugebook.rope import rope_frequencies, rotation_matrix

    cfg = GPTConfig(vocab_size=12, block_size=8, n_layer=1, n_head=2, n_embd=8, rope="gated")
    cpu = make_generic_(GPT(cfg).double(), generator=torch.Generator().manual_seed(0))
    cuda = GPT(cfg).double().cuda()
    cuda.load_state_dict(cpu.state_dict())
    idx = torch.arange(8).remainder(12)[None]
    ranks = [sketched_rank(LogProbabilities(m), idx.to(d), n_columns=40,
                           generator=torch.Generator().manual_seed(1)).rank
             for m, d in ((cpu, "cpu"), (cuda, "cuda"))]
    assert ranks[0] == ranks[1]
    zeros = [zero_change_estimate(LogProbabilities(m), idx.to(d), n_directions=8,
                                  generator=torch.Generator().manual_seed(2)).n_zero
             for m, d in ((cpu, "cpu"), (cuda, "cuda"))]
    assert zeros[0] == zeros[1]
    on_cpu, on_cuda = (redundant_directions(LogProbabilities(m)) for m in (cpu, cuda))
    for term, V in on_cuda.items():
        assert V.is_cuda, term
        torch.testing.assert_close(V.cpu(), on_cpu[term])
    freqs = rope_frequencies(4, dtype=torch.float64)
    assert torch.equal(rotation_matrix(3.0, freqs.cuda(), 8).cpu(), rotation_matrix(3.0, freqs, 8))
    tok = WordTokenizer()
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=64, n_layer=1, n_head=2,
                          n_embd=8)).cuda()
    scores = evaluate_probes(model, tok, n_per_task=4)  # prompts go where the model is
    assert 0 <= scores["mean"]["top1"] <= 1
