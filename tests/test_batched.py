"""Batched training: every member of a batched cohort is the run trained alone."""
import dataclasses
import json

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gaugebook.experiment import (PAPER_CPU_ADAMW_LR, RunConfig, main, select_runs, train,
                                  train_batched)
from gaugebook.training import cohorts

HP = {"ecd-global": ("ecd", dict(lr=1.0, eta=100.0, F0=1.0, nu=0.1)),
      "ecd-pt": ("ecd", dict(lr=1.0, eta=100.0, F0=1.0, projection="per_tensor",
                             partition="gpt2")),
      "adamw": ("adamw", dict(lr=3e-3, weight_decay=0.1)),
      "sgdm": ("sgdm", dict(lr=0.03, init_velocity_std=0.1))}


def member(arm: str, symmetry: str, seed: int, **changes) -> RunConfig:
    optimizer, hp = HP[arm]
    base = dict(optimizer=optimizer, symmetry=symmetry, seed=seed, n_layer=2, n_head=2, n_embd=16,
                block_size=32, batch_size=4, steps=60, eval_every=10, eval_batches=1,
                probe_instances=4, checkpoint_every=50, optimizer_hp=dict(hp),
                mu_v=0.5 if symmetry == "bqv" else 0.0, prelu_init="paper")
    return RunConfig(**{**base, **changes})


def weights_at_checkpoint(out, name):
    return torch.load(out / "checkpoints" / name, weights_only=False)["weights"]


@pytest.fixture
def float64():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


@pytest.mark.parametrize("arm", ["ecd-global", "ecd-pt", "adamw", "sgdm"])
def test_each_member_follows_its_run_trained_alone(tmp_path, float64, arm):
    """Float64: after 50 steps the stacked weights of every member equal the weights of the run
    trained alone to 1e-10, and so do their recorded histories."""
    cfgs = [member(arm, "symmetric", 0), member(arm, "bqv", 1), member(arm, "bq", 2)]
    assert train_batched(cfgs, tmp_path / "batched", stop_after=50, progress=False) is None
    (ckpt,) = (tmp_path / "batched" / "checkpoints").glob("batch-*.pt")
    stacked = weights_at_checkpoint(tmp_path / "batched", ckpt.name)
    for r, cfg in enumerate(cfgs):
        assert train(cfg, tmp_path / "alone", stop_after=50, progress=False) is None
        alone = weights_at_checkpoint(tmp_path / "alone", f"{cfg.name}.pt")
        for name, w in stacked.items():
            assert (w[r] - alone[name]).abs().max() < 1e-10, (cfg.name, name)
    batched = train_batched(cfgs, tmp_path / "batched", progress=False)
    for cfg, result in zip(cfgs, batched):
        single = train(cfg, tmp_path / "alone", progress=False)
        assert result["trained_with"] == [c.name for c in cfgs] and single["trained_with"] == []
        for key in ("train_loss", "val_loss", "J_QK", "J_VO", "distance"):
            a, b = result["history"][key], single["history"][key]
            # relative, with a floor: ECD keeps a symmetric run's charges at round-off (1e-16)
            assert max(abs(x - y) / max(abs(y), 1e-3) for x, y in zip(a, b)) < 1e-10, \
                (cfg.name, key)
        assert result["probes"]["mean"]["loss"] == pytest.approx(
            single["probes"]["mean"]["loss"], rel=1e-10)
        assert result["history"]["skipped_steps"] == single["history"]["skipped_steps"]


