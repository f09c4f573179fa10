"""The engine under bad input and faults: no silent wrong answer, no lost or clobbered result."""
import dataclasses
import fcntl
import json
import math
import subprocess

import pytest
import torch

from gaugebook.experiment import RunConfig, main, train
from gaugebook.gpt import GPT, GPTConfig


def tiny(**changes) -> RunConfig:
    base = dict(optimizer="adamw", symmetry="bqv", n_layer=1, n_head=2, n_embd=16, block_size=32,
                batch_size=4, steps=8, eval_every=4, eval_batches=1, probe_instances=4,
                checkpoint_every=4, optimizer_hp=dict(lr=1e-3), mu_v=0.5)
    return RunConfig(**{**base, **changes})


def cli_error(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(list(argv))
    assert exit_.value.code == 2
    return capsys.readouterr().err


def test_a_second_writer_fails_clearly_instead_of_overwriting(tmp_path):
    cfg = tiny()
    with open(tmp_path / f"{cfg.name}.lock", "a") as held:  # another process's lock
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(RuntimeError, match="another process is training adamw-bqv-prelu-s0"):
            train(cfg, tmp_path, progress=False)
    assert not (tmp_path / f"{cfg.name}.json").exists()
    assert train(cfg, tmp_path, progress=False)["steps_done"] == 8  # free again: it trains


def test_the_command_line_names_a_held_run_before_training_any(tmp_path, capsys):
    """It trained the preset's other runs first, then ended in a traceback."""
    out = tmp_path / "o"
    out.mkdir()
    with open(out / "ecd-bqv-prelu-s0.lock", "a") as held:  # another process's lock
        fcntl.flock(held, fcntl.LOCK_EX)
        err = cli_error(capsys, "--preset", "cpu-smoke", "--out", str(out))
    assert "another process is training ecd-bqv-prelu-s0" in err
    assert not list(out.glob("*.json"))


def test_a_refused_writer_leaves_the_holders_lock_in_force(tmp_path):
    cfg = tiny()
    with open(tmp_path / f"{cfg.name}.lock", "a") as held:  # another process's lock
        fcntl.flock(held, fcntl.LOCK_EX)
        for _ in range(2):  # the first refusal must not free the run for the second writer
            with pytest.raises(RuntimeError, match="another process is training"):
                train(cfg, tmp_path, progress=False)


def test_runs_that_would_share_a_result_file_are_refused(tmp_path, capsys):
    err = cli_error(capsys, "--preset", "cpu-smoke", "--out", str(tmp_path), "--set",
                    "symmetry=bqv", "--set", "mu_v=0")
    assert "would write the same result file" in err and not list(tmp_path.glob("*.json"))


def test_dotted_set_merges_into_the_optimizer_settings():
    from gaugebook.run_config import override

    cfg = override(tiny(optimizer="ecd", optimizer_hp=dict(lr=1.0, eta=100.0, F0=1.0)),
                   ["optimizer_hp.lr=0.5"])
    assert cfg.optimizer_hp == dict(lr=0.5, eta=100.0, F0=1.0)
    with pytest.raises(ValueError, match="only optimizer_hp has entries"):
        override(cfg, ["model.n_layer=3"])


@pytest.mark.parametrize("content", [b"", b"garbage \x00\x01", "truncated"])
def test_a_corrupt_checkpoint_is_set_aside_and_the_run_restarts(tmp_path, content):
    cfg = tiny()
    full = train(cfg, tmp_path / "full", progress=False)
    assert train(cfg, tmp_path / "cut", stop_after=4, progress=False) is None
    path = tmp_path / "cut" / "checkpoints" / f"{cfg.name}.pt"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if content == "truncated" else content)
    with pytest.warns(RuntimeWarning, match=r"unreadable.*moved to .*\.pt\.corrupt"):
        resumed = train(cfg, tmp_path / "cut", progress=False)
    assert resumed["history"]["val_loss"] == full["history"]["val_loss"]
    assert (tmp_path / "cut" / "checkpoints" / f"{cfg.name}.pt.corrupt").exists()


@pytest.mark.parametrize("content", ['{"name": "adamw-bqv',  # cut while written
                                     '{"name": "adamw-bqv-prelu-s0", "note": "no config"}',
                                     "[1, 2]"])
