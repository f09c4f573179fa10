"""Seed bands, path ratios and the decision table of the preset ``paper`` (gaugebook.decision_plots)."""
import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from gaugebook.decision_plots import (SYMMETRY_COLOR, SYMMETRY_MARKER,  # noqa: E402
                                      band_panels,
                                      decision_table, delta_panels, paired_deltas,
                                      path_ratio, paper_runs,
                                      reduced_paper_configs, seed_band, best_rates,
                                      sweep_panels, sweep_statistics)
from gaugebook.results import Decision, Run, decide, pairs_by_seed  # noqa: E402


def run(symmetry, seed, steps, losses, *, tag="pt", path=None, init_norm=10.0,
        optimizer="ecd", lr=1.0):
    n = len(steps)
    history = {"step": list(steps), "train_loss": list(losses), "val_loss": list(losses),
               "J_QK": [0.0] * n, "J_VO": [0.0] * n, "wall_s": [1.0] * n,
               "path_length": path if path is not None else [None] * n,
               "distance": [0.0] * n, "skipped_steps": [0] * n}
    return Run.from_dict({
        "name": f"{optimizer}-{symmetry}-prelu-s{seed}{'-' + tag if tag else ''}",
        "config": {"optimizer": optimizer, "symmetry": symmetry, "activation": "prelu",
                   "seed": seed, "tag": tag, "optimizer_hp": {"lr": lr}},
        "steps_done": steps[-1], "truncated": False, "history": history,
        "final_val_loss": losses[-1], "probes": {}, "optimizer_state_bytes": 0, "n_params": 1,
        "wall_s": 1.0, "tokens": 1, "tokens_per_s": 1.0, "provenance": {},
        "init_norm": init_norm})


def test_seed_band_at_shared_steps_only():
    a = run("symmetric", 0, [10, 20, 30], [3.0, 2.0, 1.0])
    b = run("symmetric", 1, [10, 20], [5.0, 4.0])
    band = seed_band([a, b])
    assert band["step"].tolist() == [10, 20]
    assert band["mean"].tolist() == [4.0, 3.0]
    assert band["min"].tolist() == [3.0, 2.0] and band["max"].tolist() == [5.0, 4.0]
    with pytest.raises(ValueError, match="at least one run"):
        seed_band([])


def test_path_ratio_divides_by_initial_norm_and_refuses_non_ecd():
    r = run("symmetric", 0, [10, 20], [1.0, 1.0], path=[1.0, 2.0], init_norm=4.0)
    steps, ratio = path_ratio(r)
    assert steps.tolist() == [10, 20] and ratio.tolist() == [0.25, 0.5]
    assert seed_band([r], "path_ratio")["mean"].tolist() == [0.25, 0.5]
    with pytest.raises(ValueError, match="no path length"):
        path_ratio(run("symmetric", 0, [10], [1.0]))


def test_decision_table_and_panels():
    steps = [10, 20, 30, 40, 50]
    runs = [run(s, seed, steps, [2.0 + off + 0.01 * seed] * 5)
            for seed in (0, 1, 2) for s, off in (("symmetric", 0.0), ("bq", -0.2))]
    d = decide(runs, "ecd-pt", "bq")
    html = decision_table([d]).to_html()
    assert "Δ seed 2" in html and "helps" in html and "-0.200" in html
    fig = band_panels(runs, ["val_loss", "path_ratio"])
    ax = fig.axes[0]
    assert ax.get_title() == "ecd-pt" and len(ax.lines) == 2
    assert np.allclose(ax.lines[1].get_ydata(), 1.81)  # bq mean over seeds: 1.8 + 0.01
    assert not fig.axes[1].lines and "not recorded" in fig.axes[1].texts[0].get_text()
    assert [a.get_ylabel() for a in fig.axes] == ["validation loss\n(nats)",
                                                  "nominal path\n" r"$/\ |\theta_0|$"]


