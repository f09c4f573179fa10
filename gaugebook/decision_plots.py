"""The decisive experiment (preset ``paper``) read from its result files: seed bands, the
decision table, and CPU stand-ins while the GPU results are pending (a reduced run trained live,
and the recorded preset ``paper-cpu``: the same runs on a toy model at the paper's horizon).

The pre-registered rule itself lives in :func:`gaugebook.results.decide`; this module only
feeds it and draws what it decides on. A *seed band* of an arm and a symmetry at step :math:`t`
is the mean :math:`\\bar L(t) = \\frac1S \\sum_s L_s(t)` over the ``S`` seeds together with
:math:`\\min_s L_s(t)` and :math:`\\max_s L_s(t)`, taken only at steps that every seed recorded
(equal steps, never interpolated). Chapter 17 uses it as::

    runs, source, seconds = paper_runs()     # results/gpu/paper, or a reduced CPU run
    fig = band_panels(runs, "val_loss")
    display(decision_table(decisions(runs)))
"""
from __future__ import annotations

import dataclasses
import itertools
import re
import tempfile
import time
from pathlib import Path

import numpy as np
from matplotlib.lines import Line2D

from gaugebook.plots import PALETTE, range_band
from gaugebook.results import (HELPS_BELOW, LAST_EVALUATIONS, Decision, Run, Table, arm_of,
                               common_steps, final_statistic, find_results, interval_text,
                               load_runs, pairs_by_seed, rounded)

__all__ = ["PAPER_RESULTS", "RECORDED_PRESETS", "reduced_paper_configs", "recorded_paper_runs",
           "recorded_paper_arms", "complete_recorded_runs", "paper_runs", "seed_band",
           "path_ratio", "ROW_LABELS",
           "band_panels", "paired_deltas", "delta_panels", "decision_table", "sweep_statistics",
           "best_rates", "sweep_panels", "SYMMETRY_COLOR", "SYMMETRY_MARKER"]

PAPER_RESULTS = "results/gpu/paper"
#: Where each preset of the decisive experiment is recorded (see ``results/README.md``).
RECORDED_PRESETS = {"paper": PAPER_RESULTS, "paper-cpu": "results/cpu/paper-cpu"}
#: Each symmetry's colour in the figures of Part II.
SYMMETRY_COLOR = {"symmetric": PALETTE[0], "bq": PALETTE[1], "bqv": PALETTE[3]}
#: Each symmetry's marker in the figures of Part II, which tells ``bq`` from ``bqv`` where
#: red-green colour blindness merges their orange and vermilion.
SYMMETRY_MARKER = {"symmetric": "o", "bq": "^", "bqv": "s"}


def reduced_paper_configs(steps: int = 60, eval_every: int = 10) -> list:
    """The runs of the preset ``paper-smoke`` (the 21 runs of ``paper``: same arms, seeds,
    symmetries and settings, on the smoke model) with ``steps`` and ``eval_every`` replaced, so
    that the rule's statistic (last 5 evaluations) exists: ``steps / eval_every >= 5``."""
    from gaugebook.experiment import select_runs

    if steps // eval_every < 5:
        raise ValueError(f"steps={steps}, eval_every={eval_every} give {steps // eval_every} "
                         "evaluations; the decision rule needs at least 5")
    return [dataclasses.replace(c, steps=steps, eval_every=eval_every)
            for c in select_runs("paper-smoke")]


