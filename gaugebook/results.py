"""Training results on disk: load a results folder, compare runs at equal steps, tabulate.

:func:`gaugebook.training.train` writes one JSON file per run. Runs of one grid rarely reach
the same step: a wall-clock budget (``max_wall_s``) stops each after a different number of steps,
and a final loss taken at step 1200 for one optimizer and 1500 for another compares training
lengths, not optimizers. The functions here therefore compare histories at steps that every
compared run recorded (:func:`common_steps`, :func:`values_at`, :func:`breaking_effects`).

Typical use (chapter 17)::

    runs = load_runs(find_results("results/gpu/seed0"))  # from any folder, or the wheel's copy
    ecd = select(runs, arm="ecd", activation="prelu")
    effects = breaking_effects(runs)          # broken minus symmetric, at equal steps
    display(effects_table(effects))           # an HTML table in a notebook
"""
from __future__ import annotations

import html
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gaugebook.checks import check_positive_ints
from gaugebook.stats import (Correlation, rank_correlation, rank_correlation_difference,
                             t_interval)

__all__ = ["find_results", "read_benchmark", "arm_of", "Run", "read_run", "load_runs", "select",
           "common_steps",
           "values_at",
           "breaking_effects", "activation_contrast", "seed_summary", "provenance_summary",
           "with_math", "TEX_MACROS",
           "Table", "effects_table",
           "final_statistic", "statistic_gap", "Decision", "rounded", "signed",
           "interval_text", "pairs_by_seed", "partner_pairs",
           "paired_gaps",
           "decide", "decisions", "probe_standard_error", "PairedProbes", "probe_mcnemar",
           "PuzzleChange", "puzzle_changes",
           "puzzle_gain_tests", "puzzle_gain_differences", "GainRule", "gain_rule",
           "RESULT_KEYS", "HISTORY_KEYS", "HISTORY_EXTRA"]

# The schema of a result file, declared once: gaugebook.training writes RESULT_KEYS and a history
# of HISTORY_KEYS + HISTORY_EXTRA; files written before a key existed lack it, so reading needs
# only REQUIRED and HISTORY_KEYS.
REQUIRED = ("name", "config", "steps_done", "history", "final_val_loss", "probes",
            "optimizer_state_bytes", "n_params", "wall_s", "tokens", "tokens_per_s",
            "provenance")
# probes: gaugebook.data.evaluate_probes of the trained model (per task "loss", "top1", "top5"
# and, from 2026-12-05, "correct", each instance's top-1 hit);
# alignment: gaugebook.interpret.alignment_scores of the trained model ({"in_context",
# "static", "static_by_category", "static_null"}; files before 2026-12-05 have the first two),
# or None where it does not apply; ways: how the run was trained from which step
# ([{"from_step", "compile", "cuda_graphs", "cpp_wrapper"}], one entry per change of way)
RESULT_KEYS = REQUIRED + ("truncated", "skipped_steps", "peak_memory_bytes", "init_norm",
                          "trained_with", "alignment", "ways")
HISTORY_KEYS = ("step", "train_loss", "val_loss", "J_QK", "J_VO", "wall_s")
CONFIG_KEYS = ("optimizer", "symmetry", "activation", "seed")  # what a Run reads of the config
# path length (ECD: steps x dt, the nominal path; None for other optimizers), distance
# |theta - theta_0| from the initial weights, skipped steps so far
HISTORY_EXTRA = ("path_length", "distance", "skipped_steps")
BASELINE = "symmetric"  # the symmetry that every broken run is compared with


def find_results(relative: str | Path, *, extra_roots=()) -> Path:
    """The folder ``relative`` (e.g. ``"results/gpu/seed0"``) under the current directory or one
    of its parents, under the folder that holds the ``gaugebook`` package (a clone), under one
    of ``extra_roots``, or else in the copy installed with the package: a wheel carries
    ``results/`` and ``benchmarks/results/`` as ``gaugebook/_recorded/`` (see pyproject.toml),
    so a reader without a checkout (Colab, ``pip install``) has them too."""
    return _recorded(relative, extra_roots, "folder")


def read_benchmark(name: str, *, extra_roots=()) -> dict:
    """The recorded benchmark ``benchmarks/results/<name>`` (a JSON file written by a script of
    ``benchmarks/``), searched for as :func:`find_results` searches for folders."""
    return json.loads(_recorded(Path("benchmarks/results") / name, extra_roots, "file")
                      .read_text())


def _recorded(relative: str | Path, extra_roots, kind: str) -> Path:
    """The first ``root / relative`` that is a ``kind`` (``"folder"`` or ``"file"``) over the
    roots of :func:`find_results`."""
    here = Path.cwd().resolve()
    package = Path(__file__).resolve().parent
    roots = [here, *here.parents, package.parent, *map(Path, extra_roots), package / "_recorded"]
    exists = Path.is_dir if kind == "folder" else Path.is_file
    for root in roots:
        if exists(root / relative):
            return root / relative
    raise FileNotFoundError(
        f"no {kind} {relative} under {here}, its parents or {[str(r) for r in extra_roots]}, "
        "nor installed with the package (gaugebook/_recorded, which a wheel built from the "
        "repository has): install gaugebook from https://github.com/gaugebook/gaugebook")