def test_band_panels_draw_one_legend_for_the_whole_figure():
    steps = [10, 20, 30, 40, 50]
    runs = [run(s, seed, steps, [2.0 + off + 0.01 * seed] * 5, optimizer=optimizer, tag=tag)
            for optimizer, tag in (("ecd", "pt"), ("adamw", None)) for seed in (0, 1, 2)
            for s, off in (("symmetric", 0.0), ("bq", -0.2))]
    fig = band_panels(runs, ["val_loss", "train_loss"], title="two arms")
    assert len(fig.axes) == 4 and all(ax.get_legend() is None for ax in fig.axes)
    (legend,) = fig.legends  # one, not one per panel
    assert [t.get_text() for t in legend.get_texts()] == ["symmetric (3 seeds)",
                                                          "bq (3 seeds)"]
    assert [h.get_color() for h in legend.legend_handles] == [SYMMETRY_COLOR["symmetric"],
                                                              SYMMETRY_COLOR["bq"]]
    # below the panels: the legend's top edge under every panel's bottom edge
    fig.canvas.draw()
    top = legend.get_window_extent().y1
    assert top <= min(ax.get_tightbbox().y0 for ax in fig.axes) + 1
    # a figure whose panels are all "not recorded" has no legend at all
    assert band_panels(runs[:1], "path_ratio").legends == []


def test_every_symmetry_has_its_marker_and_no_text_is_below_9_pt():
    """bq and bqv differ by marker as well as colour (red-green colour blindness merges orange
    and vermilion), in every figure of the module; a band has an edge in the full colour; and
    no legend or label is set below 9 pt."""
    steps = list(range(10, 110, 10))
    runs = [run(s, seed, steps, [2.0 + off + 0.01 * seed] * 10, lr=lr,
                tag="pt" if lr == 1.0 else f"pt-lr={lr:g}")
            for seed in (0, 1) for s, off in (("symmetric", 0.0), ("bq", -0.2), ("bqv", 0.1))
            for lr in (1.0, 3.0) if seed == 0 or lr == 1.0]
    paper = [r for r in runs if r["config"]["optimizer_hp"]["lr"] == 1.0]
    bands = band_panels(paper)
    (ax,) = bands.axes
    assert [line.get_marker() for line in ax.lines] == list(SYMMETRY_MARKER.values())
    assert [h.get_marker() for h in bands.legends[0].legend_handles] == \
        list(SYMMETRY_MARKER.values())
    assert [tuple(b.get_edgecolor()[0][:3]) for b in ax.collections] == \
        [to_rgb(c) for c in SYMMETRY_COLOR.values()]
    deltas = delta_panels(paper)
    assert [{line.get_marker() for line in ax.lines[:2]} for ax in deltas.axes] == [
        {SYMMETRY_MARKER["bq"]}, {SYMMETRY_MARKER["bqv"]}]  # the seeds' lines of each pair
    sweep = sweep_panels(sweep_statistics([r for r in runs if r.seed == 0]))
    marked = {line.get_label(): line.get_marker() for line in sweep.axes[0].lines
              if line.get_label() in SYMMETRY_MARKER}
    assert marked == SYMMETRY_MARKER
    for fig in (bands, deltas, sweep):
        sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_text()]
        assert min(sizes) >= 9


def test_band_panels_write_a_key_that_is_zero_everywhere_as_a_line_of_text():
    """No run skipped a step: a note under the grid, not a row of flat lines at 0."""
    steps = [10, 20, 30]
    runs = [run(s, seed, steps, [2.0, 1.5, 1.2]) for seed in (0, 1) for s in ("symmetric", "bq")]
    fig = band_panels(runs, ["val_loss", "J_QK", "skipped_steps"])
    assert len(fig.axes) == 1
    assert [t.get_text() for t in fig.texts] == [
        "$|J_{QK}|$, skipped steps: 0 at every step of every run"]
    fig.canvas.draw()  # the note sits under the legend
    assert fig.texts[0].get_window_extent().y1 <= fig.legends[0].get_window_extent().y0 + 1
    runs[0].history["skipped_steps"][-1] = 1  # one skipped step: the row is drawn
    assert len(band_panels(runs, ["val_loss", "skipped_steps"]).axes) == 2
    assert len(band_panels(runs, ["J_QK", "J_VO"]).axes) == 2  # all zero: drawn as they are