def test_a_cohort_stopped_between_its_result_files_resumes_from_its_checkpoint(tmp_path,
                                                                              monkeypatch):
    """Ctrl-C after the first member's result file: the next call resumes the whole cohort from
    its checkpoint (not the second member alone from step 0), writes only the missing file,
    and leaves no checkpoint behind."""
    from gaugebook import training

    cfgs = [member("ecd-pt", "symmetric", 0, steps=24, checkpoint_every=8, eval_every=4),
            member("ecd-pt", "bqv", 1, steps=24, checkpoint_every=8, eval_every=4)]
    full = train_batched(cfgs, tmp_path / "full", progress=False)
    write, written = training.write_json_atomic, []

    def stopped_after_one(path, record):
        if written:
            raise KeyboardInterrupt
        written.append(path)
        write(path, record)

    monkeypatch.setattr(training, "write_json_atomic", stopped_after_one)
    with pytest.raises(KeyboardInterrupt):
        train_batched(cfgs, tmp_path / "cut", progress=False)
    monkeypatch.setattr(training, "write_json_atomic", write)
    first = (tmp_path / "cut" / f"{cfgs[0].name}.json").read_text()
    resumed_at = []
    resume = training._resume
    monkeypatch.setattr(training, "_resume",
                        lambda cohort: (resume(cohort), resumed_at.append(cohort.step)))
    resumed = train_batched(cfgs, tmp_path / "cut", progress=False)
    assert resumed_at == [16]  # the cohort's last checkpoint, not step 0
    assert (tmp_path / "cut" / f"{cfgs[0].name}.json").read_text() == first  # not rewritten
    for a, b in zip(full, resumed):
        assert a["history"]["val_loss"] == b["history"]["val_loss"]
    assert not list((tmp_path / "cut" / "checkpoints").glob("*.pt"))


def test_batched_cpu_smoke_gives_the_histories_of_separate_runs(tmp_path):
    """float32, the command line: within 1e-4 relative."""
    main(["--preset", "cpu-smoke", "--out", str(tmp_path / "one"), "--device", "cpu"])
    main(["--preset", "cpu-smoke", "--out", str(tmp_path / "all"), "--device", "cpu",
          "--batched"])
    for path in sorted((tmp_path / "one").glob("*.json")):
        one, batched = (json.loads(p.read_text()) for p in (path, tmp_path / "all" / path.name))
        assert len(batched["trained_with"]) == 2
        for key in ("train_loss", "val_loss"):
            for x, y in zip(batched["history"][key], one["history"][key]):
                assert abs(x - y) <= 1e-4 * abs(y), (path.name, key)


@pytest.mark.parametrize("arm", ["ecd-pt", "adamw"])
def test_batched_resume_equals_uninterrupted(tmp_path, arm):
    cfgs = [member(arm, "symmetric", 0, steps=24, checkpoint_every=8, eval_every=4),
            member(arm, "bqv", 1, steps=24, checkpoint_every=8, eval_every=4)]
    full = train_batched(cfgs, tmp_path / "full", progress=False)
    assert train_batched(cfgs, tmp_path / "cut", stop_after=11, progress=False) is None
    # resumed with another time budget and checkpoint cadence: how it runs, not what it computes
    (ckpt,) = (tmp_path / "cut" / "checkpoints").glob("batch-*.pt")
    cut = torch.load(ckpt, weights_only=False)
    assert cut["step"] == 8
    executed = [dataclasses.replace(c, max_wall_s=3600.0, checkpoint_every=5) for c in cfgs]
    resumed = train_batched(executed, tmp_path / "cut", progress=False)
    for a, b, before in zip(full, resumed, cut["histories"]):
        # the evaluation at step 8 is the cut run's (its clock), not made again by a restart
        assert b["history"]["wall_s"][0] == before["wall_s"][0]
        assert a["history"]["val_loss"] == b["history"]["val_loss"]
        assert a["history"]["train_loss"] == b["history"]["train_loss"]
        assert a["probes"] == b["probes"]
    assert not list((tmp_path / "cut" / "checkpoints").glob("*.pt"))
    # a complete result is the run's, however it is executed; what it computes may not differ
    compiled = [dataclasses.replace(c, compile=True) for c in cfgs]
    assert train_batched(compiled, tmp_path / "cut", progress=False) == resumed
    with pytest.raises(ValueError, match="other settings \\(steps: 24 there, 30 here\\)"):
        train_batched([dataclasses.replace(c, steps=30) for c in cfgs], tmp_path / "cut")