def arm_of(optimizer: str, tag: str = "") -> str:
    """The arm of a run, its optimizer and variant (``"ecd-pt"``, ``"ecd-global"``,
    ``"adamw"``): the optimizer, plus the run's tag when it has one."""
    return f"{optimizer}-{tag}" if tag else optimizer


@dataclass(frozen=True)
class Run:
    """One training run as :func:`gaugebook.training.train` recorded it; made by
    :meth:`from_dict`, :func:`read_run` or :func:`load_runs`.

    Attributes:
        name: the run's name, unique in its grid (``"ecd-bqv-prelu-s0"``).
        optimizer: a key of ``gaugebook.optim.OPTIMIZERS``; with ``tag``, :attr:`arm`.
        symmetry: ``"symmetric"`` or the breaking, ``"bq"`` or ``"bqv"``.
        activation: the MLP's, ``"gelu"`` or ``"prelu"``.
        seed: the run's :attr:`~gaugebook.run_config.RunConfig.seed`.
        history: ``"step"``, ``"train_loss"``, ``"val_loss"``, ``"J_QK"``, ``"J_VO"`` and
            ``"wall_s"`` (newer files also ``"path_length"``, ``"distance"``,
            ``"skipped_steps"``), each mapped to a list with one entry per evaluation.
        data: the whole JSON record (config, probes, memory, provenance, ...); ``run[key]``
            reads it.
        path: the file the record was read from (``None`` for one made in memory).
        tag: the run's variant label (``"pt"``, ``"global"``, ``"lr=0.001"``), or ``""``.
    """

    name: str
    optimizer: str
    symmetry: str
    activation: str
    seed: int
    history: dict
    data: dict
    path: Path | None = None
    tag: str = ""

    @property
    def arm(self) -> str:
        """The optimizer and its variant (:func:`arm_of`)."""
        return arm_of(self.optimizer, self.tag)

    @classmethod
    def from_dict(cls, data: dict, path: Path | None = None) -> "Run":
        """Validate a result record (as written by ``train``) and wrap it; ValueError naming
        ``path`` for anything that is not one."""
        where = f" in {path}" if path else ""
        if not isinstance(data, dict):
            raise ValueError(f"result record{where} is a {type(data).__name__}, not an object")
        missing = [k for k in REQUIRED if k not in data]
        if missing:
            raise ValueError(f"result record{where} lacks the keys {missing}")
        config, history = data["config"], data["history"]
        if not isinstance(config, dict) or not isinstance(history, dict):
            raise ValueError(f"config and history{where} must be objects")
        lacking = [k for k in CONFIG_KEYS if k not in config]
        if lacking:
            raise ValueError(f"config{where} lacks the keys {lacking}")
        absent = [k for k in HISTORY_KEYS if k not in history]
        if absent:
            raise ValueError(f"history{where} lacks the keys {absent}")
        lengths = {k: len(history[k]) for k in HISTORY_KEYS}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"history lists{where} differ in length: {lengths}")
        steps = history["step"]
        if any(b <= a for a, b in zip(steps, steps[1:])):
            raise ValueError(f"history steps{where} are not increasing: {steps}")
        return cls(name=data["name"], optimizer=config["optimizer"], symmetry=config["symmetry"],
                   activation=config["activation"], seed=int(config["seed"]),
                   history=history, data=data, path=path, tag=config.get("tag", ""))

    def __getitem__(self, key: str):
        """``run["tokens_per_s"]`` etc.: a field of the JSON record."""
        return self.data[key]

    @property
    def complete(self) -> bool:
        """Whether the run trained every step its config asked for, not cut by its wall-clock
        budget (the record's ``truncated``, which ``train`` writes as ``steps_done < steps``;
        a record without the key counts as complete)."""
        return not self.data.get("truncated", False)

    @property
    def steps(self) -> list[int]:
        """The steps at which the history was recorded."""
        return list(self.history["step"])

    @property
    def last_step(self) -> int | None:
        """The last recorded step (``None`` for an empty history)."""
        return self.history["step"][-1] if self.history["step"] else None

    def _column(self, key: str) -> np.ndarray:
        """``history[key]`` as floats (NaN where a value is not recorded: ``path_length`` of
        a run that is not ECD's); ValueError naming this run's keys for another ``key``."""
        if key not in self.history or key == "step":
            raise ValueError(f"unknown history key {key!r}; valid keys: "
                             f"{[k for k in self.history if k != 'step']}")
        return np.array([np.nan if v is None else v for v in self.history[key]], dtype=float)

    def at(self, step: int, key: str = "val_loss") -> float:
        """The recorded ``history[key]`` at ``step`` (no interpolation: the step must be one
        that the run recorded; NaN where the run records no value)."""
        values = self._column(key)
        try:
            i = self.history["step"].index(step)
        except ValueError:
            raise ValueError(f"{self.name} has no record at step {step}; recorded steps: "
                             f"{self.steps}") from None
        return float(values[i])

    def curve(self, key: str = "val_loss") -> tuple[np.ndarray, np.ndarray]:
        """``(steps, values)`` of a history entry, as arrays for plotting."""
        return np.asarray(self.history["step"]), self._column(key)