def test_an_unreadable_result_is_set_aside_and_retrained(tmp_path, content):
    cfg = tiny()
    path = tmp_path / f"{cfg.name}.json"
    path.write_text(content)
    with pytest.warns(RuntimeWarning, match="unreadable"):
        result = train(cfg, tmp_path, progress=False)
    assert json.loads(path.read_text())["name"] == result["name"]


def test_a_stored_config_this_version_cannot_read_names_its_file(tmp_path):
    """It read as if the user's own --set were wrong ("unknown RunConfig keys ['foo']")."""
    cfg = tiny()
    train(cfg, tmp_path, progress=False)
    path = tmp_path / f"{cfg.name}.json"
    record = json.loads(path.read_text())
    record["config"]["foo"] = 1
    path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=f"{path} holds a configuration this version cannot "
                                         r"read \(unknown RunConfig keys"):
        train(cfg, tmp_path, progress=False)


def test_a_stored_config_without_a_required_key_is_named():
    """RunConfig.from_dict said "__init__() missing 1 required positional argument", one key at a
    time, where GPTConfig.from_dict named them all; both now share one reader."""
    from gaugebook.run_config import RunConfig

    with pytest.raises(ValueError, match=r"RunConfig is missing required keys \['optimizer'\]"):
        RunConfig.from_dict({"seed": 1})


def test_stale_temporary_files_are_removed(tmp_path):
    cfg = tiny()
    (tmp_path / "checkpoints").mkdir(parents=True)
    stale = [tmp_path / f"{cfg.name}.json.tmp999", tmp_path / "checkpoints" / f"{cfg.name}.pt.tmp9"]
    others = [tmp_path / f"{cfg.name}-lr=0.001.json.tmp7",  # another run's, maybe being written
              tmp_path / "checkpoints" / f"{cfg.name}-lr=0.001.pt.tmp7",
              tmp_path / "checkpoints" / "batch-0123456789ab.pt.tmp7"]
    for path in stale + others:
        path.write_text("half")
    train(cfg, tmp_path, progress=False)
    assert not any(path.exists() for path in stale) and all(path.exists() for path in others)


def test_a_full_disk_names_the_file_and_leaves_no_temporary(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        from gaugebook.run_files import write_json_atomic

        with pytest.raises(OSError, match=r"cannot write .*big\.json.*MiB free"):
            write_json_atomic(mount / "big.json", {"x": "y" * 200_000})
        assert list(mount.iterdir()) == []
    finally:
        subprocess.run(["umount", str(mount)])


def test_problems_found_before_training_print_one_clean_line(tmp_path, capsys):
    if not torch.cuda.is_available():
        err = cli_error(capsys, "--preset", "cpu-smoke", "--device", "cuda", "--out",
                        str(tmp_path))
        assert "torch sees no CUDA device here; use --device cpu" in err
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    err = cli_error(capsys, "--preset", "cpu-smoke", "--out", str(blocker / "out"))
    assert "cannot write results to" in err
    err = cli_error(capsys, "--preset", "cpu-smoke", "--out", str(tmp_path / "o"), "--set",
                    "optimizer_hp.momentum=0.9")
    assert "is not accepted by" in err and "Traceback" not in err
    err = cli_error(capsys, "--preset", "cpu-smoke", "--out", str(tmp_path / "o"), "--set",
                    'optimizer_hp={"lr": 0.5}')
    assert "missing" in err and "optimizer_hp.KEY=VALUE changes one" in err
    err = cli_error(capsys, "--preset", "cpu-smoke", "--out", str(tmp_path / "o"), "--set",
                    "n_head=3")
    assert "not divisible by n_head=3" in err
    err = cli_error(capsys, "--preset", "cpu-smoke", "--out", str(tmp_path / "o"), "--set",
                    "mu_v=abc")
    assert "mu_v must be a finite number" in err
    assert not list((tmp_path / "o").glob("*.json"))


def test_gpt_refuses_bad_tokens_and_frozen_configs():
    torch.manual_seed(0)
    config = GPTConfig(10, 8, 1, 2, 8)
    model = GPT(config)
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 10\), got \[0, 10\]"):
        model(torch.tensor([[0, 10]]))
    with pytest.raises(ValueError, match="token ids"):
        model(torch.tensor([[-1, 2]]))
    with pytest.raises(ValueError, match="empty batch"):
        model(torch.zeros(0, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="integer token ids"):
        model(torch.zeros(1, 4))
    idx = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="every target is -100"):
        model(idx, torch.full_like(idx, -100))
    with pytest.raises(ValueError, match=r"targets must lie in \[0, 10\) or be -100 \(ignored\), "
                       r"got \[2, 10\]"):
        model(idx, torch.tensor([[-100, 2, 10]]))  # cross_entropy: "Target 10 is out of bounds"
    with pytest.raises(ValueError, match="targets must hold integer token ids"):
        model(idx, idx.float())
    with pytest.raises(ValueError, match="idx must hold integer token ids, got dtype torch.bool"):
        model(idx.bool())
    with pytest.raises(ValueError, match=r"targets must be torch.long .* pass targets.long\(\)"):
        model(idx, idx.int())  # cross_entropy failed only after the whole forward pass
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.n_head = 3
    with pytest.raises(ValueError, match="divisible"):
        dataclasses.replace(config, n_head=3)
    for kw, match in [(dict(max_new_tokens=-1), "max_new_tokens"),
                      (dict(max_new_tokens=2, top_k=1.5), "top_k"),
                      (dict(max_new_tokens=2, temperature=float("nan")), "temperature"),
                      (dict(max_new_tokens=2, temperature=True), "temperature must be finite")]:
        with pytest.raises(ValueError, match=match):
            model.generate(idx, **kw)