def test_ecd_steps_on_a_device_train_the_host_runs_and_resume_exactly(tmp_path, float64,
                                                                      monkeypatch):
    """Off the CPU a batched ECD cohort without chaos steps on the device (nothing read to the
    host between evaluations). Forced on the CPU, in float64: the histories of the host path,
    to 1e-10, and a resumed run equal to the uninterrupted one."""
    from gaugebook import optim

    cfgs = [member("ecd-pt", "symmetric", 0, steps=24, eval_every=4, checkpoint_every=8),
            member("ecd-pt", "bqv", 1, steps=24, eval_every=4, checkpoint_every=8)]
    host = train_batched(cfgs, tmp_path / "host", progress=False)
    monkeypatch.setattr(optim, "_on_device", lambda t: True)
    full = train_batched(cfgs, tmp_path / "full", progress=False)
    assert train_batched(cfgs, tmp_path / "cut", stop_after=11, progress=False) is None
    resumed = train_batched(cfgs, tmp_path / "cut", progress=False)
    for a, b, c in zip(host, full, resumed):
        for key in ("train_loss", "val_loss", "distance"):
            assert max(abs(x - y) / abs(y) for x, y in zip(b["history"][key],
                                                           a["history"][key])) < 1e-10, key
        assert b["history"]["path_length"] == a["history"]["path_length"]
        assert b["history"]["skipped_steps"] == a["history"]["skipped_steps"]
        assert c["history"] == {**b["history"], "wall_s": c["history"]["wall_s"]}


class HostReads(TorchDispatchMode):
    """Records the operations that read a tensor's value to the host (on a GPU: a
    synchronisation, which a CUDA graph's capture refuses); ``tolist`` does not dispatch, so the
    test patches it."""
    READS = ("aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten._unique")

    def __init__(self, reads: list):
        super().__init__()
        self.reads = reads

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func).startswith(self.READS):
            self.reads.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("arm", ["ecd-global", "ecd-pt", "adamw", "sgdm"])
def test_a_training_step_reads_nothing_to_the_host(monkeypatch, arm, batched):
    """What capturing the step as a CUDA graph (``cuda_graphs``) needs, checked on the CPU as far
    as a CPU can: after its first steps, the training step (draws, forward, backward, update) of
    a batched cohort, or of a run alone, calls nothing that reads a value to the host (``item``,
    ``float``, ``bool``, ``tolist``, ``nonzero``, ...); ECD without chaos, on its device path,
    whose counts add up. The model's token checks read, and are skipped where
    ``_host_reads_allowed`` says no (on a GPU, in a captured step's last warm-up: here it is
    told so); ECD's host path reads, so the check can fail. (Reads inside an operator, and the
    kernels of a GPU, are checked by the GPU tests: their last warm-up step runs with
    synchronisations made errors.)"""
    from gaugebook import gpt, optim, training

    optimizer, hp = HP[arm]
    hp = {**hp, "nu": 0.0} if optimizer == "ecd" else hp
    cfgs = [member(arm, s, seed, optimizer_hp=hp) for s, seed in (("bqv", 1), ("symmetric", 0))]
    cfgs = cfgs if batched else cfgs[:1]  # (batched: the first member has buffers, bias
    # means, that the second lacks)
    for device_path in ([True, False] if optimizer == "ecd" else [True]):
        monkeypatch.setattr(optim, "_on_device", lambda t: device_path)
        cohort = training._setup(cfgs, torch.device("cpu"), batched)
        batches = training._train_batches(cohort, 0)
        for _ in range(3):
            training._step(cohort, *next(batches))
        reads = []
        tolist = torch.Tensor.tolist
        with monkeypatch.context() as patch, HostReads(reads):
            patch.setattr(torch.Tensor, "tolist", lambda t: reads.append("tolist") or tolist(t))
            patch.setattr(gpt, "_host_reads_allowed", lambda t: False)
            training._step(cohort, *next(batches))
        assert (reads == []) == device_path, reads
        if optimizer == "ecd":  # the steps taken on the device add up
            assert cohort.optimizer.steps == ([4, 4] if batched else 4)