def read_run(path: str | Path) -> Run:
    """The run result in the file ``path``; ValueError naming the file when it is not valid
    JSON or not a result record (:meth:`Run.from_dict`)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from None
    return Run.from_dict(data, path)


def load_runs(folder: str | Path) -> list[Run]:
    """Every run result ``<folder>/*.json``, sorted by name.

    Raises ``FileNotFoundError`` for a missing folder, ``ValueError`` for a folder without
    results, for failed runs (``*.error.json``, listed by name) and for malformed records.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no results folder {folder}")
    failed = sorted(p.name for p in folder.glob("*.error.json"))
    if failed:
        raise ValueError(f"{folder} holds failed runs: {failed}")
    paths = sorted(folder.glob("*.json"))
    if not paths:
        raise ValueError(f"{folder} holds no result files (*.json)")
    runs = [read_run(path) for path in paths]
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise ValueError(f"{folder} holds two results with the same run name")
    return sorted(runs, key=lambda r: r.name)


def select(runs: list[Run], **criteria) -> list[Run]:
    """The runs whose ``optimizer``, ``tag``, ``arm`` (:attr:`Run.arm`: ``"ecd-pt"`` is the
    optimizer ``"ecd"`` with the tag ``"pt"``), ``symmetry``, ``activation`` or ``seed`` match; a
    criterion may be one value or a tuple/list/set of accepted values."""
    valid = {"optimizer", "tag", "arm", "symmetry", "activation", "seed"}
    unknown = sorted(set(criteria) - valid)
    if unknown:
        raise ValueError(f"unknown selection key(s) {unknown}; valid: {sorted(valid)}")

    def accepts(run: Run) -> bool:
        for key, want in criteria.items():
            values = want if isinstance(want, (tuple, list, set, frozenset)) else (want,)
            if getattr(run, key) not in values:
                return False
        return True

    return [r for r in runs if accepts(r)]


def common_steps(runs: list[Run]) -> list[int]:
    """The steps recorded by every run, ascending."""
    if not runs:
        raise ValueError("no runs given")
    shared = set(runs[0].steps)
    for run in runs[1:]:
        shared &= set(run.steps)
    return sorted(shared)


def values_at(runs: list[Run], step: int | None = None, key: str = "val_loss") -> dict[str, float]:
    """``{run name: history[key] at step}``; ``step=None`` takes the largest step that every
    run recorded (ValueError when there is none)."""
    if step is None:
        shared = common_steps(runs)
        if not shared:
            raise ValueError("the runs share no recorded step: " +
                             ", ".join(f"{r.name} {r.steps}" for r in runs))
        step = shared[-1]
    return {r.name: r.at(step, key) for r in runs}


def breaking_effects(runs: list[Run], key: str = "val_loss", *,
                     step: int | None = None) -> list[dict]:
    """Effect of symmetry breaking at equal steps: for every broken run, the difference
    ``broken - symmetric`` of ``history[key]`` against the symmetric run with the same
    optimizer, activation and seed.

    ``step=None`` uses, for each pair, the largest step both runs recorded. Returns records
    ``{arm, activation, seed, symmetry, step, baseline_value, value, delta}`` (``arm``: the
    run's :attr:`Run.arm`; tagged variants pair among themselves), sorted;
    broken runs without a symmetric partner are left out, and a broken run with several is an
    error (:func:`partner_pairs`).
    """
    out = []
    for run, partner in partner_pairs(runs, skip_unpaired=True):
        if step is None:
            shared = common_steps([run, partner])
            if not shared:
                raise ValueError(f"{run.name} and {partner.name} share no recorded step")
            at = shared[-1]
        else:
            at = step
        value, base = run.at(at, key), partner.at(at, key)
        out.append(dict(arm=run.arm, activation=run.activation, seed=run.seed,
                        symmetry=run.symmetry, step=at, baseline_value=base, value=value,
                        delta=value - base))
    return sorted(out, key=lambda d: (d["arm"], d["activation"], d["symmetry"], d["seed"]))


def activation_contrast(runs: list[Run], arm: str, symmetry: str = "bqv",
                        key: str = "val_loss") -> dict:
    """How much more breaking helps PReLU than GELU in one seed of ``arm``: the
    :func:`breaking_effects` of ``symmetry`` for each activation, both taken at the largest step
    that all four runs (broken and symmetric, PReLU and GELU) recorded, and ``contrast`` =
    Delta(PReLU) - Delta(GELU). Returns ``{step, prelu, gelu, contrast}`` (``prelu`` and
    ``gelu``: the two effect records); ValueError unless ``runs`` hold exactly those four runs
    of ``arm`` (select one seed first)."""
    four = [r for r in runs if r.arm == arm and r.symmetry in (symmetry, BASELINE)]
    cells = sorted((r.activation, r.symmetry) for r in four)
    wanted = sorted((a, s) for a in ("gelu", "prelu") for s in (symmetry, BASELINE))
    if cells != wanted:
        raise ValueError(f"{arm}: the contrast needs one run of each activation (gelu, prelu) "
                         f"and symmetry ({symmetry}, {BASELINE}), got {cells} (select one seed "
                         "first)")
    shared = common_steps(four)
    if not shared:
        raise ValueError(f"the four {arm} runs share no recorded step")
    effects = {e["activation"]: e for e in breaking_effects(four, key, step=shared[-1])}
    return dict(step=shared[-1], prelu=effects["prelu"], gelu=effects["gelu"],
                contrast=effects["prelu"]["delta"] - effects["gelu"]["delta"])


def seed_summary(records: list[dict], by=("arm", "activation", "symmetry"),
                 value: str = "delta") -> list[dict]:
    """Group records (e.g. from :func:`breaking_effects`) over seeds: ``n_seeds``, ``mean`` and
    the sample standard deviation ``std`` (``None`` with a single seed: one seed does not
    estimate a spread)."""
    groups: dict[tuple, list[float]] = {}
    for record in records:
        groups.setdefault(tuple(record[k] for k in by), []).append(float(record[value]))
    out = []
    for key, values in sorted(groups.items()):
        n = len(values)
        out.append({**dict(zip(by, key)), "n_seeds": n, "mean": float(np.mean(values)),
                    "std": float(np.std(values, ddof=1)) if n > 1 else None})
    return out


LAST_EVALUATIONS = 5  # the statistic of the pre-registered rule: mean of the last 5 evaluations
HELPS_BELOW = -0.1  # and mean Delta below this (with Delta < 0 in every seed)


def final_statistic(run: Run, last: int = LAST_EVALUATIONS, key: str = "val_loss") -> float:
    """Mean of ``history[key]`` over the run's last ``last`` evaluations (ValueError with fewer,
    or for a key the run does not record; NaN where a value is not recorded)."""
    check_positive_ints(last=last)  # values[-0:] would be every evaluation
    values = run._column(key)
    if len(values) < last:
        raise ValueError(f"{run.name} recorded {len(values)} evaluations; the statistic needs "
                         f"the last {last}: train with steps >= {last} x eval_every (the preset "
                         "paper-smoke, a check of the pipeline, records fewer: add --set "
                         "steps=60)")
    return float(np.mean(values[-last:]))


def statistic_gap(run: Run, other: Run, last: int = LAST_EVALUATIONS) -> float:
    """``final_statistic(run) - final_statistic(other)``, over the same evaluation steps:
    ValueError when their last ``last`` evaluations were taken at different steps (a run stopped
    by its time budget against a complete one, or two evaluation schedules), where the
    difference would mix training lengths."""
    check_positive_ints(last=last)
    mine, theirs = run.steps[-last:], other.steps[-last:]
    if mine != theirs:
        raise ValueError(f"{run.name} and {other.name} end at different steps ({mine} and "
                         f"{theirs}): compare runs over the same evaluations")
    return final_statistic(run, last) - final_statistic(other, last)


@dataclass(frozen=True)
class Decision:
    """The pre-registered rule (:data:`gaugebook.experiment.PAPER_DECISION`) applied to one arm
    and one broken symmetry: ``deltas`` per seed (broken minus symmetric statistic), their mean,
    a 95% t-interval of the mean, and ``helps``: every Delta < 0 and mean < ``HELPS_BELOW``."""

    arm: str
    symmetry: str
    deltas: dict
    mean: float
    interval: tuple
    helps: bool

    def sentence(self) -> str:
        """The verdict in one sentence."""
        per_seed = ", ".join(signed(d) for d in self.deltas.values())
        verdict = "helps" if self.helps else "does not meet the rule for helping"
        return (f"breaking ({self.symmetry}) {verdict} {self.arm} (mean Δ "
                f"{signed(self.mean)}, 95% t-interval {interval_text(self.interval)}, per seed "
                f"{per_seed})")


def rounded(value: float | None, digits: int = 3) -> float | None:
    """``value`` rounded to ``digits`` decimals, a value that rounds to zero as ``0.0``, so that
    it prints ``0.000``, never ``-0.000`` (``round(-0.0004, 3)`` is ``-0.0``; adding ``0.0``
    makes it ``0.0``)."""
    return None if value is None else round(value, digits) + 0.0


def signed(value: float) -> str:
    """A Delta as printed in verdicts and tables: ``+0.123`` (three decimals, always signed,
    ``+0.000`` for a value that rounds to zero), ``n/a`` when it is not finite."""
    return f"{rounded(value):+.3f}" if math.isfinite(value) else "n/a"


def interval_text(interval: tuple[float, float]) -> str:
    """``[low, high]`` with :func:`signed` ends, ``n/a`` when either end is not finite (as
    :class:`Table` prints a NaN)."""
    low, high = interval
    if not (math.isfinite(low) and math.isfinite(high)):
        return "n/a"
    return f"[{signed(low)}, {signed(high)}]"


def pairs_by_seed(runs: list[Run], arm: str, symmetry: str) -> dict[int, tuple[Run, Run]]:
    """``{seed: (broken, symmetric run)}`` for ``arm``: the pairs the pre-registered rule
    compares (:func:`partner_pairs` of the arm's ``symmetry`` runs), sorted by seed; ValueError
    unless every seed of ``symmetry`` has one symmetric partner and the other way round, or when
    the arm's runs mix activations (select one first)."""
    mine = [r for r in runs if r.arm == arm and r.symmetry in (symmetry, BASELINE)]
    activations = sorted({r.activation for r in mine})
    if len(activations) > 1:
        raise ValueError(f"{arm}: runs of several activations {activations} pair ambiguously; "
                         "select one first, e.g. select(runs, activation='prelu')")
    broken = sorted(r.seed for r in mine if r.symmetry == symmetry)
    base = sorted(r.seed for r in mine if r.symmetry == BASELINE)
    if not broken or broken != base or len(set(broken)) < len(broken):
        raise ValueError(f"{arm}: the seeds of {symmetry} {broken} and of {BASELINE} {base} "
                         "do not pair one to one")
    pairs = partner_pairs(mine)
    return {b.seed: (b, partner) for b, partner in sorted(pairs, key=lambda p: p[0].seed)}


def partner_pairs(runs: list[Run], *, skip_unpaired: bool = False) -> list[tuple[Run, Run]]:
    """Every broken run with its symmetric partner (same arm, activation and seed):
    ``[(broken, partner)]`` in the order of ``runs``, for gains such as
    ``score(broken) - score(partner)``. ValueError when a partner is not unique, or missing
    (unless ``skip_unpaired``: then that run is left out)."""
    partners: dict[tuple[str, str, int], list[Run]] = {}
    for r in runs:
        if r.symmetry == BASELINE:
            partners.setdefault((r.arm, r.activation, r.seed), []).append(r)
    pairs = []
    for r in runs:
        if r.symmetry == BASELINE:
            continue
        found = partners.get((r.arm, r.activation, r.seed), [])
        if not found and skip_unpaired:
            continue
        if len(found) != 1:
            raise ValueError(f"{r.name}: {len(found)} {BASELINE} runs of arm {r.arm}, "
                             f"{r.activation}, seed {r.seed}; a gain needs exactly one partner")
        pairs.append((r, found[0]))
    return pairs


def probe_standard_error(run: Run, score: str = "top1") -> float:
    """The sampling error of a run's mean puzzle score ``probes["mean"][score]``, a mean over
    ``T`` tasks each scored on ``n = config["probe_instances"]`` instances:
    :math:`\\sqrt{\\sum_t p_t(1 - p_t)/n}\\,/\\,T`. Smaller than one binomial over all ``nT``
    instances pooled when the tasks' accuracies differ; unpaired, so conservative for two runs
    that answer the same instances."""
    p = np.array([v[score] for task, v in run["probes"].items() if task != "mean"])
    return math.sqrt(float((p * (1 - p)).sum()) / run["config"]["probe_instances"]) / len(p)


@dataclass(frozen=True)
class PairedProbes:
    """Two models' top-1 answers on the same ``n`` puzzle instances: ``gained`` instances the
    first answers and the second misses, ``lost`` the reverse, and the exact two-sided McNemar
    p-value ``p`` (under the null a discordant instance goes either way with probability 1/2)."""

    gained: int
    lost: int
    n: int
    p: float

    @property
    def gain(self) -> float:
        """The first model's mean top-1 minus the second's, (gained - lost) / n."""
        return (self.gained - self.lost) / self.n

    def sentence(self) -> str:
        """The comparison in words: gained and lost instances, the gain and McNemar's p."""
        return (f"{self.gained} gained and {self.lost} lost of {self.n:,} instances "
                f"(gain {self.gain:+.3f}, McNemar p = {self.p:.2g})")


def probe_mcnemar(probes: dict, reference: dict) -> PairedProbes:
    """Paired test of two models' puzzle scores: ``probes`` and ``reference`` are
    :func:`gaugebook.data.evaluate_probes` outputs (or result records' ``["probes"]``) for the
    same instances (same ``n_per_task``, ``context`` and ``seed``). Each instance answered right
    by one model only counts for it; with equal instances per task, ``gain`` is the difference
    of the mean top-1 scores. Pairing removes what both models share (which instances are
    hard), so it detects smaller differences than :func:`probe_standard_error`. ValueError when
    a side lacks per-instance answers (result files before 2026-12-05) or the tasks differ."""
    from scipy import stats

    tasks = sorted(t for t in probes if t != "mean")
    if tasks != sorted(t for t in reference if t != "mean"):
        raise ValueError("the two were scored on different tasks")
    if not (_has_answers(probes) and _has_answers(reference)):
        raise ValueError("no per-instance answers ('correct'); probes recorded before "
                         "2026-12-05 can only be compared with probe_standard_error")
    gained = lost = n = 0
    for task in tasks:
        a, b = probes[task]["correct"], reference[task]["correct"]
        if len(a) != len(b):
            raise ValueError(f"{task}: {len(a)} instances against {len(b)}: score both models "
                             "with the same n_per_task")
        gained += sum(x > y for x, y in zip(a, b))
        lost += sum(x < y for x, y in zip(a, b))
        n += len(a)
    p = stats.binomtest(gained, gained + lost).pvalue if gained + lost else 1.0
    return PairedProbes(gained, lost, n, float(p))


@dataclass(frozen=True)
class PuzzleChange:
    """A broken run's change of mean top-1 puzzle accuracy against its symmetric partner
    (:func:`puzzle_changes`): ``gain`` (broken minus partner) and the evidence that it is not
    sampling noise: the paired McNemar test where both runs recorded each instance's answer
    (``paired``), else twice the unpaired standard error of the difference (``threshold``)."""

    broken: Run
    partner: Run
    gain: float
    paired: PairedProbes | None
    threshold: float | None

    @property
    def detectable(self) -> bool:
        """McNemar p < 0.05, or (unpaired) ``|gain|`` above ``threshold``."""
        if self.paired is not None:
            return self.paired.p < 0.05 and self.paired.gained != self.paired.lost
        return abs(self.gain) > self.threshold


def _has_answers(probes: dict) -> bool:
    """Whether every task of ``probes`` records its instances' answers (``"correct"``)."""
    return all("correct" in v for task, v in probes.items() if task != "mean")


def puzzle_changes(runs: list[Run]) -> list[PuzzleChange]:
    """Each broken run against its symmetric partner (:func:`partner_pairs`; runs without one
    are left out): the change of its mean top-1 puzzle accuracy, tested pairwise
    (:func:`probe_mcnemar`) when both runs recorded per-instance answers, else against twice
    :func:`probe_standard_error` of each, added in quadrature (conservative for runs that
    answer the same instances)."""
    changes = []
    for b, p in partner_pairs(runs, skip_unpaired=True):
        gain = b["probes"]["mean"]["top1"] - p["probes"]["mean"]["top1"]
        if _has_answers(b["probes"]) and _has_answers(p["probes"]):
            paired, threshold = probe_mcnemar(b["probes"], p["probes"]), None
        else:
            paired = None
            threshold = 2 * math.hypot(probe_standard_error(b), probe_standard_error(p))
        changes.append(PuzzleChange(b, p, gain, paired, threshold))
    return changes


def _gains_and_predictors(runs: list[Run]):
    """Each broken run's gain of mean top-1 puzzle accuracy over its symmetric partner
    (:func:`partner_pairs`), the three predictors of it (keyed as a sentence names them) and
    the broken runs' arms."""
    pairs = partner_pairs(runs)
    gain = [b["probes"]["mean"]["top1"] - p["probes"]["mean"]["top1"] for b, p in pairs]
    predictors = {
        "in-context alignment": [b["alignment"]["in_context"] for b, _ in pairs],
        "static-key alignment": [b["alignment"]["static"] for b, _ in pairs],
        "change of validation loss": [statistic_gap(b, p) for b, p in pairs],
    }
    return gain, predictors, [b.arm for b, _ in pairs]


def puzzle_gain_tests(runs: list[Run], *, within_arms: bool = True) -> dict[str, Correlation]:
    """The test of "alignment predicts puzzle gains better than the loss does" (chapter 18):
    each broken run's gain of mean top-1 puzzle accuracy over its symmetric partner
    (:func:`partner_pairs`), rank-correlated (:func:`~gaugebook.stats.rank_correlation`) with
    the broken run's two alignment scores and with its change of the validation statistic
    (broken minus partner, :func:`final_statistic`). ``within_arms`` (default): permutations
    and bootstrap within each optimizer arm, so that differences between optimizers cannot
    make a correlation. Keyed by the predictors' names as a sentence says them ("in-context
    alignment", "static-key alignment", "change of validation loss"); :func:`gain_rule`
    decides the claim from them."""
    gain, predictors, arms = _gains_and_predictors(runs)
    strata = arms if within_arms else None
    return {name: rank_correlation(x, gain, strata=strata) for name, x in predictors.items()}


def puzzle_gain_differences(runs: list[Run], **options) -> dict[str, tuple]:
    """The comparative statistic of the same claim (``results/README.md``): for each alignment
    score, ``D = rho(alignment, gain) - rho(-(change of validation loss), gain)`` within
    optimizer arms, with its bootstrap interval
    (:func:`~gaugebook.stats.rank_correlation_difference`; ``options`` go to it). D > 0:
    alignment ranks the gains better than the drop of the loss."""
    gain, predictors, arms = _gains_and_predictors(runs)
    drop = [-x for x in predictors.pop("change of validation loss")]
    return {name: rank_correlation_difference(x, drop, gain, strata=arms, **options)
            for name, x in predictors.items()}


@dataclass(frozen=True)
class GainRule:
    """The registered rule of the alignment claim (``results/README.md``) applied to the
    within-arms correlations of :func:`puzzle_gain_tests`: ``aligned``, the alignment scores
    that correlate with the gain at rho > 0 and p < ``alpha``; ``loss_predicts``, whether the
    change of the validation statistic does at rho < 0 and p < ``alpha``. The claim is
    ``supported`` iff some score is aligned and the loss does not predict."""

    aligned: tuple
    loss_predicts: bool

    @property
    def supported(self) -> bool:
        """Some alignment score predicts the gain and the change of the loss does not."""
        return bool(self.aligned) and not self.loss_predicts


def gain_rule(tests: dict[str, Correlation], alpha: float = 0.05) -> GainRule:
    """:class:`GainRule` of ``tests`` (the dict :func:`puzzle_gain_tests` returns)."""
    aligned = tuple(k for k, t in tests.items()
                    if "alignment" in k and t.p < alpha and t.rho > 0)
    change = tests["change of validation loss"]
    return GainRule(aligned, bool(change.p < alpha and change.rho < 0))


def decide(runs: list[Run], arm: str, symmetry: str, *,
           last: int = LAST_EVALUATIONS) -> Decision:
    """Apply the pre-registered rule to ``arm`` (e.g. ``"ecd-pt"``), ``symmetry`` against
    symmetric, pairing runs by seed; ValueError when a run is truncated (stopped by its time
    budget before its planned steps), a seed lacks its partner or fewer than two seeds pair (no
    interval)."""
    cut = sorted(r.name for r in runs if r.arm == arm and r.symmetry in (symmetry, BASELINE)
                 and not r.complete)
    if cut:
        raise ValueError(f"the rule decides on complete runs only; truncated: {cut} (rerun them)")
    pairs = pairs_by_seed(runs, arm, symmetry)
    if len(pairs) < 2:
        raise ValueError(f"{arm}, {symmetry}: one seed gives no interval; the rule needs >= 2")
    deltas = {s: statistic_gap(broken, base, last) for s, (broken, base) in pairs.items()}
    mean, interval = t_interval(list(deltas.values()))
    helps = all(d < 0 for d in deltas.values()) and mean < HELPS_BELOW
    return Decision(arm, symmetry, deltas, mean, interval, helps)


def paired_gaps(runs: list[Run], reference: list[Run], *,
                last: int = LAST_EVALUATIONS) -> dict[int, float]:
    """``{seed: statistic(run) - statistic(reference run)}``, the runs paired by seed (the
    statistic: :func:`final_statistic`, over the same evaluations: :func:`statistic_gap`), e.g.
    one optimizer's symmetric runs against another's. ValueError unless each list holds one run
    per seed, for the same seeds."""
    for group in (runs, reference):
        seeds = [r.seed for r in group]
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"two runs of one seed among {[r.name for r in group]}")
    mine, theirs = ({r.seed: r for r in group} for group in (runs, reference))
    if not mine or set(mine) != set(theirs):
        raise ValueError(f"the seeds {sorted(mine)} and {sorted(theirs)} do not pair")
    return {s: statistic_gap(mine[s], theirs[s], last) for s in sorted(mine)}


def decisions(runs: list[Run]) -> list[Decision]:
    """:func:`decide` for every (arm, broken symmetry) present in ``runs``, sorted."""
    pairs = sorted({(r.arm, r.symmetry) for r in runs if r.symmetry != BASELINE})
    return [decide(runs, arm, symmetry) for arm, symmetry in pairs]


def provenance_summary(runs: list[Run]) -> dict[str, list]:
    """Each provenance field with the sorted distinct values it takes over ``runs`` (one value
    per field when the runs come from one machine and one commit)."""
    fields: dict[str, set] = {}
    for run in runs:
        for k, v in run["provenance"].items():
            fields.setdefault(k, set()).add(v)
    return {k: sorted(v, key=str) for k, v in fields.items()}


_MATH = re.compile(r"\$([^$]+)\$")  # an inline TeX span, $...$
#: The book's TeX macros, ``{name: expansion}``, as its pages define them for MathJax
#: (``_config.yml``, ``mathjax3_config``): ``\GL``, ``\O`` and ``\SO`` (upright), ``\R``
#: (blackboard bold), ``\tr``, ``\rank``, ``\softmax`` and ``\Attn`` (operator names).
#: :func:`with_math` expands them.
#:
#: :meta hide-value:
TEX_MACROS = {"GL": r"\mathrm{GL}", "O": r"\mathrm{O}", "SO": r"\mathrm{SO}", "R": r"\mathbb{R}",
              "tr": r"\operatorname{tr}", "rank": r"\operatorname{rank}",
              "softmax": r"\operatorname{softmax}", "Attn": r"\operatorname{Attn}"}
_MACRO = re.compile(r"\\(" + "|".join(TEX_MACROS) + r")(?![A-Za-z])")  # \SO is not \S then O


def with_math(text: str, escape: bool = True) -> str:
    """``text`` as HTML whose ``$...$`` spans are TeX set as MathML, which browsers draw
    themselves (in the book, in Jupyter and in Colab alike), with the book's macros
    (:data:`TEX_MACROS`, e.g. ``\\GL``); the rest is HTML-escaped unless
    ``escape`` is false (``text`` is HTML already). Raises ``ValueError`` on a TeX command that
    the converter does not know (it would print as ``\\name``)."""
    parts = _MATH.split(text)  # text, tex, text, tex, ..., text
    if len(parts) > 1:  # imported only here: the GPU machine's image lacks it
        from latex2mathml.converter import convert as tex_to_mathml
    for i in range(1, len(parts), 2):
        tex = _MACRO.sub(lambda m: TEX_MACROS[m.group(1)], parts[i])
        # the converter sets a one-letter \mathrm{O} in italics, as a variable (\text is
        # upright), and a bare | as an operator, which browsers space as one (\vert is not)
        tex = re.sub(r"\\mathrm\{([A-Za-z])\}", r"\\text{\1}", tex)
        mathml = tex_to_mathml(re.sub(r"(?<!\\)\|", r"\\vert ", tex))
        unknown = re.search(r">(\\[A-Za-z]+)<", mathml)
        if unknown:
            raise ValueError(f"unknown TeX command {unknown.group(1)} in ${parts[i]}$")
        parts[i] = mathml
    if escape:
        parts[::2] = [html.escape(p) for p in parts[::2]]
    return "".join(parts)


class Table:
    """A small HTML table (no pandas needed) that notebooks display as HTML, and ``print`` as
    fixed-width text.

    ``rows`` are lists of cells; floats are printed with ``float_format`` (``None`` as an en
    dash); every cell is HTML-escaped unless it is an instance of :class:`Table.Raw`. In every
    cell and in the caption, ``$...$`` is TeX, set as MathML (:func:`with_math`); the text form
    keeps the TeX as written and drops a raw cell's tags.
    """

    class Raw(str):
        """A cell whose text is HTML already (e.g. ``Table.Raw("d<sub>k</sub>")``)."""

    def __init__(self, header: list[str], rows: list[list], *, caption: str | None = None,
                 float_format: str = "{:.3f}"):
        widths = {len(row) for row in rows}
        if widths - {len(header)}:
            raise ValueError(f"the header has {len(header)} columns, rows have {sorted(widths)}")
        self.header, self.rows, self.caption = list(header), [list(r) for r in rows], caption
        self.float_format = float_format

    def _text(self, value) -> str:
        """A cell as plain text: floats formatted, ``None`` an en dash, a raw cell untagged."""
        if isinstance(value, Table.Raw):
            return html.unescape(re.sub(r"<[^>]*>", "", value))
        if value is None:
            return "\u2013"
        if isinstance(value, float):
            return "n/a" if math.isnan(value) else self.float_format.format(value)
        return str(value)

    def _cell(self, value) -> str:
        if isinstance(value, Table.Raw):
            return with_math(value, escape=False)
        if value is None:
            return "&ndash;"
        if isinstance(value, float):
            return html.escape(self._text(value))
        return with_math(str(value))

    def to_html(self) -> str:
        """The table as compact HTML (what a notebook displays)."""
        # compact (0.8rem, narrow padding) so that a table of eight columns fits the book's column
        style = 'style="padding: 2px 6px; border-bottom: 1px solid #ccc; text-align: left"'
        head = "".join(f"<th {style}>{self._cell(h)}</th>" for h in self.header)
        body = "".join("<tr>" + "".join(f"<td {style}>{self._cell(c)}</td>" for c in row)
                       + "</tr>" for row in self.rows)
        caption = f"<caption>{with_math(self.caption)}</caption>" if self.caption else ""
        return (f'<table style="border-collapse: collapse; font-size: 0.8rem">{caption}'
                f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")

    def _repr_html_(self) -> str:
        return self.to_html()

    def __str__(self) -> str:
        """The table as fixed-width text: the caption, the header, a rule, one line per row."""
        lines = [[self._text(c) for c in row] for row in [self.header, *self.rows]]
        widths = [max(len(line[j]) for line in lines) for j in range(len(self.header))]
        text = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines]
        text.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(([self.caption] if self.caption else []) + text)

    __repr__ = __str__  # a console shows the table, as a notebook does


def effects_table(effects: list[dict], *, caption: str | None = None) -> Table:
    """:func:`breaking_effects` as a :class:`Table` (one row per broken run), Δ beside the
    breaking it measures; the seed gets a column only when the runs have several."""
    several = len({e["seed"] for e in effects}) > 1
    rows = [[e["arm"], e["activation"], e["symmetry"], f"{e['delta']:+.3f}",
             e["baseline_value"], e["value"], e["step"]] + ([e["seed"]] if several else [])
            for e in effects]
    return Table(["arm", "activation", "breaking", "Δ (broken − symmetric)", "symmetric",
                  "broken", "step"] + (["seed"] if several else []), rows, caption=caption)