def test_analyses_refuse_non_finite_weights_and_inputs():
    """The random-direction estimates too: zero_change_estimate returned 0 from NaN changes."""
    from gaugebook.attention import MultiHeadAttention
    from gaugebook.gauge import invariance_error, random_element
    from gaugebook.orbit import orbit_dimension
    from gaugebook.projection import sketched_rank, zero_change_estimate
    from gaugebook.redundancy import jacobian, redundancy
    from gaugebook.sharpness import minimise_over_orbit

    g = torch.Generator().manual_seed(0)
    attn = MultiHeadAttention(8, 2, 4, dtype=torch.float64, generator=g)
    x = torch.randn(2, 5, 8, dtype=torch.float64, generator=g)
    element = random_element(attn, cond=10.0, generator=g)
    bad_x = x.clone()
    bad_x[0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"input 0 \(shape \(2, 5, 8\)\) is not finite"):
        redundancy(attn, bad_x)
    with torch.no_grad():
        attn.W_Q[0, 0, 0] = float("nan")  # the fused CPU kernel would hide it
    for call in (lambda: invariance_error(element, attn, x), lambda: redundancy(attn, x),
                 lambda: orbit_dimension(attn), lambda: jacobian(attn, x),
                 lambda: zero_change_estimate(attn, x, n_directions=10, generator=g),
                 lambda: sketched_rank(attn, x, n_columns=10, generator=g),
                 lambda: minimise_over_orbit(attn, lambda y: y.square().mean(), x, steps=1)):
        with pytest.raises(ValueError, match="parameter W_Q of MultiHeadAttention is not finite"):
            call()


def test_an_infinite_mask_buffer_is_allowed_and_a_nan_buffer_refused():
    """A -inf causal mask is a buffer like any other: the Jacobian of such a model is measured
    (it was refused when the non-finite check came to every Jacobian)."""
    from gaugebook.redundancy import jacobian

    class Masked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(3, 3, dtype=torch.float64))
            self.register_buffer("mask", torch.full((3, 3), -math.inf).triu(1))

        def forward(self, x):
            return torch.softmax(x @ self.w + self.mask, dim=-1)

    m, x = Masked(), torch.randn(2, 3, 3, dtype=torch.float64)
    assert jacobian(m, x).shape == (18, 9)
    m.mask[0, 0] = math.nan
    with pytest.raises(ValueError, match="buffer mask of Masked holds a NaN"):
        jacobian(m, x)


def test_bad_tolerances_permutations_and_probe_vocabularies_are_refused():
    from gaugebook.attention import MultiHeadAttention
    from gaugebook.data import DefaultCorpus, evaluate_probes
    from gaugebook.gauge import HeadPermutation
    from gaugebook.redundancy import redundancy

    g = torch.Generator().manual_seed(0)
    attn = MultiHeadAttention(8, 2, 4, dtype=torch.float64, generator=g)
    x = torch.randn(2, 5, 8, dtype=torch.float64, generator=g)
    for rtol in (-1.0, float("nan"), "tight"):
        with pytest.raises(ValueError, match="rtol"):
            redundancy(attn, x, rtol=rtol)
    with pytest.raises(ValueError, match="integer indices.*truncated"):
        HeadPermutation(torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match="vocabulary has 100 tokens.*4832"):
        evaluate_probes(GPT(GPTConfig(100, 64, 1, 2, 8)), DefaultCorpus(0).tokenizer,
                        n_per_task=2)