def recorded_paper_arms(preset: str = "paper", *, extra_roots=()) -> tuple[list[Run], str]:
    """``(runs, status)``: the runs of the *complete arms* of ``preset`` in its recorded folder
    (:data:`RECORDED_PRESETS`; ``results/gpu/paper`` for ``paper``), the arms whose every run
    (each seed and symmetry) is recorded, none truncated (``[]`` when none is), and what is
    recorded, e.g. ``"3 of the 21 runs recorded (parts seed0-pt), 3 truncated; complete arms:
    none"``. The pre-registered rule pairs runs within an arm, so an arm is decided as soon as
    it is complete, before the other arms are in."""
    from gaugebook.experiment import presets

    if preset not in RECORDED_PRESETS:
        raise ValueError(f"no recorded folder for preset {preset!r}; recorded presets: "
                         f"{sorted(RECORDED_PRESETS)}")
    part_of, arm = {}, {}  # per run of the preset: its part, its arm
    for part, cfgs in presets()[preset].items():
        for cfg in cfgs:
            part_of[cfg.name], arm[cfg.name] = part, arm_of(cfg.optimizer, cfg.tag)
    try:
        runs = load_runs(find_results(RECORDED_PRESETS[preset], extra_roots=extra_roots))
    except FileNotFoundError:
        runs = []
    ours = [r for r in runs if r.name in part_of]
    done = {r.name for r in ours if r.complete}
    complete = set(arm.values()) - {arm[name] for name in arm if name not in done}
    truncated = len(ours) - len(done)
    recorded = (f"{len(ours)} of the {len(arm)} runs recorded (parts "
                f"{', '.join(sorted({part_of[r.name] for r in ours}))}), "
                f"{truncated or 'none'} truncated" if ours else
                f"none of the {len(arm)} runs recorded")
    status = f"{recorded}; complete arms: {', '.join(sorted(complete)) or 'none'}"
    return [r for r in ours if arm[r.name] in complete], status


def recorded_paper_runs(preset: str = "paper", *,
                        extra_roots=()) -> tuple[list[Run] | None, str]:
    """``(runs, status)``: the runs of ``preset``'s folder when it holds every run of the
    preset, none truncated, otherwise ``runs = None`` (a call of the GPU script adds a few parts
    at a time, and a truncated run does not enter the rule); ``status`` as in
    :func:`recorded_paper_arms`."""
    from gaugebook.experiment import select_runs

    runs, status = recorded_paper_arms(preset, extra_roots=extra_roots)
    return (runs if len(runs) == len(select_runs(preset)) else None), status


def complete_recorded_runs(preset: str, *, extra_roots=()) -> list[Run]:
    """Every run of ``preset``'s recorded folder (:func:`recorded_paper_runs`), for a chapter
    that reads a recording the repository holds whole, such as the toy preset ``paper-cpu``.
    Raises :class:`FileNotFoundError` that says what the folder holds when a run is missing or
    truncated."""
    runs, status = recorded_paper_runs(preset, extra_roots=extra_roots)
    if runs is None:
        raise FileNotFoundError(
            f"{RECORDED_PRESETS[preset]} does not hold preset {preset!r} whole: {status}. "
            f"Record it with python -m gaugebook.experiment --preset {preset} --batched "
            f"(results/README.md gives the exact command).")
    return runs


def paper_runs(*, extra_roots=(), out: str | Path | None = None, steps: int = 60,
               eval_every: int = 10) -> tuple[list[Run], str, float]:
    """``(runs, source, seconds)``: the recorded runs of ``results/gpu/paper`` once it holds
    the whole preset (:func:`recorded_paper_runs`; ``source = "gpu"``, ``seconds = 0``),
    otherwise the reduced CPU version (:func:`reduced_paper_configs`) trained now, one
    :func:`~gaugebook.training.train_batched` cohort per arm, into ``out`` (a new temporary
    folder by default), ``source = "cpu"`` and the training time in seconds."""
    recorded, _ = recorded_paper_runs(extra_roots=extra_roots)
    if recorded is not None:
        return recorded, "gpu", 0.0
    from gaugebook.training import cohorts, train_batched

    out = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="gaugebook-paper-"))
    start = time.perf_counter()
    for cohort in cohorts(reduced_paper_configs(steps, eval_every)):
        train_batched(cohort, out, progress=False)
    return load_runs(out), "cpu", time.perf_counter() - start


