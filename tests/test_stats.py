"""gaugebook.stats: t-intervals and rank correlations (permutation p, bootstrap interval,
within groups, their difference and power), on synthetic samples."""
import numpy as np
import pytest


def test_rank_correlation_with_permutation_p_and_bootstrap_interval():
    from scipy import stats

    from gaugebook.stats import rank_correlation

    rng = np.random.default_rng(3)
    x = rng.normal(size=30)
    y = x + 0.5 * rng.normal(size=30)
    c = rank_correlation(x, y, resamples=2000)
    assert abs(c.rho - stats.spearmanr(x, y).statistic) < 1e-12
    assert c.p < 0.01 and c.interval[0] < c.rho < c.interval[1] and c.interval[0] > 0
    unrelated = rank_correlation(x, rng.normal(size=30), resamples=2000)
    assert unrelated.p > 0.05 and unrelated.interval[0] < 0 < unrelated.interval[1]
    assert "permutation p" in c.sentence()
    with pytest.raises(ValueError, match="constant"):
        rank_correlation(x, np.zeros(30))
    with pytest.raises(ValueError, match=">= 4"):
        rank_correlation(x[:3], y[:3])


def test_a_correlation_between_groups_is_not_one_within_them():
    from gaugebook.stats import rank_correlation

    rng = np.random.default_rng(4)
    arm = np.repeat(["a", "b", "c"], 8)
    level = np.repeat([0.0, 1.0, 2.0], 8)  # the groups differ in both x and y
    x, y = level + 0.1 * rng.normal(size=24), level + 0.1 * rng.normal(size=24)
    assert rank_correlation(x, y, resamples=2000).p < 0.01  # pooled: driven by the groups
    within = rank_correlation(x, y, strata=arm, resamples=2000)
    assert within.strata == 3 and within.p > 0.05 and "within 3 groups" in within.sentence()
    y_related = level + x  # within groups too
    assert rank_correlation(x, y_related, strata=arm, resamples=2000).rho > 0.99
    # a group too small for a rho is left out, and so are its pairs from n
    small = np.array(["a"] * 5 + ["b"] * 2)
    kept = rank_correlation(x[:7], y_related[:7], strata=small, resamples=99)
    assert kept.n == 5 and kept.strata == 1 and "n = 5" in kept.sentence()


def test_rank_correlation_power_is_the_level_under_the_null_and_grows_with_rho():
    from gaugebook.stats import rank_correlation_power

    pairs = [0] * 30
    null = rank_correlation_power(pairs, 0.0, draws=300, resamples=499)
    assert 0.01 < null < 0.10  # the test's level, 0.05, within sampling error (sd 0.013)
    weak, strong = (rank_correlation_power(pairs, rho, draws=200, resamples=499)
                    for rho in (0.3, 0.9))
    assert weak < 0.7 < 0.95 < strong
    few = rank_correlation_power(["a"] * 3 + ["b"] * 3 + ["c"] * 6, 0.9, draws=200,
                                 resamples=499)
    assert few < strong  # 12 pairs in three groups carry less evidence than 30 pairs
    with pytest.raises(ValueError, match="rho"):
        rank_correlation_power(pairs, 1.5)
    for draws in (0, -3):  # a ZeroDivisionError, and a power of -0.0
        with pytest.raises(ValueError, match="draws must be a positive integer"):
            rank_correlation_power(pairs, 0.5, draws=draws)


def test_rank_correlation_difference_ranks_two_predictors():
    """D > 0 with an interval above 0 when a predicts y and b is noise; an interval around 0
    when a and b are equally good (noisy copies of one signal); mismatched lengths refused."""
    from gaugebook.stats import rank_correlation_difference

    rng = np.random.default_rng(0)
    y = rng.normal(size=40)
    good, noise = y + 0.3 * rng.normal(size=40), rng.normal(size=40)
    D, (low, high) = rank_correlation_difference(good, noise, y, resamples=999)
    assert D > 0.5 and low > 0
    twin_a, twin_b = y + rng.normal(size=40), y + rng.normal(size=40)
    D, (low, high) = rank_correlation_difference(twin_a, twin_b, y, resamples=999)
    assert low < 0 < high and abs(D) < 0.3
    strata = ["a"] * 20 + ["b"] * 20
    within = rank_correlation_difference(good, noise, y, strata=strata, resamples=99)
    assert within.value > 0.5 and within.interval[0] < within.value  # named fields too
    with pytest.raises(ValueError, match="equal length"):
        rank_correlation_difference(good, noise[:-1], y)


def test_centred_takes_out_each_groups_mean():
    from gaugebook.stats import centred_by

    values, seeds = [1.0, 3.0, 10.0, 14.0, 5.0], [0, 0, 1, 1, 2]
    np.testing.assert_allclose(centred_by(values, seeds), [-1, 1, -2, 2, 0])
    with pytest.raises(ValueError, match="one length"):
        centred_by(values, seeds[:-1])


def test_bad_settings_are_named():
    from gaugebook.stats import (rank_correlation, rank_correlation_difference,
                                 rank_correlation_power, t_interval)

    with pytest.raises(ValueError, match="level must lie strictly between 0 and 1, got 1.5"):
        t_interval([1.0, 2.0, 3.0], level=1.5)  # was (nan, nan)
    with pytest.raises(ValueError, match="resamples must be a positive integer, got 0"):
        rank_correlation([1, 2, 3, 4, 5], [2, 1, 4, 3, 5], resamples=0)
    with pytest.raises(ValueError, match=r"alpha \(the significance level\) must lie"):
        rank_correlation_power([0] * 6, 0.5, alpha=1.9)
    with pytest.raises(ValueError, match="resamples must be a positive integer, got 2.5"):
        rank_correlation_difference([1, 2, 3, 4], [4, 3, 2, 1], [1, 2, 3, 4], resamples=2.5)
    nan = float("nan")
    with pytest.raises(ValueError, match=r"values must be finite; not at indices \[2\]"):
        t_interval([1.0, 2.0, nan])  # was (nan, (nan, nan))
    with pytest.raises(ValueError, match=r"y must be finite; not at indices \[5\]"):
        rank_correlation([1, 2, 3, 4, 5, 6], [2, 1, 4, 3, 6, nan], resamples=99)
    with pytest.raises(ValueError, match=r"b must be finite; not at indices \[0, 3\]"):
        rank_correlation_difference([1, 2, 3, 4], [nan, 3, 2, float("inf")], [1, 2, 3, 4])