def test_two_concurrent_runners_with_different_settings(tmp_path):
    """A runner in another process holds the run; a second one with other settings fails at once
    and the first one's result is the one written."""
    import sys
    import time

    script = ("import sys; from pathlib import Path; from gaugebook.experiment import RunConfig, "
              "train; cfg = RunConfig(optimizer='adamw', symmetry='bqv', n_layer=1, n_head=2, "
              "n_embd=16, block_size=32, batch_size=4, steps=400, eval_every=200, "
              "eval_batches=1, probe_instances=4, checkpoint_every=100, "
              "optimizer_hp=dict(lr=1e-3), mu_v=0.5); train(cfg, Path(sys.argv[1]), "
              "progress=False)")
    first = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)])
    # its first checkpoint (step 100 of 400) is written while it holds the run's lock
    checkpoint, deadline = tmp_path / "checkpoints" / "adamw-bqv-prelu-s0.pt", time.time() + 120
    while not checkpoint.exists() and first.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert checkpoint.exists() and first.poll() is None, "the first runner is not training"
    with pytest.raises(RuntimeError, match="another process is training adamw-bqv-prelu-s0"):
        train(tiny(steps=8), tmp_path, progress=False)
    assert first.wait(timeout=300) == 0
    assert json.loads((tmp_path / "adamw-bqv-prelu-s0.json").read_text())["config"]["steps"] == 400
    with pytest.raises(ValueError, match="other settings"):  # and afterwards it is refused
        train(tiny(steps=8), tmp_path, progress=False)


@pytest.mark.parametrize("key, value, fix", [("fused", False, "follows compile"),
                                             ("chaos_seeds", [1], "come from seed"),
                                             ("members", 2, "--batched"),
                                             ("blocks", [], "optimizer_hp.partition")])
def test_optimizer_settings_the_trainer_owns_are_refused_before_training(key, value, fix):
    """Set by hand they would collide with the trainer's own (a TypeError once training
    started); the message names the control to use."""
    hp = dict(lr=1.0, eta=100.0, F0=1.0, **{key: value})
    with pytest.raises(ValueError, match=f"trainer sets .*{fix}"):
        tiny(optimizer="ecd", optimizer_hp=hp)


def test_adamw_keeps_its_own_fused_setting():
    """The trainer sets ``fused`` for ECD only: AdamW's ``fused`` is the user's to choose."""
    cfg = tiny(optimizer_hp=dict(lr=1e-3, fused=False))
    assert cfg.optimizer == "adamw" and cfg.optimizer_hp["fused"] is False


