"""benchmarks/collect_gpu_call.py: a GPU call's files brought into the repository."""
import io
import json
import tarfile

import pytest


def result(name, truncated, last_step):
    """A result record of ``name`` evaluated every 500 steps up to ``last_step``."""
    steps = list(range(500, last_step + 1, 500))
    n = len(steps)
    history = {"step": steps, "train_loss": [3.0] * n, "val_loss": [3.0] * n, "J_QK": [0.0] * n,
               "J_VO": [0.0] * n, "wall_s": [1.0] * n}
    return {"name": name, "config": {"optimizer": "ecd", "symmetry": "symmetric",
                                     "activation": "prelu", "seed": 0, "tag": "pt"},
            "steps_done": last_step, "truncated": truncated, "history": history,
            "final_val_loss": 3.0, "probes": {}, "optimizer_state_bytes": 0, "n_params": 1,
            "wall_s": 1.0, "tokens": 1, "tokens_per_s": 1.0, "provenance": {}}


def pack(path, files):
    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            raw = json.dumps(data).encode()
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))


def test_a_call_is_collected_without_losing_a_complete_run(tmp_path, collect_gpu_call,
                                                           monkeypatch, capsys):
    root, files = tmp_path / "repo", tmp_path / "files"
    (root / "results" / "gpu" / "paper").mkdir(parents=True)
    (root / "benchmarks" / "results").mkdir(parents=True)
    (root / "results" / "gpu" / "logs-2026-12-05").mkdir()  # an earlier call that day
    paper = root / "results" / "gpu" / "paper"
    recorded = {"ecd-bq-prelu-s0-pt": result("ecd-bq-prelu-s0-pt", False, 28000),
                "ecd-bqv-prelu-s0-pt": result("ecd-bqv-prelu-s0-pt", True, 20000),
                "ecd-symmetric-prelu-s0-pt": result("ecd-symmetric-prelu-s0-pt", True, 20000)}
    for name, data in recorded.items():
        (paper / f"{name}.json").write_text(json.dumps(data))
    files.mkdir()
    pack(files / "paper.tar", {
        "paper/ecd-bq-prelu-s0-pt.json": result("ecd-bq-prelu-s0-pt", True, 1000),
        "paper/ecd-bqv-prelu-s0-pt.json": result("ecd-bqv-prelu-s0-pt", True, 15000),
        "paper/ecd-symmetric-prelu-s0-pt.json": result("ecd-symmetric-prelu-s0-pt", False, 28000),
        "paper/ecd-bqv-prelu-s1-pt.json": result("ecd-bqv-prelu-s1-pt", False, 28000),
        "paper/ecd-symmetric-prelu-s1-pt.error.json": {"error": "out of memory"},
    })
    bars = "".join(f"\r3 runs (ecd, batched):  {n // 280}%|#| {n}/28000 [00:01<00:02, 5it/s]"
                   for n in range(0, 28001, 250))
    cut = "".join(f"\r3 runs (ecd, batched):  {n // 280}%|#| {n}/28000 [00:01<00:02, 5it/s]"
                  for n in range(0, 2751, 250))  # a retry's bar, cut at step 2,750
    (files / "paper.log").write_text("=== part seed1-pt, 400 s, graphs\n" + bars
                                     + "\n=== part seed2-pt, 100 s, graphs\n" + cut + "\ndone\n")
    (files / "grid_h200_steps.json").write_text("{}")
    (files / "grid_h200.json").write_text(json.dumps({"steps": {}, "bias": {}}))
    (files / "grid_h100_partial.json").write_text("{}")  # named after the chip it ran on

    report = collect_gpu_call.collect(files, root, "2026-12-05")
    saved = {name: json.loads((paper / f"{name}.json").read_text()) for name in recorded}
    assert saved["ecd-bq-prelu-s0-pt"] == recorded["ecd-bq-prelu-s0-pt"]  # complete stays
    assert saved["ecd-bqv-prelu-s0-pt"] == recorded["ecd-bqv-prelu-s0-pt"]  # the longer cut
    assert not saved["ecd-symmetric-prelu-s0-pt"]["truncated"]  # a complete run replaces a cut
    assert json.loads((paper / "ecd-bqv-prelu-s1-pt.json").read_text())["steps_done"] == 28000
    assert not list(paper.glob("*.error.json"))  # a failed run stays out of the results
    logs = root / "results" / "gpu" / "logs-2026-12-05b"
    assert json.loads((logs / "errors" / "paper-ecd-symmetric-prelu-s1-pt.error.json")
                      .read_text()) == {"error": "out of memory"}
    log = (logs / "paper.log").read_text().splitlines()
    steps = [int(line.split("| ")[1].split("/")[0]) for line in log if "/28000" in line]
    # each 1,000 steps once, the end; the retry's bar anew, with the step where it was cut
    assert steps == [*range(0, 28001, 1000), 0, 1000, 2000, 2750]
    assert log[1] == "=== part seed1-pt, 400 s, graphs" and log[-1] == "done"
    bench = root / "benchmarks" / "results"
    assert (bench / "grid_h200.json").is_file()
    assert (bench / "grid_h200_steps_2026-12-05b.json").is_file()  # named like the logs
    assert (bench / "grid_h100_partial_2026-12-05b.json").is_file()
    assert "kept complete paper/ecd-bq-prelu-s0-pt.json (the call's is cut)" in report
    assert ("kept paper/ecd-bqv-prelu-s0-pt.json cut at step 20000 (the call's is cut at "
            "15000)") in report
    # a second collection of the same call: the benchmark goes under the next tag, and a
    # name that is taken is refused before anything is written
    report = collect_gpu_call.collect(files, root, "2026-12-05")
    assert "benchmarks/results/grid_h200_2026-12-05c.json" in report
    (bench / "grid_h200_steps_2026-12-05d.json").write_text("{}")
    with pytest.raises(FileExistsError, match="grid_h200_steps_2026-12-05d.json exists"):
        collect_gpu_call.collect(files, root, "2026-12-05")
    assert not (root / "results" / "gpu" / "logs-2026-12-05d").exists()
    with pytest.raises(FileNotFoundError, match="files_at"):
        collect_gpu_call.collect(tmp_path / "nowhere", root, "2026-12-05")
    # the command: it reports, then the status of the repository's own results/gpu/paper
    monkeypatch.chdir(tmp_path)
    for name in ("grid_h200_steps.json", "grid_h200.json", "grid_h100_partial.json"):
        (files / name).unlink()
    collect_gpu_call.main([str(files), "--root", str(root), "--date", "2026-12-06"])
    out = capsys.readouterr().out
    assert "results/gpu/logs-2026-12-06/paper.log" in out
    assert out.endswith("results/gpu/paper: 4 of the 21 runs recorded (parts seed0-pt, seed1-pt), "
                        "1 truncated; complete arms: none\n")