def test_decision_table_prints_no_negative_zero():
    steps = [10, 20, 30, 40, 50]
    offsets = {0: -0.0004, 1: 0.003, 2: -0.001}  # seed 0 rounds to zero
    runs = [run(s, seed, steps, [2.0 + (off if s == "bq" else 0.0)] * 5)
            for seed, off in offsets.items() for s in ("symmetric", "bq")]
    html = decision_table([decide(runs, "ecd-pt", "bq")]).to_html()
    assert "-0.000" not in html and ">0.000<" in html and "-0.001" in html
    nan = float("nan")  # a diverged pair: the interval reads as the table reads a NaN
    diverged = Decision("ecd-pt", "bqv", {0: nan, 1: -0.01}, nan, (nan, nan), False)
    assert "nan" not in decision_table([diverged]).to_html()


def test_sweep_statistics_strip_the_rate_of_every_sweep_tag():
    steps = [10, 20, 30, 40, 50, 60]
    runs = [run("symmetric", 0, steps, [9.0] + [2.0] * 5, optimizer=o, tag=t, lr=lr)
            for o, t, lr in (("adamw", "lr=3e-05", 3e-5), ("adamw", "lr=0.001", 1e-3),
                             ("ecd", "lr=0.5-F0=1", 0.5), ("ecd", "lr=1-F0=1", 1.0))]
    assert sorted({arm for arm, _, _ in sweep_statistics(runs)}) == ["adamw", "ecd-F0=1"]


def test_paired_deltas_pair_by_seed_at_shared_steps_and_panels_draw_them():
    runs = [run("symmetric", 0, [10, 20, 30], [3.0, 2.0, 1.0]),
            run("bq", 0, [10, 20], [2.5, 2.25]),
            run("symmetric", 1, [10, 20], [4.0, 4.0]), run("bq", 1, [10, 20], [4.5, 3.0])]
    pairs = pairs_by_seed(runs, "ecd-pt", "bq")
    assert {seed: (b.symmetry, s.symmetry, b.seed, s.seed) for seed, (b, s) in pairs.items()} \
        == {0: ("bq", "symmetric", 0, 0), 1: ("bq", "symmetric", 1, 1)}
    deltas = paired_deltas(runs, "ecd-pt", "bq")
    assert list(deltas) == [0, 1]
    assert deltas[0][0].tolist() == [10, 20] and deltas[0][1].tolist() == [-0.5, 0.25]
    assert deltas[1][1].tolist() == [0.5, -1.0]
    fig = delta_panels(runs)
    ax = fig.axes[0]
    assert ax.get_title() == "ecd-pt, bq" and ax.get_legend_handles_labels()[1] == ["seed 0",
                                                                                  "seed 1"]
    assert ax.lines[1].get_ydata().tolist() == [0.5, -1.0]
    with pytest.raises(ValueError, match="do not pair"):
        paired_deltas(runs[:3], "ecd-pt", "bq")
    with pytest.raises(ValueError, match="no broken runs"):
        delta_panels([runs[0]])


def test_reduced_configs_keep_the_preset_and_refuse_too_few_evaluations():
    cfgs = reduced_paper_configs(steps=50, eval_every=10)
    assert len(cfgs) == 21 and {c.seed for c in cfgs} == {0, 1, 2}
    assert all(c.steps == 50 and c.prelu_init == "paper" for c in cfgs)
    with pytest.raises(ValueError, match="at least 5"):
        reduced_paper_configs(steps=40, eval_every=10)


def _write_paper_folder(root, seeds, truncated=(), preset="paper", evaluations=1):
    """Result files in ``preset``'s recorded folder under ``root`` (``results/gpu/paper``),
    named as the preset's runs of ``seeds``, each with ``evaluations`` evaluations."""
    import json

    from gaugebook.decision_plots import RECORDED_PRESETS
    from gaugebook.experiment import select_runs

    folder = root / RECORDED_PRESETS[preset]
    folder.mkdir(parents=True, exist_ok=True)
    for cfg in select_runs(preset):
        if cfg.seed in seeds:
            steps = list(range(10, 10 * evaluations + 1, 10))
            data = dict(run(cfg.symmetry, cfg.seed, steps, [1.0] * evaluations,
                            optimizer=cfg.optimizer, tag=cfg.tag).data,
                        name=cfg.name, truncated=cfg.name in truncated)
            (folder / f"{cfg.name}.json").write_text(json.dumps(data))
    return folder