def path_ratio(run: Run) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, path_length / init_norm)``: ECD's nominal path :math:`n\\,\\delta t` (steps
    times dt; a lower bound on the arc length for the global projection only: a per-tensor kick
    can shorten a step) over the initial parameter norm
    :math:`|\\theta_0|`; ValueError for a run without a path length (optimizers other than ECD
    record ``None``)."""
    steps, _ = run.curve("val_loss")
    path = run.history.get("path_length")
    if path is None or any(p is None for p in path):
        raise ValueError(f"{run.name} records no path length (ECD only)")
    return steps, np.asarray(path, dtype=float) / float(run["init_norm"])


def _values(run: Run, key: str) -> tuple[np.ndarray, np.ndarray]:
    return path_ratio(run) if key == "path_ratio" else run.curve(key)


def seed_band(runs: list[Run], key: str = "val_loss") -> dict[str, np.ndarray]:
    """Mean, min and max over ``runs`` (the seeds of one arm and symmetry) of ``key`` at the
    steps every run recorded: ``{"step", "mean", "min", "max"}``. ``key`` is a history key or
    ``"path_ratio"`` (:func:`path_ratio`)."""
    if not runs:
        raise ValueError("a seed band needs at least one run")
    steps = common_steps(runs)
    if not steps:
        raise ValueError(f"{[r.name for r in runs]} share no recorded step")
    rows = []
    for run in runs:
        at = dict(zip(*(a.tolist() for a in _values(run, key))))
        rows.append([at[s] for s in steps])
    values = np.asarray(rows, dtype=float)
    return {"step": np.asarray(steps), "mean": values.mean(0), "min": values.min(0),
            "max": values.max(0)}


ROW_LABELS = {"val_loss": "validation loss\n(nats)",
              "path_ratio": "nominal path\n" r"$/\ |\theta_0|$",
              "J_QK": r"$|J_{QK}|$", "J_VO": r"$|J_{VO}|$", "skipped_steps": "skipped steps"}
"""How :func:`band_panels` labels its rows (any other history key: the key itself), in
matplotlib's mathtext.

