"""Loading result folders, comparisons at equal steps, and the HTML tables."""
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from gaugebook.experiment import RunConfig, train
from gaugebook.results import (TEX_MACROS, Run, Table, breaking_effects, common_steps,
                               effects_table, find_results, gain_rule,
                               read_benchmark, load_runs,
                               provenance_summary, read_run, seed_summary, select, values_at)
from gaugebook.stats import Correlation


def record(optimizer, symmetry, steps, *, activation="prelu", seed=0, offset=0.0):
    """A result record shaped like ``train``'s, with val_loss = 5 - step/1000 + offset."""
    val = [5 - s / 1000 + offset for s in steps]
    return {
        "name": f"{optimizer}-{symmetry}-{activation}-s{seed}",
        "config": {"optimizer": optimizer, "symmetry": symmetry, "activation": activation,
                   "seed": seed},
        "steps_done": steps[-1] if steps else 0, "truncated": True,
        "history": {"step": list(steps), "train_loss": val, "val_loss": val,
                    "J_QK": [0.1] * len(steps), "J_VO": [0.2] * len(steps),
                    "wall_s": [s / 10 for s in steps]},
        "final_val_loss": val[-1] if val else None, "probes": {"mean": {"top1": 0.5}},
        "optimizer_state_bytes": 8, "n_params": 2, "wall_s": 1.0, "tokens": 10,
        "tokens_per_s": 10.0, "provenance": {"git_commit": "abc", "device": "cpu"},
    }


def write(folder, *records):
    folder.mkdir(parents=True, exist_ok=True)
    for r in records:
        (folder / f"{r['name']}.json").write_text(json.dumps(r))
    return folder


@pytest.fixture
def grid(tmp_path):
    return write(tmp_path / "grid",
                 record("ecd", "symmetric", [100, 200, 300]),
                 record("ecd", "bqv", [100, 200], offset=-0.3),
                 record("adamw", "symmetric", [100, 200, 300, 400]),
                 record("adamw", "bq", [100, 200, 300, 400], offset=0.05),
                 record("sgdm", "bqv", [100]))  # no symmetric partner


def test_load_sorts_and_reads_fields(grid):
    runs = load_runs(grid)
    assert [r.name for r in runs] == sorted(r.name for r in runs)
    ecd = select(runs, optimizer="ecd", symmetry="bqv")[0]
    assert (ecd.optimizer, ecd.symmetry, ecd.activation, ecd.seed) == ("ecd", "bqv", "prelu", 0)
    assert ecd.at(200) == pytest.approx(5 - 0.2 - 0.3)
    assert ecd["tokens_per_s"] == 10.0 and ecd.last_step == 200
    steps, values = ecd.curve("J_QK")
    assert list(steps) == [100, 200] and list(values) == [0.1, 0.1]
    with pytest.raises(ValueError, match="recorded steps"):
        ecd.at(300)
    with pytest.raises(ValueError, match=r"unknown history key 'loss'; valid keys: .*'J_VO'"):
        ecd.at(100, "loss")
    ecd.history["path_length"] = [None, None]  # recorded for ECD's runs only
    assert math.isnan(ecd.at(100, "path_length")) and np.isnan(ecd.curve("path_length")[1]).all()
    with pytest.raises(ValueError, match="'path_length'"):  # this run's keys, extras included
        ecd.at(100, "distance")


def test_select_accepts_several_values(grid):
    runs = load_runs(grid)
    assert len(select(runs, optimizer=("ecd", "adamw"))) == 4
    assert len(select(runs, optimizer="ecd", symmetry={"bqv"})) == 1
    with pytest.raises(ValueError, match="unknown selection key"):
        select(runs, lr=1)


def test_equal_steps(grid):
    runs = load_runs(grid)
    ecd_adamw = select(runs, optimizer=("ecd", "adamw"))
    assert common_steps(ecd_adamw) == [100, 200]
    values = values_at(ecd_adamw)  # the largest shared step: 200
    assert values["ecd-bqv-prelu-s0"] == pytest.approx(4.5)
    assert values["adamw-symmetric-prelu-s0"] == pytest.approx(4.8)
    assert values_at(ecd_adamw, step=100)["ecd-bqv-prelu-s0"] == pytest.approx(4.6)
    with pytest.raises(ValueError, match="share no recorded step"):
        values_at(select(runs, optimizer="sgdm") + [Run.from_dict(record("x", "bq", [50]))])