def test_recorded_paper_runs_need_the_whole_preset_complete(tmp_path, monkeypatch):
    from gaugebook.decision_plots import RECORDED_PRESETS, recorded_paper_runs

    monkeypatch.chdir(tmp_path)  # found before the repository's own results/gpu/paper
    with monkeypatch.context() as m:
        m.setitem(RECORDED_PRESETS, "paper", "results/gpu/nowhere")
        assert recorded_paper_runs() == (None, "none of the 21 runs recorded; complete arms: "
                                               "none")
    _write_paper_folder(tmp_path, seeds={0})
    runs, status = recorded_paper_runs()
    assert runs is None and status == ("7 of the 21 runs recorded (parts seed0-adamw, "
                                       "seed0-global, seed0-pt), none truncated; complete "
                                       "arms: none")
    _write_paper_folder(tmp_path, seeds={1, 2}, truncated={"adamw-bqv-prelu-s2"})
    runs, status = recorded_paper_runs()
    parts = ", ".join(f"seed{s}-{arm}" for s in range(3) for arm in ("adamw", "global", "pt"))
    assert runs is None and status.endswith(f"(parts {parts}), 1 truncated; complete arms: "
                                            "ecd-global, ecd-pt")
    _write_paper_folder(tmp_path, seeds={2})
    runs, status = recorded_paper_runs()
    assert len(runs) == 21 and status.endswith("none truncated; complete arms: adamw, "
                                               "ecd-global, ecd-pt")
    runs, source, seconds = paper_runs()
    assert source == "gpu" and seconds == 0.0 and len(runs) == 21


def test_an_arm_is_decided_once_all_its_seeds_are_recorded_complete(tmp_path, monkeypatch):
    from gaugebook.decision_plots import recorded_paper_arms, recorded_paper_runs
    from gaugebook.results import decisions

    monkeypatch.chdir(tmp_path)
    folder = _write_paper_folder(tmp_path, seeds={0, 1, 2}, evaluations=5)
    for name in ("ecd-symmetric-prelu-s2-global", "adamw-bqv-prelu-s0"):
        (folder / f"{name}.json").unlink()  # two arms lack a run
    runs, status = recorded_paper_arms()
    assert status.endswith("none truncated; complete arms: ecd-pt")
    assert len(runs) == 9 and {r.arm for r in runs} == {"ecd-pt"}
    assert recorded_paper_runs()[0] is None  # the whole preset is not in
    assert [(v.arm, v.symmetry) for v in decisions(runs)] == [("ecd-pt", "bq"), ("ecd-pt", "bqv")]
    # seed 2 again: the global arm's missing run comes in, one of the per-tensor arm's is cut
    _write_paper_folder(tmp_path, seeds={2}, truncated={"ecd-bq-prelu-s2-pt"}, evaluations=5)
    runs, status = recorded_paper_arms()
    assert status.endswith("1 truncated; complete arms: ecd-global")
    assert len(runs) == 6 and {r.arm for r in runs} == {"ecd-global"}


