import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from gaugebook.experiment import (RunConfig, main, override, presets, select_runs, train,
                                  write_json_atomic)
from gaugebook.results import HISTORY_KEYS
from gaugebook.step_graph import CapturedStep
from gaugebook.training import check_runs

REPO = Path(__file__).resolve().parents[1]


def tiny(**changes) -> RunConfig:
    base = dict(optimizer="ecd", symmetry="bqv", n_layer=1, n_head=2, n_embd=16, block_size=32,
                batch_size=4, steps=12, eval_every=4, eval_batches=1, probe_instances=4,
                checkpoint_every=4, optimizer_hp=dict(lr=1.0, eta=100.0, F0=1.0))
    return RunConfig(**{**base, **changes})


def test_cpu_smoke_preset_writes_plottable_results(tmp_path):
    runs = select_runs("cpu-smoke")
    assert {r.optimizer for r in runs} == {"ecd", "adamw"}
    assert {r.symmetry for r in runs} == {"symmetric", "bqv"}
    main(["--preset", "cpu-smoke", "--out", str(tmp_path), "--device", "cpu"])
    results = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("*.json"))]
    assert len(results) == len(runs)
    for r in results:
        h = r["history"]
        assert len(h["step"]) == len(h["val_loss"]) == len(h["J_QK"]) == 3
        assert h["val_loss"][-1] < h["val_loss"][0], r["name"]  # it learns something
        assert r["provenance"]["torch"] == torch.__version__
        assert r["tokens_per_s"] > 0 and r["peak_memory_bytes"] > 0
        assert 0 <= r["probes"]["mean"]["top1"] <= 1
        # alignment of the trained model: both scores for a broken run, no static one otherwise
        assert set(r["alignment"]) == {"in_context", "static", "static_by_category",
                                       "static_null"}
        assert (r["alignment"]["static"] is None) == (r["config"]["symmetry"] == "symmetric")
        assert r["alignment"]["static_null"]["low"] <= r["alignment"]["static_null"]["high"]
    assert not list(tmp_path.glob("*.tmp*")) and not list((tmp_path / "checkpoints").glob("*"))
    ecd = next(r for r in results if r["config"]["optimizer"] == "ecd")
    adamw = next(r for r in results if r["config"]["optimizer"] == "adamw")
    assert ecd["optimizer_state_bytes"] * 2 == adamw["optimizer_state_bytes"]


@pytest.mark.parametrize("optimizer, hp", [("ecd", dict(lr=1.0, eta=100.0, F0=1.0, nu=0.1)),
                                           ("adamw", dict(lr=1e-3))])
def test_resume_equals_uninterrupted(tmp_path, optimizer, hp):
    cfg = tiny(optimizer=optimizer, optimizer_hp=hp)
    full = train(cfg, tmp_path / "full")
    assert train(cfg, tmp_path / "cut", stop_after=6) is None  # interrupted after step 6
    assert (tmp_path / "cut" / "checkpoints" / f"{cfg.name}.pt").exists()
    resumed = train(cfg, tmp_path / "cut")
    assert resumed["history"]["val_loss"] == full["history"]["val_loss"]
    assert resumed["history"]["train_loss"] == full["history"]["train_loss"]
    assert resumed["probes"] == full["probes"]


def test_existing_result_is_not_recomputed(tmp_path):
    cfg = tiny(steps=4)
    first = train(cfg, tmp_path)
    assert train(cfg, tmp_path) == json.loads(json.dumps(first))


