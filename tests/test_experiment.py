import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gaugebook.experiment import (RunConfig, main, override, presets, select_runs, train,
                                  write_json_atomic)

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


def test_unknown_names_list_the_valid_ones(capsys):
    with pytest.raises(ValueError, match="valid presets: .*cpu-smoke"):
        select_runs("gpu-huge")
    with pytest.raises(ValueError, match="valid parts: .*seed0"):
        select_runs("gpu", "seed9")
    with pytest.raises(ValueError, match="unknown run config key.*'stepz'.*valid keys"):
        override(tiny(), ["stepz=3"])
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


def test_list_without_a_preset_lists_every_preset_and_part(capsys):
    main(["--list"])
    out = capsys.readouterr().out
    assert "gpu: seed0 (16 runs), seed1 (16 runs), seed2 (16 runs)" in out
    assert "cpu-smoke: all (4 runs)" in out


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