def test_breaking_effects_pair_runs_at_their_largest_shared_step(grid):
    effects = breaking_effects(load_runs(grid))
    by_optimizer = {e["arm"]: e for e in effects}
    assert set(by_optimizer) == {"ecd", "adamw"}  # sgdm has no symmetric partner
    assert by_optimizer["ecd"]["step"] == 200 and by_optimizer["adamw"]["step"] == 400
    assert by_optimizer["ecd"]["delta"] == pytest.approx(-0.3)
    assert by_optimizer["adamw"]["delta"] == pytest.approx(0.05)
    fixed = breaking_effects(load_runs(grid), step=100)
    assert all(e["step"] == 100 for e in fixed)


def test_breaking_effects_refuse_two_baselines_of_one_run(grid):
    """Two symmetric runs of one arm, activation and seed (say, from two folders): which one is
    the baseline is ambiguous, so it is an error, not the last one read."""
    runs = load_runs(grid)
    twice = runs + [r for r in runs if r.arm == "ecd" and r.symmetry == "symmetric"]
    with pytest.raises(ValueError, match="exactly one partner"):
        breaking_effects(twice)


def test_seed_summary_has_no_spread_for_one_seed(tmp_path):
    folder = write(tmp_path / "seeds",
                   record("ecd", "symmetric", [100], seed=0), record("ecd", "bqv", [100], seed=0,
                                                                    offset=-0.2),
                   record("ecd", "symmetric", [100], seed=1), record("ecd", "bqv", [100], seed=1,
                                                                    offset=-0.4))
    effects = breaking_effects(load_runs(folder))
    assert sorted(e["delta"] for e in effects) == pytest.approx([-0.4, -0.2])
    (both,) = seed_summary(effects)
    assert both["n_seeds"] == 2 and both["mean"] == pytest.approx(-0.3)
    assert both["std"] == pytest.approx(math.sqrt(2 * 0.1**2))  # sample std, ddof = 1
    (single,) = seed_summary(effects[:1])
    assert single["std"] is None and single["n_seeds"] == 1


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_runs(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no result files"):
        load_runs(tmp_path / "empty")
    bad = write(tmp_path / "bad", record("ecd", "bqv", [1, 2]))
    (bad / "ecd-bqv-prelu-s0.error.json").write_text("{}")
    with pytest.raises(ValueError, match="failed runs"):
        load_runs(bad)
    broken = record("ecd", "bqv", [1, 2])
    broken["history"]["val_loss"] = [1.0]
    with pytest.raises(ValueError, match="differ in length"):
        Run.from_dict(broken)
    del broken["probes"]
    with pytest.raises(ValueError, match="lacks the keys"):
        Run.from_dict(broken)
    unordered = record("ecd", "bqv", [2, 1])
    with pytest.raises(ValueError, match="not increasing"):
        Run.from_dict(unordered)
    # each was a TypeError, KeyError or UnicodeDecodeError without the file's name
    no_optimizer = record("ecd", "bqv", [1, 2])
    del no_optimizer["config"]["optimizer"]
    for name, content in (("null", b"null"), ("latin", b"\xff\xfe{"),
                          ("no-optimizer", json.dumps(no_optimizer).encode())):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "run.json").write_bytes(content)
        with pytest.raises(ValueError, match=f"{folder / 'run.json'}"):
            load_runs(folder)


def test_read_run_and_complete(tmp_path):
    """A run is complete when it trained every step its config asked for."""
    data = record("ecd", "bqv", [100, 200])  # truncated
    path = write(tmp_path, data) / f"{data['name']}.json"
    run = read_run(path)
    assert run.path == path and run.name == data["name"] and not run.complete
    data["truncated"] = False
    assert read_run(write(tmp_path, data) / path.name).complete
    path.write_text("[1,")
    with pytest.raises(ValueError, match=f"{path} is not valid JSON"):
        read_run(path)