def test_ddp_with_two_gloo_processes_matches_one_process(tmp_path):
    settings = ["--set", "steps=6", "--set", "eval_every=3", "--set", "probe_instances=4"]
    args = ["--preset", "cpu-smoke", "--part", "all", "--device", "cpu", *settings]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    single = subprocess.run([sys.executable, "-m", "gaugebook.experiment", *args,
                             "--out", str(tmp_path / "one")], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr[-2000:]
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node", "2", "-m", "gaugebook.experiment", *args,
                          "--out", str(tmp_path / "two")], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)
    assert ddp.returncode == 0, ddp.stderr[-2000:]
    for path in sorted((tmp_path / "one").glob("*.json")):
        one, two = json.loads(path.read_text()), json.loads((tmp_path / "two" / path.name).read_text())
        assert two["provenance"]["world_size"] == 2
        assert two["history"]["val_loss"] == pytest.approx(one["history"]["val_loss"], rel=1e-4)
        assert two["history"]["train_loss"] == pytest.approx(one["history"]["train_loss"], rel=1e-4)


def test_the_command_line_skips_finished_runs_and_refuses_other_settings(tmp_path, capsys):
    args = ["--preset", "cpu-smoke", "--out", str(tmp_path), "--device", "cpu", "--set",
            "eval_every=2", "--set", "probe_instances=4"]
    main([*args, "--set", "steps=2"])
    assert "already finished" not in capsys.readouterr().err
    main([*args, "--set", "steps=2"])
    assert f"4 of 4 runs already finished in {tmp_path}: skipped" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:  # the parser's error, before any training
        main([*args, "--set", "steps=3"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert "error: " in err and "with other settings (steps: 2 there, 3 here)" in err


def test_a_checkpoint_this_call_will_not_resume_is_named(tmp_path, capsys):
    """Switching to --batched restarts an interrupted unbatched run from step 0: say so."""
    args = ["--preset", "cpu-smoke", "--out", str(tmp_path), "--device", "cpu", "--set",
            "eval_every=2", "--set", "probe_instances=4", "--set", "checkpoint_every=2",
            "--set", "steps=4"]
    first = override(select_runs("cpu-smoke")[0], args[7::2])
    train(first, tmp_path, stop_after=2, progress=False)  # leaves its checkpoint at step 2
    main([*args, "--batched"])
    err = capsys.readouterr().err
    assert (f"note: 1 checkpoint(s) in {tmp_path}/checkpoints belong to no run or cohort of "
            f"this call ({first.name}.pt)") in err
    main(args)  # unbatched, as it was written: its run, finished meanwhile, removes it
    assert "note:" not in capsys.readouterr().err
    assert not list((tmp_path / "checkpoints").glob("*.pt"))


def test_the_skip_line_counts_the_runs_cut_short_by_their_time_budget(tmp_path, capsys):
    args = ["--preset", "cpu-smoke", "--out", str(tmp_path), "--device", "cpu", "--set",
            "probe_instances=4", "--set", "steps=100000", "--set", "max_wall_s=0.01"]
    main(args)
    last = capsys.readouterr().err.splitlines()[-6:]  # the summary: a line per run
    assert last[0].split() == ["run", "steps", "val", "loss"]
    assert last[-1] == f"results in {tmp_path}"
    assert all(line.startswith(name) and line.endswith("(cut short by max_wall_s)")
               for line, name in zip(last[1:5], [c.name for c in select_runs("cpu-smoke")]))
    main(args)
    assert (f"4 of 4 runs already finished in {tmp_path} (4 of them cut short by max_wall_s): "
            "skipped") in capsys.readouterr().err


def test_the_command_line_names_a_checkpoint_of_other_settings_without_a_traceback(tmp_path,
                                                                                  capsys):
    """A checkpoint is read only when its run trains: the conflict ends the call like the
    parser's errors (exit 2, one line naming the file), not in a traceback from training."""
    args = ["--preset", "cpu-smoke", "--out", str(tmp_path), "--device", "cpu", "--set",
            "eval_every=2", "--set", "probe_instances=4", "--set", "checkpoint_every=2"]
    first = override(select_runs("cpu-smoke")[0], args[7::2] + ["steps=4"])
    train(first, tmp_path, stop_after=2, progress=False)  # leaves its checkpoint at step 2
    with pytest.raises(SystemExit) as exit_:
        main([*args, "--set", "steps=6"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert f"error: {tmp_path}/checkpoints/ecd-symmetric-prelu-s0.pt holds run " in err
    assert "steps: 4 there, 6 here" in err and "delete the file to train the run anew" in err


def test_ctrl_c_says_where_the_checkpoint_is_and_how_to_resume(tmp_path):
    """A real Ctrl-C (SIGINT to the process group) once a checkpoint exists: one line, no
    traceback, exit code 130."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "gaugebook.experiment", "--preset", "cpu-smoke", "--out",
           str(out), "--device", "cpu", "--set", "steps=100000", "--set", "checkpoint_every=2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,  # a process group of its own, as a shell's
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while not list((out / "checkpoints").glob("*.pt")) and time.monotonic() < deadline:
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)
        err = proc.communicate(timeout=60)[1]
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    checkpoint = out / "checkpoints" / "ecd-symmetric-prelu-s0.pt"
    assert err.rstrip().splitlines()[-1] == (f"interrupted: the latest checkpoint is {checkpoint}; "
                                            "rerun the same command to resume")


@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_stops_the_runner_as_ctrl_c_does(tmp_path, workers):
    """``kill`` (SIGTERM) of the runner alone, as ``timeout`` sends it: its worker processes
    used to keep training and holding their runs' locks, and one process died without saying
    how to resume; now it ends as on Ctrl-C, and its workers with it."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "gaugebook.experiment", "--preset", "cpu-smoke", "--out",
           str(out), "--device", "cpu", "--workers", str(workers), "--set", "steps=100000",
           "--set", "checkpoint_every=2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not list((out / "checkpoints").glob("*.pt")) and time.monotonic() < deadline:
            time.sleep(0.1)
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        assert len(children) >= (workers if workers > 1 else 0), children
        proc.send_signal(signal.SIGTERM)
        err = proc.communicate(timeout=60)[1]
    finally:
        proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err, err[-2000:]
    assert err.rstrip().splitlines()[-1].endswith("rerun the same command to resume")
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{pid}").exists() for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(Path(f"/proc/{pid}").exists() for pid in children), children


def test_the_help_shows_the_examples_as_written(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "--batched \\\n        --data-workers 4" in out
    assert "cpu or cuda[:i] (default: cuda if available" in " ".join(out.split())


def test_mu_v_is_set_in_the_bqv_runs_only(capsys):
    assert override(tiny(), ["mu_v=0.3"]).mu_v == 0.3  # tiny() is a bqv run
    assert override(tiny(symmetry="symmetric", mu_v=0.0), ["mu_v=0.3"]).mu_v == 0.0
    runs = [override(cfg, ["mu_v=0.3"]) for cfg in select_runs("paper-smoke", "seed0-pt")]
    assert {cfg.symmetry: cfg.mu_v for cfg in runs} == {"symmetric": 0.0, "bq": 0.0, "bqv": 0.3}
    with pytest.raises(SystemExit):
        main(["--preset", "cpu-smoke", "--set", "symmetry=bq", "--set", "mu_v=0.3", "--list"])
    assert "this selection has none" in capsys.readouterr().err


def test_unknown_names_list_the_valid_ones(capsys):
    with pytest.raises(ValueError, match="valid presets: .*cpu-smoke"):
        select_runs("gpu-huge")
    with pytest.raises(ValueError, match="valid parts: .*seed0"):
        select_runs("gpu", "seed9")
    with pytest.raises(ValueError, match=r"--set stepz: no such run setting; did you mean "
                       r"steps, or the optimizer's optimizer_hp.stepz\? \(run settings: "):
        override(tiny(), ["stepz=3"])
    with pytest.raises(ValueError, match="--set lr: no such run setting; an optimizer's "
                                         "setting is set as optimizer_hp.lr=..."):
        override(tiny(), ["lr=3e-4"])
    with pytest.raises(ValueError, match="KEY=VALUE"):
        override(tiny(), ["steps"])
    with pytest.raises(ValueError, match="unknown symmetry"):
        tiny(symmetry="broken")
    with pytest.raises(SystemExit):
        main(["--preset", "nope"])
    assert "valid presets" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([])
    assert "--preset is required; valid presets" in capsys.readouterr().err


def test_cuda_graphs_refuse_what_a_captured_step_cannot_replay(capsys, tmp_path):
    with pytest.raises(SystemExit):
        main(["--preset", "paper-smoke", "--part", "seed0-pt", "--batched", "--device", "cpu",
              "--cuda-graphs", "--out", str(tmp_path)])
    assert "cuda_graphs needs a CUDA device, not cpu: drop --cuda-graphs" in capsys.readouterr().err
    with pytest.raises(ValueError, match="cuda_graphs needs a CUDA device, not cpu"):
        train(tiny(), tmp_path, "cpu", cuda_graphs=True)
    # checked before the device is: these name the fix on any machine
    chaos = tiny(optimizer_hp=dict(lr=1.0, eta=100.0, F0=1.0, nu=0.1))
    with pytest.raises(ValueError, match=r"chaos \(nu > 0\) is applied on the host"):
        check_runs([chaos], tmp_path, "cuda", cuda_graphs=True)
    with pytest.raises(ValueError, match="uses soap: drop --cuda-graphs"):
        check_runs([tiny(optimizer="soap", optimizer_hp=dict(lr=1e-3))], tmp_path, "cuda",
                   cuda_graphs=True)
    check_runs([tiny(optimizer_hp=dict(lr=1.0, eta=100.0, F0=1.0, nu=0.0))], tmp_path, "cpu")
    with pytest.raises(ValueError, match="need a CUDA device, not cpu"):
        CapturedStep(lambda x: x, "cpu")
    with pytest.raises(ValueError, match="warmup must be >= 1"):
        CapturedStep(lambda x: x, "cuda", warmup=0)


def test_a_parameter_made_non_finite_stops_the_run_at_its_next_evaluation(tmp_path):
    """An infinite learning rate: the loss of the first step is finite, the weights after it
    are not; the evaluation names the run, a parameter and the step, and writes no result."""
    cfg = tiny(optimizer="adamw", optimizer_hp=dict(lr=float("inf")), eval_every=1)
    with pytest.raises(FloatingPointError, match=r"adamw-bqv-.*: parameter wte.weight is not "
                                                 r"finite after step 1"):
        train(cfg, tmp_path, progress=False)
    assert not (tmp_path / f"{cfg.name}.json").exists()


def test_list_without_a_preset_lists_every_preset_and_part(capsys):
    main(["--list"])
    out = capsys.readouterr().out
    assert "gpu: seed0 (16 runs), seed1 (16 runs), seed2 (16 runs)" in out
    assert "cpu-smoke: all (4 runs)\n    the pipeline end to end on a tiny model" in out
    from gaugebook.experiment import PRESET_PURPOSES, presets
    assert list(PRESET_PURPOSES) == list(presets())  # each preset says what it is for


def test_gpu_preset_covers_the_grid():
    parts = presets()["gpu"]
    assert sorted(parts) == ["seed0", "seed1", "seed2"]
    runs = [r for part in parts.values() for r in part]
    prelu = {(r.optimizer, r.symmetry, r.seed) for r in runs if r.activation == "prelu"}
    assert len(prelu) == 4 * 3 * 3
    gelu = {(r.optimizer, r.symmetry, r.seed) for r in runs if r.activation == "gelu"}
    assert gelu == {(o, s, seed) for o in ("ecd", "adamw") for s in ("symmetric", "bqv")
                    for seed in range(3)}
    assert len({r.name for r in runs}) == len(runs)


def test_atomic_write_leaves_no_partial_file(tmp_path):
    path = tmp_path / "r.json"
    write_json_atomic(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1} and [p.name for p in tmp_path.iterdir()] == ["r.json"]
    with pytest.raises(TypeError):
        write_json_atomic(path, {"a": object()})  # not serialisable: the old file survives
    assert json.loads(path.read_text()) == {"a": 1}


def test_state_bytes_count_tensors_held_in_lists():
    from gaugebook.experiment import optimizer_state_bytes

    p = torch.nn.Parameter(torch.zeros(3, 4))
    opt = torch.optim.SGD([p], lr=0.1)
    opt.state[p] = {"step": torch.tensor(3.0), "pre": [torch.zeros(3, 3), torch.zeros(4, 4)],
                    "m": torch.zeros(3, 4)}
    assert optimizer_state_bytes(opt) == 4 * (9 + 16 + 12)


def test_sweep_runs_have_distinct_names_and_gpu_names_are_unchanged():
    sweep = select_runs("sweep")
    assert len({r.name for r in sweep}) == len(sweep) == 18
    assert "ecd-bqv-prelu-s0-lr=0.5-F0=2" in {r.name for r in sweep}
    assert "ecd-symmetric-prelu-s0" in {r.name for r in select_runs("gpu", "seed0")}
    assert override(tiny(), ["tag=lr=3e-4"]).name == "ecd-bqv-prelu-s0-lr=3e-4"
    assert override(tiny(), ["tag=1e-3"]).tag == "1e-3"  # a string, although it parses as JSON


def test_a_result_or_checkpoint_of_other_settings_is_refused(tmp_path):
    cfg = tiny(steps=4)
    train(cfg, tmp_path / "done")
    other = tiny(steps=4, optimizer_hp=dict(lr=0.5, eta=100.0, F0=1.0))
    with pytest.raises(ValueError, match=r"done/ecd-bqv-prelu-s0\.json holds run .*optimizer_hp"
                                         r".*another --out, give this run a tag .*or delete the file"):
        train(other, tmp_path / "done")
    assert train(override(other, ["tag=lr0.5"]), tmp_path / "done")["name"].endswith("-lr0.5")
    cut = tmp_path / "cut"
    train(tiny(steps=8), cut, stop_after=4)
    with pytest.raises(ValueError, match=r"ecd-bqv-prelu-s0\.pt holds run .*steps: 8 there, 9"):
        train(tiny(steps=9), cut)
    ckpt_path = cut / "checkpoints" / "ecd-bqv-prelu-s0.pt"  # as the one-run trainer wrote it
    ckpt = torch.load(ckpt_path, weights_only=False)
    old = {"model": ckpt["weights"], "config": ckpt["configs"][0], "step": 4}
    torch.save(old, ckpt_path)
    with pytest.raises(ValueError, match="older format.*delete it"):
        train(tiny(steps=8), cut)
    torch.save(ckpt, ckpt_path)
    assert train(tiny(steps=8), cut)["steps_done"] == 8


def test_a_run_out_of_time_is_evaluated_at_its_last_step(tmp_path):
    result = train(tiny(max_wall_s=1e-9), tmp_path)
    assert result["truncated"] and result["steps_done"] == 1
    assert result["history"]["step"] == [1] and result["final_val_loss"] is not None
    assert train(tiny(max_wall_s=1e-9), tmp_path) == json.loads(json.dumps(result))
    # a time budget is how a run is executed, but a cut run is not the run asked with another
    with pytest.raises(ValueError, match="cut at step 1 by max_wall_s=1e-09, not None"):
        train(tiny(), tmp_path)


def test_a_resumed_run_gets_its_whole_time_budget_again(tmp_path):
    assert train(tiny(steps=8, checkpoint_every=2), tmp_path, stop_after=4) is None
    ckpt_path = tmp_path / "checkpoints" / f"{tiny().name}.pt"
    ckpt = torch.load(ckpt_path, weights_only=False)
    ckpt["elapsed"] = 1000.0  # an earlier call trained for 1000 s
    torch.save(ckpt, ckpt_path)
    result = train(tiny(steps=8, checkpoint_every=2, max_wall_s=600.0), tmp_path)
    assert not result["truncated"] and result["steps_done"] == 8  # not cut at once
    assert result["wall_s"] > 1000.0  # the run's time still counts every call


def test_a_result_removes_the_error_file_of_an_earlier_try(tmp_path):
    cfg = tiny(steps=4)
    write_json_atomic(tmp_path / f"{cfg.name}.error.json", {"error": "out of memory"})
    train(cfg, tmp_path)
    assert not (tmp_path / f"{cfg.name}.error.json").exists()


@pytest.mark.parametrize("assignment, match", [
    ("steps=abc", "steps must be an integer >= 1, got 'abc'"),
    ("checkpoint_every=0", "checkpoint_every must be an integer >= 1, got 0"),
    ("eval_batches=-1", "eval_batches must be an integer >= 1"),
    ("seed=1.5", "seed must be an integer >= 0"),
    ("optimizer=adam", "unknown optimizer 'adam'; valid: .*'ecd'"),
    ("activation=relu", "activation must be one of .*'prelu'.*got 'relu'"),
    ("mu_v=abc", "mu_v must be a finite number, got 'abc'"),
    ("block_size=16", "block_size must be >= 32 .*probes.*got 16"),
    ("max_wall_s=0", "max_wall_s must be None or a positive number"),
    ("compile=1", "compile must be true or false"),
    ("tag=a/b", "tag must be a string .* got 'a/b'"),
])
def test_bad_run_settings_are_refused_up_front(assignment, match):
    with pytest.raises(ValueError, match=match):
        override(tiny(), [assignment])


class _OffCPU:
    """Stands in for a tensor on an accelerator: only ``.cpu()`` gives the tensor back."""

    def __init__(self, tensor):
        self._tensor = tensor

    def cpu(self):
        return self._tensor


def test_random_states_are_moved_to_the_cpu_before_they_are_restored():
    from gaugebook.training import _rng_state, _set_rng_state

    state = _rng_state(torch.device("cpu"))
    expected = torch.rand(3)
    _set_rng_state({**state, "torch": _OffCPU(state["torch"])}, torch.device("cpu"))
    assert torch.equal(torch.rand(3), expected)


def test_several_parts_are_trained_as_one_cohort_per_arm():
    """`--part seed1-pt,seed2-pt,seed2-global` selects the three parts; batched, each arm of them
    is one cohort. The preset `paper` has one part per seed and arm, `paper-cpu` one per seed."""
    from gaugebook.training import cohorts

    parts = ["seed1-pt", "seed2-pt", "seed2-global"]
    runs = select_runs("paper-smoke", ",".join(parts))
    assert [r.name for r in runs] == [r.name for p in parts for r in select_runs("paper-smoke", p)]
    assert sorted(len(c) for c in cohorts(runs)) == [2, 6]
    for preset, by_arm in [("paper", True), ("paper-smoke", True), ("paper-cpu", False)]:
        table = presets()[preset]
        assert sum(map(len, table.values())) == 21
        for part, cfgs in table.items():
            assert len(cohorts(cfgs)) == (1 if by_arm else 3), part
    with pytest.raises(ValueError, match="no part 'seed9'"):
        select_runs("paper-smoke", "seed1-pt,seed9")
    with pytest.raises(ValueError, match="twice"):
        select_runs("paper-smoke", "seed1-pt,seed1-pt")


def _record(folder: Path, cfg: RunConfig, wall_s: float, steps_done: int, trained_with):
    """A result file (schema-valid, with an empty history) whose timing plan_parts reads."""
    history = {key: [] for key in HISTORY_KEYS}
    write_json_atomic(folder / f"{cfg.name}.json",
                      {"name": cfg.name, "config": dataclasses.asdict(cfg), "wall_s": wall_s,
                       "steps_done": steps_done, "truncated": steps_done < cfg.steps,
                       "trained_with": trained_with, "history": history,
                       "final_val_loss": None, "probes": {}, "optimizer_state_bytes": 0,
                       "n_params": 0, "tokens": 0, "tokens_per_s": 0.0, "provenance": {}})


def test_plan_parts_fits_as_many_parts_as_the_recorded_times_allow(tmp_path):
    from gaugebook.experiment import plan_parts

    parts = list(presets()["paper"])  # arm by arm: the paper's own optimizer first
    assert parts[:4] == ["seed0-pt", "seed1-pt", "seed2-pt", "seed0-global"]
    runs = {part: select_runs("paper", part) for part in parts}
    assert plan_parts("paper", tmp_path, 440) == ["seed0-pt"]  # nothing recorded: one part
    first = runs["seed0-pt"]
    names = [c.name for c in first]
    for cfg in first:  # one part took at most 120 s
        _record(tmp_path, cfg, 100.0 + 20 * (cfg.symmetry == "bq"), cfg.steps, names)
    assert plan_parts("paper", tmp_path, 440) == ["seed1-pt", "seed2-pt", "seed0-global"]
    assert plan_parts("paper", tmp_path, 250) == ["seed1-pt"]  # 2 x 120 > 0.9 x 250
    # a truncated run counts at its full length: 150 s for half its steps is 300 s per part
    _record(tmp_path, first[0], 150.0, first[0].steps // 2, names)
    assert plan_parts("paper", tmp_path, 440) == ["seed0-pt"]
    # two parts trained at once for 200 s: 100 s per part
    both = runs["seed0-pt"] + runs["seed1-pt"]
    for cfg in both:
        _record(tmp_path, cfg, 200.0, cfg.steps, [c.name for c in both])
    assert plan_parts("paper", tmp_path, 440) == ["seed2-pt", "seed0-global", "seed1-global"]
    for part in parts[2:]:
        for cfg in runs[part]:
            _record(tmp_path, cfg, 90.0, cfg.steps, [cfg.name])
    assert plan_parts("paper", tmp_path, 440) == []  # every part complete
    # a later folder's result replaces an earlier one's: one truncated run is missing again
    later = tmp_path / "this-call"
    later.mkdir()
    _record(later, first[1], 400.0, first[1].steps // 2, names)
    assert plan_parts("paper", [tmp_path, later], 440) == ["seed0-pt"]
    assert plan_parts("paper", [tmp_path, later], 440, at_least_one=False) == []  # 800 s
    (later / f"{first[1].name}.json").write_text("{")  # not a result: refused, named
    with pytest.raises(ValueError, match=f"{first[1].name}.json is not valid JSON"):
        plan_parts("paper", [tmp_path, later], 440)
    with pytest.raises(ValueError, match="unknown preset 'paper-gpu'; valid presets"):
        plan_parts("paper-gpu", tmp_path, 440)  # was a bare KeyError


def test_plan_parts_reads_the_recorded_files_that_predate_optional_keys():
    """results/gpu/seed0 predates "trained_with" (optional in the schema): its
    runs stopped at their time budget, so the part is planned again, each run one part."""
    from gaugebook.experiment import plan_parts
    from gaugebook.results import find_results

    folder = find_results("results/gpu/seed0")
    old = json.loads(next(folder.glob("*.json")).read_text())
    assert "trained_with" not in old and old["truncated"]
    assert plan_parts("gpu", folder, 600) == ["seed0"]


def test_grid_benchmark_times_the_optimizer_steps_of_each_projection(tmp_path, bench_grid):
    """`bench_grid.py --steps-only` on the seed-0 parts (its default) times one ECD step per
    projection, alone and with the largest cohort stacked, against fused AdamW's, and records
    the command it ran."""
    out = tmp_path / "steps.json"
    bench_grid.main(["--device", "cpu", "--preset", "paper-smoke", "--steps-only",
                     "--reps", "1", "--out", str(out)])
    result = json.loads(out.read_text())
    with pytest.raises(SystemExit):  # an AdamW-only part has no ECD step to time
        bench_grid.main(["--device", "cpu", "--preset", "paper-smoke", "--part",
                         "seed0-adamw", "--steps-only", "--out", str(out)])
    assert [(s["projection"], s["members"]) for s in result["step"]] == [
        ("per_tensor", 1), ("per_tensor", 3), ("global", 1), ("global", 3)]
    assert all(s["ecd_step_s"] > 0 and s["ecd_operators_step_s"] > 0 and s["adamw_fused"]
               for s in result["step"])
    assert not any(s["ecd_fused"] for s in result["step"])  # (fused kernels: on CUDA)
    assert not any("ecd_replayed_step_s" in s for s in result["step"])  # CUDA graphs: CUDA only
    assert "--steps-only" in result["command"] and "batched" not in result


def test_a_run_resumed_another_way_records_each_way(tmp_path, monkeypatch):
    """The GPU script retries a failed part "the next way" from its checkpoint: the result says
    how each stretch of steps was trained, not only how the last call trained."""
    monkeypatch.delenv("TORCHINDUCTOR_CPP_WRAPPER", raising=False)
    plain = {"compile": False, "cuda_graphs": False, "cpp_wrapper": False}
    cfg = tiny(steps=8)
    assert train(cfg, tmp_path / "same", stop_after=6) is None  # checkpoint at step 4
    assert train(cfg, tmp_path / "same")["ways"] == [{"from_step": 0, **plain}]  # one way
    assert train(cfg, tmp_path / "other", stop_after=6) is None
    monkeypatch.setenv("TORCHINDUCTOR_CPP_WRAPPER", "1")  # the way a retry may take
    assert train(cfg, tmp_path / "other")["ways"] == [
        {"from_step": 0, **plain}, {"from_step": 4, **plain, "cpp_wrapper": True}]


def test_bias_pace_is_adamw_bqv_over_its_symmetric_twin_in_the_separate_phase():
    """The twin is found by the preset's configs: same activation, seed and tag; several
    candidate pairs (the gpu preset's PReLU and GELU, a sweep's rates) are not guessed among."""
    from gaugebook.experiment import bias_pace

    speeds = {"adamw-bqv-prelu-s0": 90.0, "adamw-symmetric-prelu-s0": 100.0,
              "adamw-bqv-gelu-s0": 50.0, "adamw-symmetric-gelu-s0": 100.0,
              "ecd-bqv-prelu-s0-pt": 1.0, "ecd-symmetric-prelu-s0-pt": 1000.0}
    gpu = {"preset": "gpu", "part": "seed0", "separate": {"per_run_tokens_per_s": speeds}}
    assert bias_pace(gpu) == pytest.approx(0.9)
    assert bias_pace(gpu, activation="gelu") == pytest.approx(0.5)
    paper = dict(gpu, preset="paper", part="seed0-pt,seed0-adamw")
    assert bias_pace(paper) == pytest.approx(0.9)
    del speeds["adamw-symmetric-prelu-s0"]
    with pytest.raises(ValueError, match="has 0 pairs of symmetric and bqv prelu AdamW runs"):
        bias_pace(gpu)
    sweep = {f"adamw-{s}-prelu-s0-lr={lr}": 1.0 for s in ("symmetric", "bqv")
             for lr in ("0.0001", "0.0003")}
    with pytest.raises(ValueError, match="has 2 pairs"):
        bias_pace({"preset": "paper-lr", "part": "adamw",
                   "separate": {"per_run_tokens_per_s": sweep}})