def test_recorded_cpu_preset_is_read_from_its_own_folder(tmp_path, monkeypatch):
    from gaugebook.decision_plots import complete_recorded_runs, recorded_paper_runs

    monkeypatch.chdir(tmp_path)
    _write_paper_folder(tmp_path, seeds={0, 1}, preset="paper-cpu")
    runs, status = recorded_paper_runs("paper-cpu")
    assert runs is None and status.startswith("14 of the 21 runs recorded (parts seed0, seed1)")
    with pytest.raises(FileNotFoundError, match="results/cpu/paper-cpu does not hold preset "
                                                "'paper-cpu' whole: 14 of the 21 runs"):
        complete_recorded_runs("paper-cpu")
    _write_paper_folder(tmp_path, seeds={2}, preset="paper-cpu")
    runs, _ = recorded_paper_runs("paper-cpu")
    assert len(runs) == 21
    assert [r.name for r in complete_recorded_runs("paper-cpu")] == [r.name for r in runs]
    assert recorded_paper_runs("paper")[0] is None  # the GPU folder is another one
    with pytest.raises(ValueError, match="recorded presets: \\['paper', 'paper-cpu'\\]"):
        recorded_paper_runs("paper-smoke")


def test_sweep_statistics_key_runs_by_arm_rate_and_symmetry_and_panels_draw_the_swept_arms():
    steps = [10, 20, 30, 40, 50, 60]
    runs = [run(s, 0, steps, [9.0] + [loss + 0.1 * (s == "bqv")] * 5, optimizer="adamw",
                tag=f"lr={lr:g}", lr=lr)
            for s in ("symmetric", "bqv") for lr, loss in ((1e-3, 3.0), (1e-2, 2.5))]
    runs += [run("symmetric", 0, steps, [9.0] + [2.8] * 5, tag="pt-lr=3", lr=3.0),
             run("symmetric", 0, steps, [9.0] + [2.9] * 5, tag="pt", lr=1.0)]
    stats = sweep_statistics(runs)  # the first evaluation is outside the last five
    assert stats == {("adamw", 1e-3, "symmetric"): 3.0, ("adamw", 1e-2, "symmetric"): 2.5,
                     ("adamw", 1e-3, "bqv"): pytest.approx(3.1),
                     ("adamw", 1e-2, "bqv"): pytest.approx(2.6),
                     ("ecd-pt", 3.0, "symmetric"): 2.8, ("ecd-pt", 1.0, "symmetric"): 2.9}
    assert best_rates(stats) == {"adamw": (1e-2, 2.5), "ecd-pt": (3.0, 2.8)}
    assert best_rates(stats, "bqv") == {"adamw": (1e-2, pytest.approx(2.6))}
    fig = sweep_panels(stats)
    adamw, ecd = fig.axes
    assert adamw.get_title() == "adamw" and ecd.get_title() == "ecd-pt"
    assert adamw.get_xscale() == "log"
    # symmetric drawn at 0.9 times the rate, bqv at 1.1: side by side
    assert adamw.lines[0].get_xydata().tolist() == [[pytest.approx(0.9e-3), 3.0],
                                                    [pytest.approx(0.9e-2), 2.5]]
    assert adamw.lines[1].get_xdata().tolist() == [pytest.approx(1.1e-3),
                                                   pytest.approx(1.1e-2)]
    middle = sweep_panels({**stats, ("adamw", 1e-3, "bq"): 3.0}).axes[0].lines[1]
    assert middle.get_label() == "bq" and middle.get_xdata()[0] == pytest.approx(1e-3)
    assert middle.get_markerfacecolor() == "none" and middle.get_zorder() > 2  # on top
    assert adamw.lines[-1].get_ydata()[0] == 2.8  # the other arm's best, dashed
    assert ecd.lines[-1].get_ydata()[0] == 2.5
    clipped = sweep_panels(stats, span=0.3).axes[0]  # 3.0 and 3.1 lie above 2.5 + 0.3
    symmetric, symmetric_beyond = clipped.lines[:2]
    # the line breaks at the setting beyond the axis, which is an arrow on its edge
    assert np.isnan(symmetric.get_ydata()[0]) and symmetric.get_ydata()[1] == 2.5
    assert symmetric_beyond.get_xydata().tolist() == [[pytest.approx(0.9e-3),
                                                        pytest.approx(2.8)]]
    assert clipped.get_ylim()[1] == pytest.approx(2.8)
    with pytest.raises(ValueError, match="two runs"):
        sweep_statistics(runs + [runs[0]])
    with pytest.raises(ValueError, match="more than one learning rate"):
        sweep_panels({("adamw", 1e-3, "symmetric"): 3.0})