def test_table_html_escapes_and_formats():
    table = Table(["a<b", "x"], [[1.23456, None], [Table.Raw("d<sub>k</sub>"), "<i>"]],
                  caption="c&d")
    text = table.to_html()
    assert "a&lt;b" in text and "1.235" in text and "&ndash;" in text
    assert "d<sub>k</sub>" in text and "&lt;i&gt;" in text and "c&amp;d" in text
    assert table._repr_html_() == text
    with pytest.raises(ValueError, match="columns"):
        Table(["a"], [[1, 2]])


def test_table_prints_as_fixed_width_text():
    table = Table(["a<b", "x", "n"], [[1.23456, None, 3], [Table.Raw("d<sub>k</sub>"), "<i>",
                                                            math.nan]], caption="c&d")
    assert str(table) == repr(table) == "\n".join([
        "c&d",
        "a<b    x    n",
        "-----  ---  ---",
        "1.235  \u2013    3",
        "dk     <i>  n/a"])
    assert str(Table(["$W_Q$"], [])) == "$W_Q$\n-----"  # TeX as written, no rows


def test_table_sets_tex_between_dollars_as_mathml():
    """``$...$`` in a cell, a raw cell or the caption becomes MathML; text around it is escaped
    (raw cells excepted); an unknown command is refused instead of printed as ``\\name``."""
    table = Table(["$n_{kv}(d_k^2 + d_v^2)$ & co"], [[Table.Raw("<b>$W_Q$</b>")]],
                  caption="at $t < 2$")
    text = table.to_html()
    assert text.count("<math") == 3 and "$" not in text
    assert "<msub><mi>n</mi><mrow><mi>k</mi><mi>v</mi></mrow></msub>" in text
    assert "&amp; co" in text and "<b><math" in text  # the raw cell's HTML is kept
    assert "<mo>&lt;</mo>" in text or "<mo>&#x0003C;</mo>" in text
    assert Table(["a $ b"], [["5 $"]]).to_html().count("$") == 2  # a lone $ is text
    with pytest.raises(ValueError, match=r"unknown TeX command \\Gl"):
        Table([r"$\Gl(d_k)$"], [[1]]).to_html()
    macros = Table([r"$\GL(d) \times \O(d) \ne \Omega$"], []).to_html()
    assert ">G</mi><mi mathvariant=\"normal\">L<" in macros and "<mtext>O</mtext>" in macros
    assert "&#x003A9;" in macros  # \Omega is not \O followed by mega
    bars = Table([r"$\log|G| + \|x\|$"], []).to_html()  # | as a letter-like \vert
    assert bars.count("<mi>&#x0007C;</mi>") == 2 and "&#x02016;" in bars


def test_tex_macros_are_the_pages_macros():
    """Tables and prose share one set of macros: the book's MathJax configuration."""
    config = yaml.safe_load((Path(__file__).parents[1] / "_config.yml").read_text())
    mathjax = config["sphinx"]["config"]["mathjax3_config"]["tex"]["macros"]
    assert TEX_MACROS == mathjax


def test_effects_table_and_provenance(grid):
    runs = load_runs(grid)
    table = effects_table(breaking_effects(runs))
    assert len(table.rows) == 2 and "-0.300" in table.to_html()
    assert table.header[3].startswith("Δ") and "seed" not in table.header  # one seed
    effects = breaking_effects(runs)
    several = effects_table(effects + [dict(effects[0], seed=1)])
    assert several.header[-1] == "seed" and [r[-1] for r in several.rows] == [
        e["seed"] for e in effects] + [1]
    assert provenance_summary(runs) == {"git_commit": ["abc"], "device": ["cpu"]}


def test_reads_what_train_writes(tmp_path):
    cfg = RunConfig(optimizer="adamw", symmetry="bqv", steps=4, eval_every=2, eval_batches=1,
                    probe_instances=2, batch_size=2, block_size=32, n_embd=16,
                    optimizer_hp={"lr": 1e-3})
    train(cfg, tmp_path)
    (run,) = load_runs(tmp_path)
    assert run.name == cfg.name and run.steps == [2, 4]
    assert values_at([run])[run.name] == run["final_val_loss"]