:meta hide-value:
"""


def _zero_everywhere(runs: list[Run], key: str) -> bool:
    """Whether every run that records ``key`` recorded only zeros (and at least one does)."""
    recorded = []
    for run in runs:
        try:
            recorded.append(_values(run, key)[1])
        except ValueError:  # not recorded by this run
            continue
    return bool(recorded) and all(not np.any(v) for v in recorded)


def band_panels(runs: list[Run], keys="val_loss", *, arms=None, log=(),
                title: str | None = None):
    """One row of panels per history key in ``keys`` (a key or a list; ``"path_ratio"`` for
    :func:`path_ratio`), one column per arm (``Run.arm``; ``arms`` picks and orders them), one
    seed band per symmetry: the mean as a line, min to max shaded. Keys in ``log`` get a log
    axis; a panel whose runs do not record the key (a path for AdamW) says so. A key that is
    zero at every step of every run (no skipped steps) gets a line of text under the grid
    instead of a row of flat lines. Each symmetry has its colour (:data:`SYMMETRY_COLOR`) and
    its marker (:data:`SYMMETRY_MARKER`, about 8 along each line, staggered between the
    symmetries); a band's edges are drawn in the full colour, so that a pale band stays
    visible. One legend for the whole figure, below the grid (every panel uses the same
    colours and markers). Returns the figure."""
    import matplotlib.pyplot as plt

    keys = [keys] if isinstance(keys, str) else list(keys)
    arms = list(arms) if arms is not None else sorted({r.arm for r in runs})
    shown = [r for r in runs if r.arm in arms]
    zero = [k for k in keys if _zero_everywhere(shown, k)]
    if len(zero) < len(keys):  # a grid of nothing but zeros is drawn as it is
        keys = [k for k in keys if k not in zero]
    else:
        zero = []
    fig, axes = plt.subplots(len(keys), len(arms), figsize=(2.6 * len(arms), 2.5 * len(keys)),
                             squeeze=False, sharex=True)
    for row, key in zip(axes, keys):
        for ax, arm in zip(row, arms):
            for k, (symmetry, colour) in enumerate(SYMMETRY_COLOR.items()):
                chosen = [r for r in runs if r.arm == arm and r.symmetry == symmetry]
                if not chosen:
                    continue
                try:
                    band = seed_band(chosen, key)
                except ValueError:
                    ax.set_axis_off()  # an empty frame would read as a zero curve
                    ax.text(0.5, 0.5, f"not recorded\nfor {arm}", ha="center", va="center",
                            color="0.4", transform=ax.transAxes)
                    break
                ax.plot(band["step"], band["mean"], color=colour,
                        marker=SYMMETRY_MARKER[symmetry], ms=5,
                        markevery=_marks(len(band["step"]), k, len(SYMMETRY_COLOR)),
                        label=f"{symmetry} ({len(chosen)} seeds)")
                range_band(ax, band["step"], band["min"], band["max"], colour)
            if key in log:
                ax.set_yscale("log")
        row[0].set_ylabel(ROW_LABELS.get(key, key))
    for ax, arm in zip(axes[0], arms):
        ax.set_title(arm)
    for ax in axes[-1]:
        ax.set_xlabel("step")
    labels = ", ".join(ROW_LABELS.get(k, k).replace("\n", " ") for k in zero)
    _legend_below(fig, _handles(axes), title=title,
                  note=f"{labels}: 0 at every step of every run" if zero else None)
    return fig


def _marks(n: int, k: int, of: int, per_line: int = 8) -> slice:
    """Which of ``n`` points of line ``k`` (of ``of`` lines in a panel) carry a marker: about
    ``per_line``, every ``m``-th from ``k m / of`` on, so that the lines' markers alternate
    instead of stacking where the lines coincide."""
    every = max(1, round(n / per_line))
    return slice(k * every // of, None, every)


def _handles(axes) -> dict:
    """``{label: handle}`` of every labelled artist in the panels ``axes``, each label once."""
    legend = {}
    for ax in np.ravel(axes):
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    return legend


def _legend_below(fig, legend: dict, *, ncol: int | None = None, note: str | None = None,
                  title: str | None = None) -> None:
    """Lay out ``fig``: one legend for all its panels (``{label: handle}``, in ``ncol`` columns,
    by default all in one row) centred under the grid, ``note`` a line of grey text under the
    legend, ``title`` above the grid. The figure grows by the height of the legend and the note,
    so that the panels keep theirs (``tight_layout`` in the rest)."""
    below = 0.3 if note else 0.0  # inches: the note
    box = fig.legend(legend.values(), legend.keys(), loc="lower center",
                     ncol=ncol or len(legend)) if legend else None
    extra = below + (box.get_window_extent().height / fig.dpi + 0.1 if box else 0.0)
    height = fig.get_figheight() + extra
    fig.set_figheight(height)
    if box:
        box.set_bbox_to_anchor((0.5, below / height), transform=fig.transFigure)
    if note:
        fig.text(0.5, 0.1 / height, note, ha="center", color="0.3")
    if title:  # above the column titles: tight_layout leaves the top 0.35 inch to it
        fig.suptitle(title)
    fig.tight_layout(rect=(0, extra / height, 1, 1 - 0.35 / height if title else 1))


def paired_deltas(runs: list[Run], arm: str, symmetry: str,
                  key: str = "val_loss") -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """``{seed: (steps, delta)}``: broken minus symmetric of ``history[key]`` for ``arm``,
    paired by seed as the rule pairs them (:func:`~gaugebook.results.pairs_by_seed`), at the
    steps both runs of the pair recorded:
    :math:`\\Delta_s(t) = L^{\\text{broken}}_s(t) - L^{\\text{symmetric}}_s(t)`. The rule's
    statistic is the mean of the last ``LAST_EVALUATIONS`` (5) of them."""
    out = {}
    for seed, (broken, base) in pairs_by_seed(runs, arm, symmetry).items():
        steps = common_steps([broken, base])
        out[seed] = (np.asarray(steps), np.asarray([broken.at(t, key) - base.at(t, key)
                                                    for t in steps]))
    return out


def delta_panels(runs: list[Run], *, title: str | None = None):
    """One panel per (arm, broken symmetry) present in ``runs``, ECD's pairs first (the rule
    decides on them) and two to a row: the paired difference :func:`paired_deltas` of the
    validation loss against step, one line per seed, marked with the broken symmetry's marker
    (:data:`SYMMETRY_MARKER`); the rule's threshold (mean :math:`\\Delta` below
    ``HELPS_BELOW``) dashed and the window of its statistic (the last evaluations) shaded. One
    legend (the seeds' colours) below the panels. Returns the figure."""
    import matplotlib.pyplot as plt

    pairs = sorted({(r.arm, r.symmetry) for r in runs if r.symmetry != "symmetric"},
                   key=lambda pair: (not pair[0].startswith("ecd"), pair))
    if not pairs:
        raise ValueError("no broken runs: nothing to pair with the symmetric ones")
    n_cols = min(2, len(pairs))
    n_rows = -(-len(pairs) // n_cols)
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(3.8 * n_cols, 2.7 * n_rows), sharex=True,
                             sharey=True, squeeze=False)
    for ax, (arm, symmetry) in zip(axes.flat, pairs):
        deltas = paired_deltas(runs, arm, symmetry)
        for k, ((seed, (steps, delta)), colour) in enumerate(zip(deltas.items(), PALETTE)):
            ax.plot(steps, delta, color=colour, lw=1, marker=SYMMETRY_MARKER[symmetry], ms=4,
                    markevery=_marks(len(steps), k, len(deltas)), label=f"seed {seed}")
        window = steps[-LAST_EVALUATIONS:]
        ax.axvspan(window[0], window[-1], color="0.85", zorder=0)
        ax.axhline(0, color="black", lw=0.8)
        ax.axhline(HELPS_BELOW, color="black", lw=0.8, ls="--")
        ax.set_title(f"{arm}, {symmetry}")
    for ax in axes.flat[len(pairs):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("Δ validation loss (nats)")
    for ax in axes[-1]:
        ax.set_xlabel("step")
    seeds = {label: Line2D([], [], color=line.get_color(), lw=1)  # the colours, not the markers
             for label, line in _handles(axes).items()}
    _legend_below(fig, seeds, title=title)
    return fig


def decision_table(decisions: list[Decision], *, caption: str | None = None) -> Table:
    """The rule's outcome, one row per (arm, broken symmetry): the Delta of each seed, their
    mean, the 95% t-interval and whether the rule says breaking helps."""
    seeds = sorted({s for d in decisions for s in d.deltas})
    rows = [[d.arm, d.symmetry, *(rounded(d.deltas.get(s)) for s in seeds), rounded(d.mean),
             interval_text(d.interval), "helps" if d.helps else "no"] for d in decisions]
    return Table(["arm", "broken", *(f"Δ seed {s}" for s in seeds), "mean Δ",
                  "95% t-interval", "rule"], rows, caption=caption)


def sweep_statistics(runs: list[Run]) -> dict[tuple[str, float, str], float]:
    """``{(arm, lr, symmetry): statistic}`` of a learning-rate sweep at one seed: the rule's
    statistic (:func:`~gaugebook.results.final_statistic`) of each run, keyed by its arm
    without the sweep's ``lr=`` field (``adamw-lr=3e-05`` is ``adamw``, ``ecd-pt-lr=3`` is
    ``ecd-pt``, ``ecd-lr=0.5-F0=1`` is ``ecd-F0=1``), its learning rate and its symmetry.
    ValueError when two runs share a key (two seeds)."""
    out = {}
    for run in runs:
        arm = re.sub(r"-?lr=[-+.0-9eE]+?(?=-[A-Za-z_]|$)", "", run.arm)  # exponents included
        key = (arm, float(run["config"]["optimizer_hp"]["lr"]), run.symmetry)
        if key in out:
            raise ValueError(f"two runs of {key}: a sweep holds one run per setting")
        out[key] = final_statistic(run)
    return out


def best_rates(stats: dict[tuple[str, float, str], float],
               symmetry: str = "symmetric") -> dict[str, tuple[float, float]]:
    """``{arm: (lr, statistic)}``: each arm's learning rate with the lowest statistic among its
    ``symmetry`` runs in :func:`sweep_statistics` (arms without such runs are left out)."""
    best = {}
    for (arm, lr, sym), value in stats.items():
        if sym == symmetry and (arm not in best or value < best[arm][1]):
            best[arm] = (lr, value)
    return best


def sweep_panels(stats: dict[tuple[str, float, str], float], *, span: float = 0.6,
                 title: str | None = None):
    """One panel per arm of :func:`sweep_statistics` swept over more than one learning rate:
    the statistic against the learning rate (log axis), one line per symmetry (its colour and
    marker, :data:`SYMMETRY_COLOR` and :data:`SYMMETRY_MARKER`), and in grey, the best
    symmetric statistic of each other arm (each arm in its own line style in every panel), so
    that the gap between optimizers at their best reads off the panel. Each symmetry is
    drawn at 0.9, 1 or 1.1 times the rate (in :data:`SYMMETRY_COLOR`'s order), so that equal
    statistics stay visible side by side; the middle one, which its neighbours would hide,
    has a larger hollow marker drawn on top. The value axis spans ``span`` above the best
    statistic; a setting beyond it (one that trained badly or diverged) is an upward arrow on
    the upper edge, in its symmetry's colour, and the line breaks there. One legend below the
    panels. Returns the figure."""
    import matplotlib.pyplot as plt

    arms = sorted({a for a, _, _ in stats})
    swept = [a for a in arms if len({lr for b, lr, _ in stats if b == a}) > 1]
    if not swept:
        raise ValueError("no arm was trained at more than one learning rate")
    best = best_rates(stats)
    styles = dict(zip(best, itertools.cycle(("--", ":", "-."))))  # arm -> line style
    low = min(stats.values())
    top = low + span
    fig, axes = plt.subplots(1, len(swept), figsize=(3.8 * len(swept), 3.0), sharey=True,
                             squeeze=False)
    for ax, arm in zip(axes[0], swept):
        for (symmetry, colour), nudge in zip(SYMMETRY_COLOR.items(), (0.9, 1.0, 1.1)):
            points = sorted((lr, v) for (a, lr, s), v in stats.items()
                            if a == arm and s == symmetry)
            if not points:
                continue
            rates, values = np.array(points).T
            beyond = values > top
            middle = dict(ms=11, mfc="none", mew=1.8, zorder=5) if nudge == 1.0 else {}
            ax.plot(rates * nudge, np.where(beyond, np.nan, values), "-",
                    marker=SYMMETRY_MARKER[symmetry], color=colour, label=symmetry, **middle)
            if beyond.any():
                ax.plot(rates[beyond] * nudge, np.full(beyond.sum(), top), ls="none",
                        marker=r"$\uparrow$", color=colour, ms=11, clip_on=False)
        for other, (_, value) in best.items():
            if other != arm:
                ax.axhline(value, color="0.35", lw=1, ls=styles[other],
                           label=f"best {other}, symmetric")
        ax.set_xscale("log")
        ax.set_ylim(low - 0.05 * span, top)
        ax.set_xlabel("learning rate")
        ax.set_title(arm)
    axes[0, 0].set_ylabel(f"mean of the last {LAST_EVALUATIONS}\nvalidation losses (nats)")
    legend = _handles(axes)  # one column the symmetries in their order, one the other arms' best
    order = [s for s in SYMMETRY_COLOR if s in legend] + sorted(set(legend) - set(SYMMETRY_COLOR))
    _legend_below(fig, {label: legend[label] for label in order}, ncol=2, title=title)
    return fig