def test_what_cannot_be_batched_is_refused_with_the_fix(tmp_path, capsys):
    with pytest.raises(ValueError, match="soap acts on whole matrices.*without --batched"):
        train_batched([member("adamw", "symmetric", 0, optimizer="soap",
                              optimizer_hp=dict(lr=1e-3))], tmp_path)
    with pytest.raises(ValueError, match="these differ: .*n_embd"):
        train_batched([member("adamw", "symmetric", 0), member("adamw", "bqv", 1, n_embd=32)],
                      tmp_path)
    with pytest.raises(ValueError, match="these differ: .*optimizer_hp"):
        train_batched([member("adamw", "symmetric", 0),
                       member("adamw", "bqv", 1, optimizer_hp=dict(lr=1e-2))], tmp_path)
    with pytest.raises(ValueError, match="would write the same result file"):
        train_batched([member("adamw", "symmetric", 0)] * 2, tmp_path)
    with pytest.raises(SystemExit):
        main(["--preset", "gpu", "--part", "seed0", "--batched", "--out", str(tmp_path)])
    assert "soap" in capsys.readouterr().err
    groups = cohorts(select_runs("paper"))
    assert [len(g) for g in groups] == [9, 6, 6]  # ECD per-tensor, ECD global, AdamW


def test_bad_ecd_projection_settings_name_the_fix():
    with pytest.raises(ValueError, match="needs a partition: set optimizer_hp.partition to 'gpt2'"):
        member("ecd-pt", "symmetric", 0, optimizer_hp=dict(lr=1.0, eta=100.0, F0=1.0,
                                                            projection="per_tensor"))
    with pytest.raises(ValueError, match="unknown ECD projection 'per_layer'"):
        member("ecd-pt", "symmetric", 0, optimizer_hp=dict(lr=1.0, eta=100.0, F0=1.0,
                                                            projection="per_layer"))
    with pytest.raises(ValueError, match="partition is for projection='per_tensor'"):
        member("ecd-global", "symmetric", 0, optimizer_hp=dict(lr=1.0, eta=100.0, F0=1.0,
                                                                partition="gpt2"))


def test_paper_cpu_preset_is_the_protocol_on_the_smoke_model_at_twenty_initial_norms():
    """Same runs, arms and settings as `paper` but the model and horizon; each seed's ECD path
    (steps x dt) is at least 20 of its model's initial parameter norms."""
    from gaugebook.data import DefaultCorpus
    from gaugebook.gpt import GPT

    paper = sorted(select_runs("paper"), key=lambda r: r.name)  # (their parts differ)
    cpu = sorted(select_runs("paper-cpu"), key=lambda r: r.name)
    assert [r.name for r in cpu] == [r.name for r in paper]
    for p, c in zip(paper, cpu):
        assert (c.optimizer_hp, c.mu_v, c.prelu_init, c.seed) == (p.optimizer_hp, p.mu_v,
                                                                  p.prelu_init, p.seed)
        assert (c.n_layer, c.n_embd, c.block_size, c.steps, c.eval_every) == (2, 32, 32, 5000,
                                                                              100)
        if c.optimizer == "ecd":
            torch.manual_seed(c.seed)  # the trainer's first draw: the model's initialisation
            model = GPT(c.model_config(DefaultCorpus(seed=c.seed).vocab_size))
            init_norm = torch.cat([q.detach().flatten() for q in model.parameters()]).norm()
            dt = c.optimizer_hp["lr"] / c.optimizer_hp["eta"] ** 0.5
            assert c.steps * dt >= 20 * init_norm