def test_find_results_searches_parents_and_extra_roots(tmp_path, monkeypatch):
    target = tmp_path / "repo" / "results" / "gpu" / "seed9"
    target.mkdir(parents=True)
    inner = tmp_path / "repo" / "book"
    inner.mkdir()
    monkeypatch.chdir(inner)
    assert find_results("results/gpu/seed9") == target.resolve()
    monkeypatch.chdir(tmp_path)
    assert find_results("results/gpu/seed9", extra_roots=[tmp_path / "repo"]) == target
    with pytest.raises(FileNotFoundError, match="nor installed with the package"):
        find_results("results/gpu/seed8")


def test_read_benchmark_reads_the_recorded_json_of_benchmarks_results(tmp_path, monkeypatch):
    folder = tmp_path / "benchmarks" / "results"
    folder.mkdir(parents=True)
    (folder / "x.json").write_text('{"provenance": {"device": "cpu"}}')
    monkeypatch.chdir(tmp_path)
    assert read_benchmark("x.json") == {"provenance": {"device": "cpu"}}
    with pytest.raises(FileNotFoundError, match="no file benchmarks/results/y.json"):
        read_benchmark("y.json")
    inner = tmp_path / "other" / "benchmarks" / "results"  # a folder without the file:
    inner.mkdir(parents=True)  # the search goes on to the parents
    monkeypatch.chdir(tmp_path / "other")
    assert read_benchmark("x.json") == {"provenance": {"device": "cpu"}}


def test_find_results_falls_back_to_the_copy_installed_with_the_package(tmp_path, monkeypatch):
    """Outside a clone (Colab, pip install) the wheel's gaugebook/_recorded copy is found."""
    import gaugebook.results as results

    package = tmp_path / "site" / "gaugebook"
    (package / "_recorded" / "results" / "gpu" / "seed0").mkdir(parents=True)
    monkeypatch.setattr(results, "__file__", str(package / "results.py"))
    monkeypatch.chdir(tmp_path)
    assert find_results("results/gpu/seed0") == package / "_recorded" / "results" / "gpu" / "seed0"


# ---------- the pre-registered decision rule (preset `paper`) ----------

def test_activation_contrast_takes_both_effects_at_a_step_all_four_runs_share(tmp_path):
    from gaugebook.results import activation_contrast

    runs = load_runs(write(
        tmp_path / "four",
        record("adamw", "symmetric", [100, 200, 300]),
        record("adamw", "bqv", [100, 200, 300], offset=-0.2),
        record("adamw", "symmetric", [100, 200, 300, 400], activation="gelu"),
        record("adamw", "bqv", [100, 200, 300, 400], activation="gelu", offset=-0.05)))
    c = activation_contrast(runs, "adamw")
    assert c["step"] == 300 and c["gelu"]["step"] == 300  # not the GELU pair's own 400
    assert c["contrast"] == pytest.approx(-0.2 - (-0.05))
    assert c["prelu"]["delta"] == pytest.approx(-0.2)
    with pytest.raises(ValueError, match=r"one run of each activation.*select one seed"):
        activation_contrast(runs[:3], "adamw")


def paper_record(arm, symmetry, seed, final):
    """A run of ``arm`` whose last 5 evaluations average ``final`` (earlier ones higher)."""
    optimizer, _, tag = arm.partition("-")
    r = record(optimizer, symmetry, [500 * k for k in range(1, 9)], seed=seed)
    r["history"]["val_loss"] = [final + 1.0, final + 0.5, final + 0.2,
                                final - 0.02, final + 0.02, final - 0.01, final + 0.01, final]
    r["config"]["tag"] = tag
    r["name"] = f"{optimizer}-{symmetry}-prelu-s{seed}" + (f"-{tag}" if tag else "")
    r["truncated"] = False
    return r


