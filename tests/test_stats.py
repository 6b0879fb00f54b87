"""dispatcher.core.stats: geometric means, their intervals and the speedup interval, checked against
scipy.stats, textbook values and hand computations."""
from __future__ import annotations

import configparser
import math
import random
import statistics
import subprocess
import sys

import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.core.stats import (
    geomean,
    geomean_ci,
    geomean_speedup_ci,
    paired_speedup_ci,
    relative_half_width,
    speedup_ci,
    t_quantile,
)
from tests.helpers import REPO

# Baseline and candidate log-times for the hand computation (test_hand_computed_speedup_ci).
BASE_LOGS = [0.0, 0.02, -0.02]
BEST_LOGS = [-0.1, -0.08, -0.12]

times_st = st.lists(st.floats(min_value=1e-3, max_value=1e3), min_size=2, max_size=30)
# scipy warns when nearly identical times make its moments inexact; the comparisons hold anyway.
near_identical = pytest.mark.filterwarnings("ignore:Precision loss:RuntimeWarning")


def logs(times):
    return [math.log(t) for t in times]


# --------------------------------------------------------------------------- t quantile

@pytest.mark.parametrize("df, expected", [(1, 12.7062), (2, 4.3027), (4, 2.7764), (5, 2.5706),
                                          (10, 2.2281), (30, 2.0423), (100, 1.9840),
                                          (1e9, 1.9600), (math.inf, 1.9600)])
def test_t_quantile_matches_tables(df, expected):
    assert t_quantile(df) == pytest.approx(expected, abs=6e-5)


@pytest.mark.parametrize("df, level, expected", [(1, 0.99, 63.6567), (10, 0.99, 3.1693),
                                                 (3, 0.90, 2.3534), (20, 0.80, 1.3253)])
def test_t_quantile_other_levels_match_tables(df, level, expected):
    assert t_quantile(df, level) == pytest.approx(expected, abs=6e-5)


@pytest.mark.parametrize("df", [0.5, 1, 2.7, 4.5, 17.25, 1234.5])
def test_t_quantile_is_two_sided(df):
    t = t_quantile(df)
    assert scipy.stats.t.cdf(t, df) - scipy.stats.t.cdf(-t, df) == pytest.approx(0.95, abs=1e-12)


def test_t_quantile_fractional_df_lies_between():
    assert t_quantile(4) > t_quantile(4.5) > t_quantile(5)


@pytest.mark.parametrize("df, level", [(0, 0.95), (-1, 0.95), (math.nan, 0.95), (3, 0.0),
                                       (3, 1.0), (3, 95), (3, math.nan)])
def test_t_quantile_rejects_bad_arguments(df, level):
    with pytest.raises(ValueError):
        t_quantile(df, level)


