"""One measured figure: a build against its reference, and the one way it is written.

Every table, progress line and CSV that reports "how much faster" goes through ``Figure`` and
``format_speedup``, so a speedup means the same thing and reads the same everywhere:
reference time / build time (above 1: the build is faster), with its 95% interval
(``dispatcher.core.stats``) and the metric it was measured in.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from dispatcher.core.stats import geomean_speedup_ci

# What a figure can be measured in (docs/measurement.md): paired wall time, or an exact
# metric from one run of each binary under cachegrind (dispatcher.core.cycles)
METRICS = ("time", "instructions", "cycles")
EXACT_METRICS = ("instructions", "cycles")


def metric_caption(metric: str) -> str:
    """What a table's figures are, in one line: the metric and what its interval means."""
    if metric == "time":
        return "metric: time (wall-clock speedups, paired runs, 95% intervals)"
    what = "instructions executed" if metric == "instructions" else \
        "estimated cycles (dispatcher/core/cycles.py, default weights)"
    return (f"metric: {metric} ({what}, one cachegrind run of each binary: exact counts, so "
            "low = high)")


def format_speedup(speedup: float, low: float | None = None, high: float | None = None) -> str:
    """``1.234 [1.200, 1.260]``; the bare ratio when there is no interval."""
    if low is None or high is None:
        return f"{speedup:.3f}"
    return f"{speedup:.3f} [{low:.3f}, {high:.3f}]"


@dataclass(frozen=True)
class Figure:
    """A build measured against its reference (the heuristic's build unless said otherwise):
    ``speedup`` = reference time / its time with its 95% interval, the pairs behind it, its
    binary size over the reference's; or, with no speedup, ``error``: one line saying why."""

    speedup: float | None = None
    low: float | None = None
    high: float | None = None
    pairs: int = 0
    size_ratio: float | None = None
    error: str | None = None
    compiled: bool = True  # False: the build itself failed (an extreme that does not compile)
    metric: str = "time"
    # its compile's CPU time over the reference's (dispatcher.core.guards; None: not known)
    compile_ratio: float | None = None

    @property
    def ok(self) -> bool:
        """A speedup with its interval."""
        return self.speedup is not None and self.low is not None and self.high is not None

    @property
    def significant(self) -> bool | None:
        """Whether the 95% interval excludes 1 (None without an interval)."""
        if self.low is None or self.high is None:
            return None
        return not self.low <= 1.0 <= self.high

    def text(self, missing: str = "-") -> str:
        """The figure as every table writes it; ``missing`` where there is none."""
        if self.speedup is None:
            return missing
        return format_speedup(self.speedup, self.low, self.high)

    def cell(self) -> str:
        """The figure in a table's cell: ``does not compile`` for a build that failed, ``-``
        for any other figure missing."""
        return self.text("does not compile" if not self.compiled else "-")


def geomean_figure(figures: Iterable[Figure]) -> Figure | None:
    """The geometric mean of several benchmarks' figures with its interval
    (``dispatcher.core.stats.geomean_speedup_ci``), with the fewest pairs among them; None when
    there is none or any has no interval (a mean over fewer benchmarks than asked would compare
    unlike things)."""
    got = list(figures)
    if not got or not all(f.ok for f in got):
        return None
    g, low, high = geomean_speedup_ci([(f.speedup, f.low, f.high)  # type: ignore[misc]
                                       for f in got])
    metrics = {f.metric for f in got}
    return Figure(g, low, high, min(f.pairs for f in got),
                  metric=metrics.pop() if len(metrics) == 1 else "mixed")


def against(a: Figure, b: Figure) -> Figure:
    """``a`` against ``b``, both measured against the same reference: the ratio of their
    speedups (b's time / a's time), its interval from the two (independent comparisons: log
    standard errors added in quadrature).  Not a paired comparison of the two builds."""
    if not (a.ok and b.ok):
        return Figure(error="one of the two has no figure")
    assert a.speedup and a.low and a.high and b.speedup and b.low and b.high
    z = 1.959963984540054
    se = math.hypot(math.log(a.high / a.low) / (2 * z), math.log(b.high / b.low) / (2 * z))
    log_ratio = math.log(a.speedup) - math.log(b.speedup)
    return Figure(math.exp(log_ratio), math.exp(log_ratio - z * se),
                  math.exp(log_ratio + z * se), min(a.pairs, b.pairs),
                  metric=a.metric if a.metric == b.metric else "mixed")