def test_deltas_print_signed_and_a_missing_interval_as_na(tmp_path):
    from gaugebook.results import decide, interval_text, signed

    assert [signed(x) for x in (-0.0004, 0.0004, -0.2, math.nan)] == [
        "+0.000", "+0.000", "-0.200", "n/a"]
    assert interval_text((-0.31, 0.0002)) == "[-0.310, +0.000]"
    assert interval_text((math.nan, 1.0)) == "n/a"
    two = load_runs(write(tmp_path / "two", *[paper_record("ecd-pt", s, seed, 3.5 - d * (s == "bq"))
                                              for seed, d in ((0, 0.2), (1, 0.0004))
                                              for s in ("symmetric", "bq")]))
    sentence = decide(two, "ecd-pt", "bq").sentence()
    assert sentence.endswith("per seed -0.200, +0.000)") and "-0.000" not in sentence


def test_the_decision_rule_on_synthetic_results(tmp_path):
    from gaugebook.results import decide, decisions, final_statistic, statistic_gap

    records = []
    for seed, (sym, bq, gl_sym, gl_bqv) in enumerate([(3.5, 3.3, 3.4, 3.38), (3.6, 3.35, 3.4, 3.5),
                                                       (3.55, 3.4, 3.4, 3.35)]):
        records += [paper_record("ecd-pt", "symmetric", seed, sym),
                    paper_record("ecd-pt", "bq", seed, bq),
                    paper_record("ecd-global", "symmetric", seed, gl_sym),
                    paper_record("ecd-global", "bqv", seed, gl_bqv)]
    runs = load_runs(write(tmp_path / "paper", *records))
    assert final_statistic(runs[0]) == pytest.approx(
        sum(runs[0].history["val_loss"][-5:]) / 5)
    pt = decide(runs, "ecd-pt", "bq")
    assert pt.deltas == pytest.approx({0: -0.2, 1: -0.25, 2: -0.15})
    assert pt.mean == pytest.approx(-0.2) and pt.helps
    half = 4.302653 * 0.05 / math.sqrt(3)  # t_{0.975, 2} * sd / sqrt(n)
    assert pt.interval == pytest.approx((-0.2 - half, -0.2 + half), rel=1e-5)
    gl = decide(runs, "ecd-global", "bqv")  # one seed positive: not "helps" whatever the mean
    assert gl.deltas[1] > 0 and not gl.helps
    assert [(d.arm, d.symmetry) for d in decisions(runs)] == [("ecd-global", "bqv"),
                                                              ("ecd-pt", "bq")]
    assert pt.sentence().startswith("breaking (bq) helps ecd-pt (mean Δ -0.200")
    small = load_runs(write(tmp_path / "small",
                            *[paper_record("adamw", s, seed, 3.4 - 0.05 * (s == "bqv"))
                              for seed in range(3) for s in ("symmetric", "bqv")]))
    assert not decide(small, "adamw", "bqv").helps  # all negative, but mean -0.05 > -0.1
    with pytest.raises(ValueError, match="do not pair"):
        decide([r for r in runs if r.name != "ecd-bqv-prelu-s2-global"], "ecd-global", "bqv")
    cut = paper_record("ecd-pt", "bq", 0, 3.0) | {"truncated": True}
    with pytest.raises(ValueError, match="complete runs only.*ecd-bq-prelu-s0-pt"):
        decide(load_runs(write(tmp_path / "cut", *[r for r in records if r["name"] != cut["name"]],
                               cut)), "ecd-pt", "bq")
    with pytest.raises(ValueError, match=r"last 5: train with steps >= 5 x eval_every"):
        final_statistic(load_runs(write(tmp_path / "short", record("ecd", "bq", [1, 2])))[0])
    with pytest.raises(ValueError, match="unknown history key 'loss'"):
        final_statistic(runs[0], key="loss")
    for last in (0, -2):  # values[-0:] averaged every evaluation, values[2:] the wrong ones
        with pytest.raises(ValueError, match="last must be a positive integer"):
            final_statistic(runs[0], last)
        with pytest.raises(ValueError, match="last must be a positive integer"):
            statistic_gap(runs[0], runs[1], last)
    runs[0].history["path_length"] = [None] * 8  # recorded for some runs only
    assert math.isnan(final_statistic(runs[0], key="path_length"))
    assert [r.arm for r in select(runs, arm="ecd-pt", symmetry="bq")] == ["ecd-pt"] * 3
    assert len(select(runs, optimizer="ecd", tag="global")) == 6