def test_the_toy_sweep_extends_the_gpu_sweep_on_the_toy_model():
    """`paper-cpu-lr` holds the runs of `paper-lr` (AdamW at four learning rates, symmetric and
    bqv, seed 0) on the toy model of `paper-cpu`, two higher AdamW rates, and per-tensor ECD at
    three rates with the paper's other ECD settings."""
    sweep, toy = select_runs("paper-lr"), {r.name: r for r in select_runs("paper-cpu-lr")}
    assert len(sweep) == 8 and len(toy) == 18
    model = ("n_layer", "n_head", "n_embd", "block_size", "steps", "eval_every", "eval_batches",
             "probe_instances", "checkpoint_every", "autocast_bf16", "compile", "prelu_init")
    reference = select_runs("paper-cpu")[0]
    for t in toy.values():
        assert {k: getattr(t, k) for k in model} == {k: getattr(reference, k) for k in model}
        assert t.seed == 0 and t.mu_v == (0.5 if t.symmetry == "bqv" else 0.0)
    for s in sweep:
        t = toy[s.name]
        assert (t.optimizer_hp, t.symmetry, t.mu_v) == (s.optimizer_hp, s.symmetry, s.mu_v)
    rates = {o: sorted({t.optimizer_hp["lr"] for t in toy.values() if t.optimizer == o})
             for o in ("adamw", "ecd")}
    assert rates == {"adamw": [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2], "ecd": [0.3, 3.0, 10.0]}
    paper_ecd = next(r for r in select_runs("paper-cpu", "seed0") if r.tag == "pt")
    for t in toy.values():
        if t.optimizer == "ecd":
            assert dict(t.optimizer_hp, lr=1.0) == paper_ecd.optimizer_hp


def test_the_tuned_toy_control_repeats_the_best_sweep_setting_at_three_seeds():
    """`paper-cpu-tuned` is the best AdamW setting of `paper-cpu-lr` at seeds 0, 1 and 2, one
    part per seed; its seed 0 is that sweep's run, name and settings alike."""
    sweep = {r.name: r for r in select_runs("paper-cpu-lr")}
    tuned = select_runs("paper-cpu-tuned")
    assert [r.name for r in select_runs("paper-cpu-tuned", "seed1")] == [
        "adamw-symmetric-prelu-s1-lr=0.003", "adamw-bqv-prelu-s1-lr=0.003"]
    assert sorted((r.seed, r.symmetry) for r in tuned) == [
        (s, sym) for s in range(3) for sym in ("bqv", "symmetric")]
    for r in tuned:
        twin = sweep[r.name.replace(f"-s{r.seed}-", "-s0-")]
        assert dataclasses.replace(r, seed=0) == twin
        assert r.optimizer_hp["lr"] == PAPER_CPU_ADAMW_LR
    assert len(cohorts(select_runs("paper-cpu-tuned", "seed0"))) == 1


def test_paper_preset_is_the_registered_protocol():
    runs = select_runs("paper")
    assert len(runs) == 21 and len({r.name for r in runs}) == 21
    for r in runs:
        assert (r.n_layer, r.n_head, r.n_embd, r.block_size, r.batch_size) == (6, 6, 384, 256, 8)
        assert r.steps >= 20_000 and r.prelu_init == "paper" and r.eval_every == 500
        assert r.eval_batches == 16 and r.mu_v == (0.5 if r.symmetry == "bqv" else 0.0)
    arms = {(r.optimizer, r.optimizer_hp.get("projection", "global"), r.symmetry) for r in runs}
    assert arms == {("ecd", "per_tensor", s) for s in ("symmetric", "bq", "bqv")} \
        | {("ecd", "global", s) for s in ("symmetric", "bqv")} \
        | {("adamw", "global", s) for s in ("symmetric", "bqv")}
    ecd = next(r for r in runs if r.optimizer == "ecd")
    assert ecd.optimizer_hp["F0"] == 2.0 and ecd.optimizer_hp["lr"] / ecd.optimizer_hp["eta"] ** .5 \
        == pytest.approx(0.1)
