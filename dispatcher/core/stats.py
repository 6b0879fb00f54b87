"""The project's statistics of run times, in one place: geometric means and their intervals.

Run times are compared on the log scale: a geometric mean is the exponential of the mean log
time, its confidence interval a Student t-interval on the log times, exponentiated, and a
speedup (the ratio of two geometric means) gets a Welch t-interval on the difference of the mean
log times, exponentiated.  One definition of speedup everywhere (docs/measurement.md).

The t quantile comes from scipy (``scipy.special.stdtrit``), imported on first use only:
importing this module (and so the CLI) stays cheap.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def _logs(times: Iterable[float]) -> list[float]:
    logs = []
    for t in times:
        if not t > 0 or math.isinf(t):
            raise ValueError(f"times must be positive and finite, got {t!r}")
        logs.append(math.log(t))
    return logs


def _mean_and_var(logs: list[float]) -> tuple[float, float]:
    """Mean and sample variance (n - 1 in the denominator; needs two values or more)."""
    m = math.fsum(logs) / len(logs)
    return m, math.fsum((v - m) ** 2 for v in logs) / (len(logs) - 1)


def t_quantile(df: float, level: float = 0.95) -> float:
    """The two-sided Student t quantile: t such that P(|T| <= t) = ``level`` for T with ``df``
    degrees of freedom (> 0, may be fractional as Welch's are, or infinite: the normal)."""
    if not df > 0:
        raise ValueError(f"degrees of freedom must be positive, got {df!r}")
    if not 0 < level < 1:
        raise ValueError(f"confidence level must lie strictly between 0 and 1, got {level!r}")
    from scipy.special import stdtrit  # lazy: scipy costs ~0.1 s to import

    return float(stdtrit(df, (1.0 + level) / 2.0))


def geomean(times: Iterable[float]) -> float:
    """The geometric mean of positive times; ValueError for none or a non-positive one."""
    logs = _logs(times)
    if not logs:
        raise ValueError("geometric mean of no times")
    return math.exp(math.fsum(logs) / len(logs))


def geomean_ci(times: Iterable[float], level: float = 0.95) -> tuple[float, float]:
    """(low, high): the ``level`` confidence interval of the geometric mean of ``times``, a
    t-interval on the log times with n - 1 degrees of freedom, exponentiated.

    One time: (t, t) (no spread to estimate); no times: (nan, nan).
    """
    logs = _logs(times)
    if len(logs) < 2:
        return (math.exp(logs[0]),) * 2 if logs else (math.nan, math.nan)
    m, var = _mean_and_var(logs)
    if var == 0.0:
        return math.exp(m), math.exp(m)
    half = t_quantile(len(logs) - 1, level) * math.sqrt(var / len(logs))
    return math.exp(m - half), math.exp(m + half)


def speedup_ci(baseline_times: Iterable[float], candidate_times: Iterable[float],
               level: float = 0.95) -> tuple[float, float | None, float | None]:
    """(speedup, low, high): geomean(baseline) / geomean(candidate), the ratio of geometric
    means, and its ``level`` confidence interval.

    The interval is Welch's t-interval for the difference of the mean log times (baseline
    minus candidate; unequal variances, Welch-Satterthwaite degrees of freedom), exponentiated.
    low and high are None with fewer than two times on either side; both equal the speedup
    when neither side varies.  ValueError when a side has no times or a time is not positive.
    """
    lb, lc = _logs(baseline_times), _logs(candidate_times)
    if not lb or not lc:
        raise ValueError("no times")
    mb, mc = math.fsum(lb) / len(lb), math.fsum(lc) / len(lc)
    diff = mb - mc
    speedup = math.exp(diff)
    if len(lb) < 2 or len(lc) < 2:
        return speedup, None, None
    vb = _mean_and_var(lb)[1] / len(lb)  # squared standard errors of the two means
    vc = _mean_and_var(lc)[1] / len(lc)
    se2 = vb + vc
    if se2 == 0.0:
        return speedup, speedup, speedup
    df = se2 ** 2 / (vb ** 2 / (len(lb) - 1) + vc ** 2 / (len(lc) - 1))
    half = t_quantile(df, level) * math.sqrt(se2)
    return speedup, math.exp(diff - half), math.exp(diff + half)


def paired_speedup_ci(reference_times: Sequence[float], candidate_times: Sequence[float],
                      level: float = 0.95) -> tuple[float, float | None, float | None]:
    """(speedup, low, high) of runs measured in pairs: reference_times[i] and
    candidate_times[i] ran back to back on one worker CPU.

    The speedup is geomean(reference) / geomean(candidate), as ``speedup_ci``'s, which for
    pairs is the exponential of the mean log ratio log(reference_i / candidate_i); its
    interval is the t-interval of that mean (n - 1 degrees of freedom), exponentiated.  Pairing
    cancels what the two runs of a pair share (the CPU's speed at that moment, a neighbour's
    load), which Welch's interval over unpaired runs counts as noise.  low and high are None
    with fewer than two pairs, and equal the speedup when no ratio varies.
    """
    if len(reference_times) != len(candidate_times):
        raise ValueError(f"{len(reference_times)} reference times for "
                         f"{len(candidate_times)} candidate times: not pairs")
    ratios = [r - c for r, c in zip(_logs(reference_times), _logs(candidate_times))]
    if not ratios:
        raise ValueError("no pairs")
    if len(ratios) < 2:
        return math.exp(ratios[0]), None, None
    m, var = _mean_and_var(ratios)
    if var == 0.0:
        return math.exp(m), math.exp(m), math.exp(m)
    half = t_quantile(len(ratios) - 1, level) * math.sqrt(var / len(ratios))
    return math.exp(m), math.exp(m - half), math.exp(m + half)


def geomean_speedup_ci(speedups: Sequence[tuple[float, float, float]], level: float = 0.95
                       ) -> tuple[float, float, float]:
    """(geometric mean, low, high) of several benchmarks' speedups, each given with its own
    interval (``paired_speedup_ci``'s, at the same ``level``).

    The geometric mean is the exponential of the mean log speedup.  Its interval counts the
    measurement uncertainty of each speedup, not the choice of benchmarks: each log speedup's
    standard error is read back from its interval (half its log width over the normal
    quantile), the mean's is the root of their summed squares over n, and the interval is the
    mean plus or minus the normal quantile times that, exponentiated."""
    if not speedups:
        raise ValueError("no speedups")
    from scipy.special import ndtri  # the normal quantile; first use only
    z = float(ndtri(0.5 + level / 2))
    logs = [math.log(s) for s, _, _ in speedups]
    ses = [(math.log(high) - math.log(low)) / (2 * z) for _, low, high in speedups]
    mean = sum(logs) / len(logs)
    se = math.sqrt(sum(x * x for x in ses)) / len(logs)
    return math.exp(mean), math.exp(mean - z * se), math.exp(mean + z * se)


def relative_half_width(speedup: float, low: float | None, high: float | None) -> float:
    """How far the interval reaches from the speedup, relative to it (0.01: within 1%);
    infinite without an interval."""
    if low is None or high is None:
        return math.inf
    return max(high / speedup - 1.0, 1.0 - low / speedup)