def test_gaps_between_two_arms_are_paired_by_seed_with_a_t_interval(tmp_path):
    """One optimizer against another (ECD against a tuned AdamW): per-seed differences of the
    rule's statistic and the 95% t-interval of their mean."""
    from gaugebook.results import paired_gaps
    from gaugebook.stats import t_interval

    finals = {"ecd-pt": (3.02, 2.97, 3.06), "adamw": (2.95, 2.89, 2.98)}
    runs = load_runs(write(tmp_path / "two", *[paper_record(arm, "symmetric", seed, value)
                                               for arm, values in finals.items()
                                               for seed, value in enumerate(values)]))
    ecd, adamw = ([r for r in runs if r.arm == arm] for arm in finals)
    gaps = paired_gaps(ecd, adamw)
    assert gaps == pytest.approx({0: 0.07, 1: 0.08, 2: 0.08})
    mean, (low, high) = t_interval(list(gaps.values()))
    half = 4.302653 * np.std([0.07, 0.08, 0.08], ddof=1) / math.sqrt(3)
    assert mean == pytest.approx(0.23 / 3) and (low, high) == pytest.approx(
        (mean - half, mean + half), rel=1e-5)
    assert t_interval([1.0, 3.0], level=0.5)[1] == pytest.approx((1.0, 3.0))  # t_{0.75,1} = 1
    with pytest.raises(ValueError, match="at least two"):
        t_interval([0.1])
    with pytest.raises(ValueError, match="do not pair"):
        paired_gaps(ecd[:2], adamw)
    with pytest.raises(ValueError, match="two runs of one seed"):
        paired_gaps(ecd + ecd[:1], adamw)
    # a run stopped early by its time budget ends at other steps: no difference of lengths
    for values in ecd[1].history.values():
        del values[-1]
    with pytest.raises(ValueError, match="end at different steps"):
        paired_gaps(ecd, adamw)


def test_partner_pairs_give_each_broken_run_its_symmetric_partner(tmp_path):
    """Gains are taken against the symmetric run of the same arm and seed."""
    from gaugebook.results import partner_pairs

    records = [paper_record(arm, sym, seed, 3.0 + seed)
               for arm in ("ecd-pt", "adamw") for seed in range(2)
               for sym in ("symmetric", "bqv")]
    runs = load_runs(write(tmp_path / "paired", *records))
    pairs = partner_pairs(runs)
    assert len(pairs) == 4 and all(b.symmetry == "bqv" for b, _ in pairs)
    assert all((b.arm, b.seed) == (p.arm, p.seed) and p.symmetry == "symmetric"
               for b, p in pairs)
    assert [b.name for b, _ in pairs] == [r.name for r in runs if r.symmetry == "bqv"]
    lone = [r for r in runs if r.name != "adamw-symmetric-prelu-s1"]
    with pytest.raises(ValueError, match="adamw-bqv-prelu-s1: 0 symmetric runs"):
        partner_pairs(lone)
    with pytest.raises(ValueError, match="2 symmetric runs"):
        partner_pairs(runs + [r for r in runs if r.name == "adamw-symmetric-prelu-s1"])


def test_runs_pair_only_with_the_same_activation(tmp_path):
    """A GELU broken run is never compared with a PReLU partner, and the decision rule refuses
    an arm whose runs mix activations instead of keeping one run per seed."""
    from gaugebook.results import pairs_by_seed, partner_pairs

    records = []
    for activation, final in (("prelu", 3.0), ("gelu", 3.5)):
        for sym in ("symmetric", "bqv"):
            r = paper_record("ecd-pt", sym, 0, final)
            r["config"]["activation"] = activation
            r["name"] = r["name"].replace("prelu", activation)
            records.append(r)
    runs = load_runs(write(tmp_path / "mixed", *records))
    assert all(b.activation == p.activation for b, p in partner_pairs(runs))
    with pytest.raises(ValueError, match="several activations.*select one"):
        pairs_by_seed(runs, "ecd-pt", "bqv")
    prelu = [r for r in runs if r.activation == "prelu"]
    assert pairs_by_seed(prelu, "ecd-pt", "bqv")[0][1].name == "ecd-symmetric-prelu-s0-pt"