def test_importing_the_commands_and_the_statistics_does_not_import_scipy():
    # Every console script's module (setup.cfg), as the command's start-up imports it.
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg")
    modules = [line.split("=")[1].split(":")[0].strip()
               for line in parser["options.entry_points"]["console_scripts"].splitlines()
               if "=" in line]
    assert modules
    code = (f"import importlib, sys\nfor m in {modules + ['dispatcher.core.stats']!r}:\n"
            "    importlib.import_module(m)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'scipy'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=REPO).stdout
    assert out.strip() == "[]"


# --------------------------------------------------------------------------- geometric mean

def test_geomean_known_values():
    assert geomean([2.0, 8.0]) == pytest.approx(4.0, rel=1e-15)
    assert geomean([1.0, 10.0, 100.0]) == pytest.approx(10.0, rel=1e-15)
    assert geomean([0.25]) == 0.25
    assert geomean(iter([3.0, 3.0, 3.0])) == pytest.approx(3.0, rel=1e-15)  # any iterable


@given(times_st)
def test_geomean_matches_scipy(times):
    assert geomean(times) == pytest.approx(scipy.stats.gmean(times), rel=1e-12)


@pytest.mark.parametrize("times", [[], [1.0, 0.0], [1.0, -2.0], [math.nan], [math.inf]])
def test_geomean_rejects_empty_and_non_positive(times):
    with pytest.raises(ValueError):
        geomean(times)


def test_geomean_ci_hand_computed():
    # logs 0, 0.02, -0.02: mean 0, sample sd 0.02, n 3; t(0.975, 2) = 4.302653
    # half width 4.302653 * 0.02 / sqrt(3) = 0.04968275
    lo, hi = geomean_ci([math.exp(v) for v in BASE_LOGS])
    assert lo == pytest.approx(math.exp(-0.04968275), abs=1e-7)
    assert hi == pytest.approx(math.exp(0.04968275), abs=1e-7)


@near_identical
@settings(max_examples=50)
@given(times_st, st.sampled_from([0.8, 0.95, 0.99]))
def test_geomean_ci_matches_scipy_one_sample_t_interval(times, level):
    lt = logs(times)
    if statistics.variance(lt) == 0:
        return
    res = scipy.stats.ttest_1samp(lt, 0.0)
    if not hasattr(res, "confidence_interval"):
        pytest.skip("scipy too old for confidence_interval")
    ci = res.confidence_interval(confidence_level=level)
    lo, hi = geomean_ci(times, level)
    assert lo == pytest.approx(math.exp(ci.low), rel=1e-9)
    assert hi == pytest.approx(math.exp(ci.high), rel=1e-9)
    assert lo <= geomean(times) * (1 + 1e-12) and hi >= geomean(times) * (1 - 1e-12)


def test_geomean_ci_edge_cases():
    assert geomean_ci([1.5]) == (1.5, 1.5)
    lo, hi = geomean_ci([])
    assert math.isnan(lo) and math.isnan(hi)
    assert geomean_ci([2.0, 2.0, 2.0]) == pytest.approx((2.0, 2.0), rel=1e-15)
    # Beyond 30 runs the exact quantile, not the normal one: wider than 1.96 standard errors.
    times = [1.0 + 0.01 * (i % 5) for i in range(40)]
    lo, hi = geomean_ci(times)
    lt = logs(times)
    se = scipy.stats.tstd(lt) / math.sqrt(len(lt))
    assert math.log(hi) - math.log(geomean(times)) == pytest.approx(2.022691 * se, rel=1e-6)


def test_geomean_ci_wider_at_higher_level():
    times = [1.0, 1.1, 0.95, 1.05]
    lo95, hi95 = geomean_ci(times)
    lo99, hi99 = geomean_ci(times, 0.99)
    assert lo99 < lo95 < hi95 < hi99


# --------------------------------------------------------------------------- speedup

def test_hand_computed_speedup_ci():
    # log baseline: mean 0, sample variance (0 + .02^2 + .02^2) / 2 = 0.0004; n = 3
    # log best:     mean -0.1, sample variance 0.0004; n = 3
    # difference of means 0.1; se = sqrt(0.0004/3 + 0.0004/3) = 0.01632993
    # Welch df = (2v/3)^2 / (2 (v/3)^2 / 2) = 4, t(0.975, 4) = 2.776445; half width 0.04533921
    # speedup exp(0.1) = 1.105171, CI [exp(0.05466079), exp(0.14533921)] = [1.056182, 1.156431]
    s, lo, hi = speedup_ci([math.exp(v) for v in BASE_LOGS], [math.exp(v) for v in BEST_LOGS])
    assert s == pytest.approx(1.105171, abs=1e-6)
    assert lo == pytest.approx(1.056182, abs=1e-6)
    assert hi == pytest.approx(1.156431, abs=1e-6)


def _welch_by_hand(base, cand, level):
    """Welch's interval written out independently, for scipy versions without
    ttest_ind(...).confidence_interval."""
    lb, lc = logs(base), logs(cand)
    vb = scipy.stats.tvar(lb) / len(lb)
    vc = scipy.stats.tvar(lc) / len(lc)
    df = (vb + vc) ** 2 / (vb ** 2 / (len(lb) - 1) + vc ** 2 / (len(lc) - 1))
    half = scipy.stats.t.ppf(0.5 + level / 2, df) * math.sqrt(vb + vc)
    d = sum(lb) / len(lb) - sum(lc) / len(lc)
    return d - half, d + half


@near_identical
@settings(max_examples=50)
@given(times_st, times_st, st.sampled_from([0.9, 0.95, 0.99]))
def test_speedup_ci_matches_scipy_welch_interval(base, cand, level):
    lb, lc = logs(base), logs(cand)
    if statistics.variance(lb) == 0 and statistics.variance(lc) == 0:
        return
    res = scipy.stats.ttest_ind(lb, lc, equal_var=False)
    if hasattr(res, "confidence_interval"):
        ci = res.confidence_interval(confidence_level=level)
        low, high = ci.low, ci.high
    else:
        low, high = _welch_by_hand(base, cand, level)
    s, lo, hi = speedup_ci(base, cand, level)
    assert s == pytest.approx(scipy.stats.gmean(base) / scipy.stats.gmean(cand), rel=1e-9)
    assert lo == pytest.approx(math.exp(low), rel=1e-9)
    assert hi == pytest.approx(math.exp(high), rel=1e-9)


@given(times_st, times_st)
def test_speedup_ci_is_antisymmetric(base, cand):
    s, lo, hi = speedup_ci(base, cand)
    r, rlo, rhi = speedup_ci(cand, base)
    assert lo is not None and hi is not None and rlo is not None and rhi is not None
    assert s * r == pytest.approx(1.0, rel=1e-12)
    assert lo * rhi == pytest.approx(1.0, rel=1e-9) and hi * rlo == pytest.approx(1.0, rel=1e-9)
    assert lo <= s * (1 + 1e-12) and s <= hi * (1 + 1e-12)


def test_speedup_ci_needs_two_times_each_side():
    assert speedup_ci([1.0, 1.1], [0.9]) == (pytest.approx(math.sqrt(1.1) / 0.9), None, None)
    assert speedup_ci([2.0], [1.0, 1.0]) == (pytest.approx(2.0), None, None)


def test_speedup_ci_zero_variance():
    s, lo, hi = speedup_ci([2.0, 2.0, 2.0], [1.0, 1.0])
    assert s == pytest.approx(2.0) and lo == s and hi == s


def test_speedup_ci_one_side_constant_uses_the_other_sides_df():
    # baseline constant: se^2 = vc, Welch df = n_c - 1 = 3
    cand = [0.9, 1.0, 1.1, 1.0]
    s, lo, hi = speedup_ci([1.0, 1.0, 1.0], cand)
    lc = logs(cand)
    half = 3.182446 * scipy.stats.tstd(lc) / math.sqrt(len(lc))
    assert math.log(hi / s) == pytest.approx(half, rel=1e-6)
    assert math.log(s / lo) == pytest.approx(half, rel=1e-6)


@pytest.mark.parametrize("base, cand", [([], [1.0]), ([1.0], []), ([1.0, 0.0], [1.0, 1.0])])
def test_speedup_ci_rejects_missing_or_non_positive_times(base, cand):
    with pytest.raises(ValueError):
        speedup_ci(base, cand)


# --------------------------------------------------------------------------- paired speedups

def test_paired_speedup_ci_is_the_t_interval_of_the_mean_log_ratio():
    rng = random.Random(5)
    reference = [1.0 + 0.05 * rng.random() for _ in range(12)]
    candidate = [r * (0.9 + 0.02 * rng.random()) for r in reference]
    s, lo, hi = paired_speedup_ci(reference, candidate)
    d = [math.log(r / c) for r, c in zip(reference, candidate)]
    res = scipy.stats.ttest_1samp(d, 0.0).confidence_interval(0.95)
    assert s == pytest.approx(geomean(reference) / geomean(candidate), rel=1e-12)
    assert (lo, hi) == (pytest.approx(math.exp(res.low), rel=1e-12),
                        pytest.approx(math.exp(res.high), rel=1e-12))
    assert relative_half_width(s, lo, hi) == pytest.approx(max(hi / s - 1, 1 - lo / s))


def test_pairing_cancels_what_the_two_runs_of_a_pair_share():
    """A CPU whose speed changes from pair to pair widens Welch's interval, not the paired."""
    speeds = [1.0, 1.3, 0.8, 1.2, 0.9, 1.1, 1.25, 0.85]
    reference = [s * 1.0 for s in speeds]
    candidate = [s * 0.95 * (1 + 0.001 * (-1) ** i) for i, s in enumerate(speeds)]
    _, plo, phi = paired_speedup_ci(reference, candidate)
    _, wlo, whi = speedup_ci(reference, candidate)
    assert plo > 1.0 and phi - plo < (whi - wlo) / 10  # significant when paired
    assert wlo < 1.0  # not when the pairs are ignored


def test_paired_speedup_ci_edge_cases():
    assert paired_speedup_ci([2.0], [1.0]) == (2.0, None, None)
    assert paired_speedup_ci([2.0, 4.0], [1.0, 2.0]) == (2.0, 2.0, 2.0)
    with pytest.raises(ValueError, match="not pairs"):
        paired_speedup_ci([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="no pairs"):
        paired_speedup_ci([], [])
    assert relative_half_width(1.0, None, None) == math.inf


def test_geomean_of_speedups_with_intervals_by_hand():
    """Two speedups 1.1 [1.0, 1.21] and 0.9 [0.81, 1.0]: the geometric mean is sqrt(0.99);
    each log interval has half-width h (log 1.1 - log 1.0 and log 0.9 - log 0.81 differ, each
    read back as its own standard error), combined as sqrt(se1^2 + se2^2) / 2."""
    z = scipy.stats.norm.ppf(0.975)
    got = geomean_speedup_ci([(1.1, 1.0, 1.21), (0.9, 0.81, 1.0)])
    se1 = (math.log(1.21) - math.log(1.0)) / (2 * z)
    se2 = (math.log(1.0) - math.log(0.81)) / (2 * z)
    se = math.sqrt(se1 ** 2 + se2 ** 2) / 2
    mean = (math.log(1.1) + math.log(0.9)) / 2
    assert got == pytest.approx((math.exp(mean), math.exp(mean - z * se),
                                 math.exp(mean + z * se)))
    one = geomean_speedup_ci([(1.2, 1.1, 1.3)])  # one benchmark: its own (log-centred) interval
    assert one[0] == pytest.approx(1.2) and one[1] < 1.2 < one[2]
    with pytest.raises(ValueError):
        geomean_speedup_ci([])
