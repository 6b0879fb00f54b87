"""One measured figure: a build against its reference, and the one way it is written.

Every table, progress line and CSV that reports "how much faster" goes through ``Figure`` and
``format_speedup``, so a speedup means the same thing and reads the same everywhere:
reference time / build time (above 1: the build is faster), with its 95% interval
(``dispatcher.core.stats``) and the metric it was measured in.
"""
from __future__ import annotations

from dataclasses import dataclass

METRICS = ("time",)  # what a figure can be measured in (docs/measurement.md)


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