def test_pairs_by_seed_refuses_two_runs_of_one_seed(tmp_path):
    """Two runs of one arm, symmetry and seed (say, from two folders) are not silently reduced to
    the last one: the rule's pairs must be one to one."""
    from gaugebook.results import pairs_by_seed

    runs = load_runs(write(tmp_path / "one", paper_record("ecd-pt", "symmetric", 0, 3.0),
                           paper_record("ecd-pt", "bqv", 0, 2.8)))
    assert list(pairs_by_seed(runs, "ecd-pt", "bqv")) == [0]
    for twice in ("bqv", "symmetric"):
        extra = [r for r in runs if r.symmetry == twice]
        with pytest.raises(ValueError, match="one to one|exactly one partner"):
            pairs_by_seed(runs + extra, "ecd-pt", "bqv")


def test_puzzle_gain_tests_correlate_gains_with_alignment_within_arms(tmp_path):
    """Gains follow the in-context score within each arm, while the arms' levels point the other
    way: within arms rho = +1, across all runs the arms' offsets spoil the order."""
    from gaugebook.results import puzzle_gain_differences, puzzle_gain_tests

    records = []
    for k, arm in enumerate(("ecd-pt", "adamw")):
        for seed in range(4):
            sym = paper_record(arm, "symmetric", seed, 3.0)
            sym["probes"]["mean"]["top1"] = 0.5
            broken = paper_record(arm, "bqv", seed, 3.0 - 0.01 * seed)  # loss: drops with seed
            gain = 0.1 * seed - 0.5 * k  # adamw's gains lower by 0.5
            broken["probes"] = {"mean": {"top1": 0.5 + gain}}
            broken["alignment"] = {"in_context": seed + 10 * k,  # adamw's scores higher
                                   "static": float((seed * 7) % 4)}  # unrelated order
            records += [sym, broken]
    runs = load_runs(write(tmp_path / "gains", *records))
    within, pooled = puzzle_gain_tests(runs), puzzle_gain_tests(runs, within_arms=False)
    assert list(within) == ["in-context alignment", "static-key alignment",
                            "change of validation loss"]
    assert within["in-context alignment"].rho == pytest.approx(1.0)
    assert pooled["in-context alignment"].rho < 0  # higher scores, lower gains across arms
    assert within["change of validation loss"].rho == pytest.approx(-1.0)  # larger drop, gain
    assert abs(within["static-key alignment"].rho) < 1
    # the comparative statistic: in-context alignment ranks the gains as well as the loss's
    # drop does (D = 1 - 1), the static score worse (rho 0.2 within each arm: D = -0.8)
    differences = puzzle_gain_differences(runs, resamples=99)
    assert differences["in-context alignment"][0] == pytest.approx(0.0, abs=1e-12)
    assert differences["static-key alignment"][0] == pytest.approx(-0.8)
    # the registered rule: in-context alignment predicts, but so does the loss: no support
    rule = gain_rule(within)
    assert rule.aligned == ("in-context alignment",) and rule.loss_predicts
    assert not rule.supported


def test_gain_rule_needs_a_positive_alignment_and_no_negative_loss_correlation():
    def tests(context, static, loss):  # (rho, p) of each predictor -> puzzle_gain_tests' dict
        return {name: Correlation(rho, p, (rho - 0.1, rho + 0.1), 12)
                for name, (rho, p) in (("in-context alignment", context),
                                       ("static-key alignment", static),
                                       ("change of validation loss", loss))}

    assert gain_rule(tests((0.6, 0.01), (0.1, 0.7), (-0.2, 0.4))).supported
    assert gain_rule(tests((0.1, 0.7), (0.6, 0.04), (0.5, 0.01))).aligned == (
        "static-key alignment",)  # a positive change of the loss is no prediction
    assert not gain_rule(tests((-0.6, 0.01), (0.1, 0.7), (0.0, 0.9))).aligned  # wrong sign
    assert not gain_rule(tests((0.6, 0.06), (0.1, 0.7), (0.0, 0.9))).supported  # p >= 0.05
    assert gain_rule(tests((0.6, 0.06), (0.1, 0.7), (0.0, 0.9)), alpha=0.1).supported