def test_concurrent_workers_report_only_this_calls_failures(tmp_path):
    """Two worker processes train two runs; another run's error file, left by an earlier call,
    is not this call's failure. Each worker takes its share of the host's threads (with all
    of them each, two workers on two cores trained about 12 times slower). The folder may be
    given as a string (its error files were looked up with ``str / str``)."""
    from gaugebook.experiment import run_many

    (tmp_path / "some-other-run.error.json").write_text('{"error": "from an earlier call"}')
    runs = [tiny(steps=2, eval_every=2, seed=s) for s in (0, 1)]
    run_many(runs, str(tmp_path), "cpu", workers=2)
    results = [json.loads((tmp_path / f"{cfg.name}.json").read_text()) for cfg in runs]
    share = max(1, torch.get_num_threads() // 2)
    assert [r["provenance"]["threads"] for r in results] == [share, share]


def test_runs_that_fail_in_training_are_recorded_and_named_without_a_traceback(tmp_path,
                                                                              capsys):
    """A run whose loss diverges: with one worker the call used to end in the run's traceback,
    before the other runs; now every run is tried, each failure is recorded with its traceback
    in ``<run>.error.json`` (as with several workers), and the call ends in one message."""
    with pytest.raises(SystemExit) as exit_:
        main(["--preset", "cpu-smoke", "--out", str(tmp_path), "--device", "cpu",
              "--set", "optimizer_hp.lr=1e30"])
    err = capsys.readouterr().err
    assert exit_.value.code == 1 and "Traceback" not in err
    names = ["ecd-symmetric-prelu-s0", "ecd-bqv-prelu-s0", "adamw-symmetric-prelu-s0",
             "adamw-bqv-prelu-s0"]
    for name in names:  # every run was tried: it failed, or it finished
        assert (tmp_path / f"{name}.error.json").exists() or (tmp_path / f"{name}.json").exists()
    record = json.loads((tmp_path / "adamw-bqv-prelu-s0.error.json").read_text())
    assert "non-finite training loss" in record["error"]
    assert record["traceback"].startswith("Traceback") and record["config"]["seed"] == 0
    assert "runs failed: " in err and f"are in {tmp_path}/<run>.error.json" in err


def test_a_resumed_run_says_so(tmp_path, capsys):
    cfg = tiny()
    train(cfg, tmp_path, stop_after=4, progress=False)  # leaves its checkpoint at step 4
    capsys.readouterr()
    train(cfg, tmp_path)
    err = capsys.readouterr().err
    assert (f"resuming {cfg.name} at step 4 of 8 ({tmp_path}/checkpoints/{cfg.name}.pt)"
            in err)


def test_a_config_without_a_learning_rate_is_refused_when_made():
    """It used to be accepted, and failed in training naming make_optimizer's argument."""
    with pytest.raises(ValueError, match=r"optimizer_hp needs a learning rate: set "
                       r"optimizer_hp=dict\(lr=...\) .*gaugebook.experiment.HP\['adamw'\]"):
        RunConfig("adamw")


def test_an_unusable_device_is_named_before_training(capsys, tmp_path):
    err = cli_error(capsys, "--preset", "cpu-smoke", "--device", "mps", "--out", str(tmp_path))
    assert "--device mps: torch cannot use it here" in err and "use --device cpu" in err
    assert not list(tmp_path.glob("*.lock"))


@pytest.mark.parametrize("option", [["--workers", "2"], ["--batched"]])
def test_torchrun_refuses_options_it_cannot_honour(capsys, monkeypatch, tmp_path, option):
    monkeypatch.setenv("WORLD_SIZE", "2")
    err = cli_error(capsys, "--preset", "cpu-smoke", "--out", str(tmp_path), *option)
    assert "under torchrun" in err and "drop --batched and --workers" in err


def test_symmetry_tools_name_the_bad_argument():
    """Each was a deep RuntimeError, IndexError, KeyError or AttributeError, or (NaN) silence."""
    from gaugebook.attention import MultiHeadAttention
    from gaugebook.breaking import ShiftedAttention
    from gaugebook.gauge import GaugeElement, HeadPermutation, QKTransform
    from gaugebook.gpt_gauge import PositionCentring
    from gaugebook.gpt_redundancy import make_generic_
    from gaugebook.interpret import centred_on_vocabulary
    from gaugebook.lie import (attention_terms, drawn_gauge, factor_redundancy, gl_basis,
                               momentum_map, rope_plane_breaking_basis, tangent_map)
    from gaugebook.mechanics import qk_charge, vo_charge
    from gaugebook.moe import MoE, load_balancing_loss
    from gaugebook.orbit import orbit_tangents
    from gaugebook.projection import zero_change_estimate
    from gaugebook.rope import rope_frequencies, rotation_matrix
    from gaugebook.sharpness import hutchinson_trace, top_eigenvalue

    m = MultiHeadAttention(4, 2, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="QKTransform: MultiHeadAttention has no submodule 'x'"):
        tangent_map(m, QKTransform, "x")
    with pytest.raises(ValueError, match=r"QKTransform moves \['W_K'\], which have no momentum"):
        momentum_map(m, QKTransform, {"W_Q": torch.zeros_like(m.W_Q)})
    # n_kv_heads = d_head = 2: a shared [2, 2] generator would pass a check of the first and
    # last dimension and broadcast over the groups
    with pytest.raises(ValueError, match=r"one matrix per key/value group.*got \(2, 2\)"):
        tangent_map(m, QKTransform, basis=torch.eye(4, dtype=torch.float64).reshape(4, 2, 2))
    with pytest.raises(TypeError, match="got 'HeadPermutation': a discrete family"):
        tangent_map(m, HeadPermutation)
    with pytest.raises(ValueError, match=r"plane must be an integer in \[0, 2\).*got 1.5"):
        rope_plane_breaking_basis(4, 4, 1.5)  # was an IndexError
    with pytest.raises(ValueError, match=r"unknown categories \['Noise'\]"):
        centred_on_vocabulary({"Noise": 5.0}, torch.zeros(3, dtype=torch.long))  # a KeyError
    W, P = torch.zeros(5, 3), torch.zeros(6, 3)
    with pytest.raises(ValueError, match=r"momentum of W_K must have its shape \(6, 3\)"):
        qk_charge(W, P, W, W)
    with pytest.raises(ValueError, match="expected W_Q"):
        qk_charge(W, torch.zeros(5, 2), W, torch.zeros(5, 2))
    with pytest.raises(ValueError, match=r"momentum of W_O must have its shape \(3, 5\)"):
        vo_charge(W, W.T, W, torch.zeros(3, 4))
    with pytest.raises(ValueError, match="more than d_head=2"):
        rotation_matrix(1.0, rope_frequencies(4), 2)
    with pytest.raises(ValueError, match="bias_std must be finite and >= 0"):
        make_generic_(GPT(GPTConfig(11, 6, 1, 2, 8)), bias_std=float("nan"))
    with pytest.raises(ValueError, match=r"with n_draws >= 1, got \(0, 2\)"):
        ShiftedAttention(m, torch.zeros(0, 2, dtype=torch.float64))
    with pytest.raises(TypeError, match="query_shifts must be a tensor"):
        ShiftedAttention(m, [[0.5, 0.5]])
    with pytest.raises(TypeError, match="wraps a MultiHeadAttention, got Linear"):
        ShiftedAttention(torch.nn.Linear(2, 2), torch.zeros(1, 2))
    with pytest.raises(ValueError, match="m, n, k must be non-negative integers"):
        factor_redundancy(-1, 2, 3)
    with pytest.raises(ValueError, match="n_kv_heads must be a positive integer"):
        attention_terms(d_in=4, d_out=4, n_kv_heads=-2, group_size=1, d_head=2, d_value=2,
                        bias=False)
    with pytest.raises(ValueError, match="n must be a positive integer"):
        gl_basis(-1)
    with pytest.raises(ValueError, match="n_kv_heads must be a positive integer"):
        drawn_gauge(n_kv_heads=-1, d_head=2, d_value=2, d_out=4, r_q=5, r_v=0)
    with pytest.raises(ValueError, match="ranks must lie in"):
        drawn_gauge(n_kv_heads=1, d_head=2, d_value=2, d_out=4, r_q=5, r_v=0)
    with pytest.raises(TypeError, match="expected a MultiHeadAttention, got Tensor"):
        orbit_tangents(torch.zeros(3))  # an AttributeError of the finiteness check
    rope_gpt = GPT(GPTConfig(11, 6, 1, 2, 8, rope=True))
    moved = GaugeElement(PositionCentring(torch.zeros(0))).act(rope_gpt)  # was a KeyError
    assert all(torch.equal(a, b) for a, b in zip(moved.parameters(), rope_gpt.parameters()))
    with pytest.raises(ValueError, match="max_iter must be a positive integer"):
        top_eigenvalue(lambda t: (t ** 2).sum(), torch.ones(3), max_iter=2.5)
    with pytest.raises(ValueError, match="n_samples must be an integer >= 2"):
        hutchinson_trace(lambda t: (t ** 2).sum(), torch.ones(3), 4.0)
    with pytest.raises(ValueError, match="n_directions must be a positive integer"):
        zero_change_estimate(m, torch.zeros(1, 3, 4, dtype=torch.float64), n_directions=2.5)
    with pytest.raises(ValueError, match="rtol must be finite and > 0"):
        zero_change_estimate(m, torch.zeros(1, 3, 4, dtype=torch.float64), n_directions=2,
                             rtol=float("nan"))
    moe = MoE(6, 4, 5, 2, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"input dtype torch.float64 differs .* x.to\("):
        moe(torch.zeros(3, 6, dtype=torch.float64))
    with pytest.raises(ValueError, match="indices must hold integer expert ids, got dtype torch.float32"):
        load_balancing_loss(torch.full((3, 4), 0.25), torch.zeros(3, 2))
