"""Statistics on arrays that the experiment's results need (chapters 17-20): the t-interval of
a mean, and Spearman's rank correlation with a permutation p-value and a bootstrap interval,
within groups (strata) where asked, its difference between two predictors and its power.
Nothing here knows about runs: :mod:`gaugebook.results` applies these to result files."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from gaugebook.checks import check_positive_ints

__all__ = ["t_interval", "Correlation", "centred_by", "rank_correlation",
           "CorrelationDifference", "rank_correlation_difference", "rank_correlation_power"]


def _check_fraction(name: str, value) -> None:
    """ValueError unless ``value`` is a number strictly between 0 and 1 (a level)."""
    if not (isinstance(value, (int, float)) and 0 < value < 1):
        raise ValueError(f"{name} must lie strictly between 0 and 1, got {value!r}")


def t_interval(values, level: float = 0.95) -> tuple[float, tuple[float, float]]:
    r"""``(mean, (low, high))``: the mean of ``values`` and its ``level`` t-interval,
    :math:`\bar x \pm t_{(1 + \ell)/2,\,n-1}\, s/\sqrt n` with :math:`\ell` the ``level``
    and :math:`s` the sample standard deviation (ValueError for fewer than two values)."""
    from scipy import stats

    _check_fraction("level", level)
    values = _finite(np.asarray(values, dtype=float), "values")
    n = len(values)
    if n < 2:
        raise ValueError(f"a t-interval needs at least two values, got {n}")
    mean = float(values.mean())
    half = float(stats.t.ppf((1 + level) / 2, n - 1) * values.std(ddof=1) / math.sqrt(n))
    return mean, (mean - half, mean + half)


@dataclass(frozen=True)
class Correlation:
    """Spearman's rank correlation ``rho`` of ``n`` pairs (within ``strata`` groups, their
    size-weighted mean; ``n`` counts the pairs of the groups that entered), the two-sided
    permutation p-value ``p`` (the pairing permuted, within each group) and a percentile
    bootstrap interval ``(low, high)`` (pairs resampled, within each group)."""

    rho: float
    p: float
    interval: tuple
    n: int
    strata: int = 1

    def sentence(self) -> str:
        """The correlation in words: rho, its permutation p, the bootstrap interval and n."""
        within = f", within {self.strata} groups" if self.strata > 1 else ""
        return (f"rho = {self.rho:+.2f} (permutation p = {self.p:.2g}, 95% bootstrap interval "
                f"[{self.interval[0]:+.2f}, {self.interval[1]:+.2f}], n = {self.n}{within})")


def _spearman(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman's rho along the last axis (Pearson's r of the ranks); NaN where a side is
    constant."""
    from scipy import stats

    ra, rb = stats.rankdata(a, axis=-1), stats.rankdata(b, axis=-1)
    ra, rb = ra - ra.mean(-1, keepdims=True), rb - rb.mean(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (ra * rb).sum(-1) / np.sqrt((ra ** 2).sum(-1) * (rb ** 2).sum(-1))


def _finite(values: np.ndarray, name: str) -> np.ndarray:
    """``values``; ValueError naming the indices of entries that are NaN or infinite."""
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        raise ValueError(f"{name} must be finite; not at indices {bad.tolist()}")
    return values


def _samples(**columns) -> list[np.ndarray]:
    """The columns as float arrays, checked: 1-D, of one length, at least 4 pairs, finite."""
    arrays = [np.asarray(c, dtype=float) for c in columns.values()]
    shapes = [a.shape for a in arrays]
    if len(set(shapes)) > 1 or arrays[0].ndim != 1 or len(arrays[0]) < 4:
        raise ValueError(f"need 1-D samples of equal length >= 4, got shapes {shapes}")
    return [_finite(a, name) for name, a in zip(columns, arrays)]


def _groups(strata, *columns) -> list[np.ndarray]:
    """The pairs' indices per group of ``strata`` (all one group when None), keeping groups of
    3 or more pairs in which every column varies; ValueError when none is left."""
    n = len(columns[0])
    labels = np.zeros(n, dtype=int) if strata is None else np.unique(
        np.asarray(strata, dtype=object).astype(str), return_inverse=True)[1]
    if len(labels) != n:
        raise ValueError(f"strata has {len(labels)} entries for {n} pairs")
    groups = [np.flatnonzero(labels == g) for g in np.unique(labels)]
    groups = [g for g in groups if len(g) >= 3 and all(np.ptp(c[g]) > 0 for c in columns)]
    if not groups:
        for name, v in zip("xyz", columns):
            if np.ptp(v) == 0:
                raise ValueError(f"{name} is constant ({v[0]:g}): its rank correlation is "
                                 "undefined")
        raise ValueError("no group has 3 or more pairs that vary in every sample")
    return groups


def _weighted_rho(x, y, groups, ix, iy) -> np.ndarray:
    """Spearman's rho of ``x[ix]`` with ``y[iy]`` (index arrays [draws, n]) per group, averaged
    with the groups' sizes as weights: [draws] (nan for a draw with no rho in any group)."""
    weights = np.array([len(g) for g in groups], dtype=float)
    rhos = np.stack([_spearman(x[ix[:, g]], y[iy[:, g]]) for g in groups])
    ok = ~np.isnan(rhos)  # (groups, draws)
    with np.errstate(invalid="ignore"):
        return (np.where(ok, rhos, 0) * weights[:, None]).sum(0) / (ok * weights[:, None]).sum(0)


def centred_by(values, groups) -> np.ndarray:
    """Each value minus the mean of its group, [n] -> [n]: e.g. runs centred by seed, when each
    seed has its own validation text and the seeds' levels differ for that reason alone."""
    values, groups = np.asarray(values, dtype=float), np.asarray(groups)
    if values.shape != groups.shape or values.ndim != 1:
        raise ValueError(f"need 1-D values and groups of one length, got shapes {values.shape} "
                         f"and {groups.shape}")
    return values - np.array([values[groups == g].mean() for g in groups])


def rank_correlation(x, y, *, strata=None, resamples: int = 9999, seed: int = 0) -> Correlation:
    """Spearman's ``rho`` between the paired samples ``x`` and ``y`` [n], with a two-sided
    permutation p-value (under the null the pairing is arbitrary: ``y`` is shuffled
    ``resamples`` times) and a 95% percentile bootstrap interval over ``resamples`` draws of the
    pairs (draws in which a side is constant have no rho and are left out).

    ``strata`` [n] (e.g. each run's optimizer arm) asks whether ``x`` predicts ``y`` *within*
    groups: rho is the size-weighted mean of the groups' rhos (groups of fewer than 3 pairs, or
    constant in ``x`` or ``y``, are left out), and both the permutations and the bootstrap act
    within each group, so that differences between groups cannot make a correlation. ValueError
    for fewer than 4 pairs, or no group with a rho."""
    check_positive_ints(resamples=resamples)
    x, y = _samples(x=x, y=y)
    groups = _groups(strata, x, y)
    rng = np.random.default_rng(seed)

    def statistic(ix, iy):  # (draws, n) indices into x and into y -> (draws,) weighted rho
        return _weighted_rho(x, y, groups, ix, iy)

    identity = np.arange(len(x))[None]
    observed = float(statistic(identity, identity)[0])
    shuffled = np.repeat(identity, resamples, 0)  # y shuffled within each group
    resampled = np.repeat(identity, resamples, 0)  # pairs drawn with replacement, per group
    for g in groups:
        shuffled[:, g] = g[rng.random((resamples, len(g))).argsort(1)]
        resampled[:, g] = g[rng.integers(0, len(g), (resamples, len(g)))]
    null = statistic(identity, shuffled)
    p = (1 + np.sum(np.abs(null) >= abs(observed) - 1e-12)) / (1 + resamples)
    low, high = np.nanpercentile(statistic(resampled, resampled), [2.5, 97.5])
    return Correlation(observed, float(p), (float(low), float(high)),
                       sum(len(g) for g in groups), strata=len(groups))


class CorrelationDifference(NamedTuple):
    """What :func:`rank_correlation_difference` returns; unpacks as ``(D, (low, high))``."""

    value: float  #: D = rho(a, y) - rho(b, y)
    interval: tuple[float, float]  #: its 95% percentile bootstrap interval


def rank_correlation_difference(a, b, y, *, strata=None, resamples: int = 9999,
                                seed: int = 0) -> CorrelationDifference:
    """Which of two predictors ranks ``y`` better: ``D = rho(a, y) - rho(b, y)``, each rho as
    :func:`rank_correlation` computes it (within ``strata`` groups, size-weighted), and a 95%
    percentile bootstrap interval of D from the same resampled pairs for both (within each
    group). A predictor expected to correlate negatively enters negated. "One rho significant,
    the other not" is no evidence that they differ; an interval of D that excludes 0 is.
    Returns a :class:`CorrelationDifference`, ``(D, (low, high))``."""
    check_positive_ints(resamples=resamples)
    a, b, y = _samples(a=a, b=b, y=y)
    groups = _groups(strata, a, b, y)
    rng = np.random.default_rng(seed)
    identity = np.arange(len(y))[None]
    resampled = np.repeat(identity, resamples, 0)
    for g in groups:
        resampled[:, g] = g[rng.integers(0, len(g), (resamples, len(g)))]

    def difference(ix):
        return _weighted_rho(a, y, groups, ix, ix) - _weighted_rho(b, y, groups, ix, ix)

    low, high = np.nanpercentile(difference(resampled), [2.5, 97.5])
    return CorrelationDifference(float(difference(identity)[0]), (float(low), float(high)))


def rank_correlation_power(strata, rho: float, *, alpha: float = 0.05, draws: int = 400,
                           resamples: int = 999, seed: int = 0) -> float:
    """The power of :func:`rank_correlation`'s test: the share of ``draws`` simulated experiments
    whose p-value is below ``alpha`` (the significance level) when the true rank correlation is
    ``rho``. ``strata`` [n] gives each pair's group, as for :func:`rank_correlation` (``[0] * n``
    for n pairs without groups). Each draw takes normal scores with Pearson correlation
    2 sin(pi rho / 6), the value whose Spearman correlation is ``rho``."""
    if not -1 <= rho <= 1:
        raise ValueError(f"rho must lie in [-1, 1], got {rho}")
    _check_fraction("alpha (the significance level)", alpha)
    check_positive_ints(draws=draws, resamples=resamples)
    strata = list(strata)
    r = 2 * math.sin(math.pi * rho / 6)
    rng = np.random.default_rng(seed)
    hits = 0
    for k in range(draws):
        x, y = rng.multivariate_normal([0, 0], [[1, r], [r, 1]], len(strata)).T
        hits += rank_correlation(x, y, strata=strata, resamples=resamples, seed=k).p < alpha
    return hits / draws