def test_probe_standard_error_adds_the_tasks_binomial_errors():
    """Two tasks at 0.5 and 1.0 on 100 instances: sqrt((0.25 + 0) / 100) / 2 = 0.025, below the
    pooled binomial sqrt(0.75 * 0.25 / 200) = 0.0306 of the same mean score."""
    from gaugebook.results import probe_standard_error

    run = {"config": {"probe_instances": 100},  # a result record, or its Run
           "probes": {"a": {"top1": 0.5}, "b": {"top1": 1.0}, "mean": {"top1": 0.75}}}
    assert probe_standard_error(run) == pytest.approx(0.025)
    assert probe_standard_error(run) < math.sqrt(0.75 * 0.25 / 200)


def test_probe_mcnemar_counts_discordant_instances_and_matches_the_mean_gain():
    """Task a: the model gains instances 1, 2 and loses 3; task b: it gains 0. Gain (3 - 1) / 8
    equals the difference of the mean top-1 scores; the exact McNemar p-value is the two-sided
    binomial one of 1 loss in 4 discordant instances, 0.625."""
    from gaugebook.results import probe_mcnemar

    def probes(correct):  # per-task strings of hits -> an evaluate_probes-shaped dict
        tasks = {t: {"top1": c.count("1") / len(c), "correct": c} for t, c in correct.items()}
        return {**tasks, "mean": {"top1": np.mean([v["top1"] for v in tasks.values()])}}

    broken, partner = probes({"a": "0110", "b": "1000"}), probes({"a": "0001", "b": "0000"})
    test = probe_mcnemar(broken, partner)
    assert (test.gained, test.lost, test.n) == (3, 1, 8)
    assert test.gain == pytest.approx(broken["mean"]["top1"] - partner["mean"]["top1"])
    assert test.p == pytest.approx(0.625)
    assert probe_mcnemar(broken, broken).p == 1.0  # no discordant instance
    assert "McNemar p = 0.62" in test.sentence()
    strong = probe_mcnemar(probes({"a": "1" * 20}), probes({"a": "0" * 20}))
    assert strong.p == pytest.approx(2 * 0.5 ** 20)
    with pytest.raises(ValueError, match="same n_per_task"):
        probe_mcnemar(probes({"a": "01", "b": "10"}), partner)
    with pytest.raises(ValueError, match="different tasks"):
        probe_mcnemar(probes({"a": "0110"}), partner)
    old = {"a": {"top1": 0.5}, "b": {"top1": 0.25}, "mean": {"top1": 0.375}}
    with pytest.raises(ValueError, match="probe_standard_error"):
        probe_mcnemar(old, partner)


def test_puzzle_changes_test_pairwise_where_answers_were_recorded(tmp_path):
    """Two broken runs, each 12 instances better than its partner out of 200: with each
    instance's answer the paired test finds it (12 of 12 discordant instances go the broken
    run's way, p = 2^-11); without, the unpaired error of 0.5 accuracies on 200 instances
    (threshold 0.1) does not."""
    from gaugebook.results import puzzle_changes

    def probes(hits, with_answers):
        tasks = {}
        for task in ("a", "b"):
            correct = "1" * hits + "0" * (100 - hits)
            tasks[task] = {"top1": hits / 100, **({"correct": correct} if with_answers else {})}
        return {**tasks, "mean": {"top1": hits / 100}}

    records = []
    for seed, answers in ((0, True), (1, False)):
        for symmetry, hits in (("symmetric", 50), ("bqv", 56)):
            r = paper_record("ecd-pt", symmetry, seed, 3.0)
            r["config"]["probe_instances"] = 100
            r["probes"] = probes(hits, answers)
            records.append(r)
    changes = {c.broken.seed: c for c in puzzle_changes(load_runs(write(tmp_path, *records)))}
    paired, unpaired = changes[0], changes[1]
    assert paired.gain == unpaired.gain == pytest.approx(0.06)
    assert (paired.paired.gained, paired.paired.lost) == (12, 0) and paired.detectable
    assert paired.paired.p == pytest.approx(2 * 0.5 ** 12)
    assert unpaired.paired is None and unpaired.threshold == pytest.approx(0.1, rel=0.01)
    assert not unpaired.detectable
