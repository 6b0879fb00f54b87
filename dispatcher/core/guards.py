"""The cost guards of a build evaluated against the heuristic's (issue 35): a policy a user
would ship must not compile much longer or grow the binary much, so a build past either limit
is counted at the heuristic's figure (the program falls back to the heuristic's decisions),
exactly as a build that fails is (``dispatcher.baselines.table_cells``).

Compile time is the CPU time (user + system) of the compiler processes the build is made of,
as recorded when each was compiled (``dispatcher.build.driver.BuildResult.cpu_s``): unlike
wall time it does not grow with the machine's load or shrink with a warm unit cache, and a
cached build keeps its figure, so a rerun judges the same ratio.  The rule here is pure.
"""
from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_COMPILE_RATIO = 2.0
DEFAULT_MAX_SIZE_RATIO = 1.5


@dataclass(frozen=True)
class CostGuard:
    """The limits, as ratios to the heuristic's build of the same program (config
    ``policy.max_compile_ratio``, ``policy.max_size_ratio``)."""

    max_compile_ratio: float = DEFAULT_MAX_COMPILE_RATIO
    max_size_ratio: float = DEFAULT_MAX_SIZE_RATIO


def over_guard(compile_ratio: float | None, size_ratio: float | None,
               guard: CostGuard | None) -> str | None:
    """Why a build is past the guard, in a few words naming the ratio and its limit (None:
    within it, no guard, or ratios not known: a build whose compile time was not recorded is
    judged on its size alone).  Compile time first: it is the first one a user meets."""
    if guard is None:
        return None
    if compile_ratio is not None and compile_ratio > guard.max_compile_ratio:
        return (f"compile time {compile_ratio:.3f}x the heuristic's, over the limit "
                f"{guard.max_compile_ratio:g}x (policy.max_compile_ratio)")
    if size_ratio is not None and size_ratio > guard.max_size_ratio:
        return (f"binary size {size_ratio:.3f}x the heuristic's, over the limit "
                f"{guard.max_size_ratio:g}x (policy.max_size_ratio)")
    return None
