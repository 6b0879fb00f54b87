"""Search rules as pure functions: temperature schedule, Metropolis acceptance, energies,
proposals.  The driver (``dispatcher.experiment``) does the I/O around them.
"""
from __future__ import annotations

import math
import random
import statistics
from typing import Sequence

from dispatcher.tree import Tree, backtrack, backtrackable, flip_leaves, flippable

# Two-sided 95% quantiles of Student's t, by degrees of freedom (1..30); 1.96 beyond.
_T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
        2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def t95(df: int) -> float:
    return _T95[df - 1] if 1 <= df <= len(_T95) else 1.96


def temperature(step: int, steps: int, t_start: float, t_end: float) -> float:
    """Exponential schedule: t_start at step 1, t_end at the last step."""
    if steps <= 1:
        return t_start
    return t_start * (t_end / t_start) ** ((step - 1) / (steps - 1))


def metropolis(current: float, proposed: float, temp: float, u: float) -> bool:
    """Accept a better proposal always, a worse one with probability exp(-dE/T).

    ``u`` is a uniform draw the caller always takes, accepted or not, so the RNG stream does
    not depend on the energies' order and a resumed run draws the same numbers.
    """
    if proposed <= current:
        return True
    if temp <= 0:
        return False
    return u < math.exp(-(proposed - current) / temp)


def geomean(times: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(t) for t in times))


def geomean_ci95(times: Sequence[float]) -> tuple[float, float]:
    """95% interval of the geometric mean: a t-interval on log times."""
    logs = [math.log(t) for t in times]
    if len(logs) < 2:
        return (math.exp(logs[0]),) * 2 if logs else (math.nan, math.nan)
    m = statistics.fmean(logs)
    half = t95(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(m - half), math.exp(m + half)


def energy(times: Sequence[float], baseline_geomean: float) -> float | None:
    """Geometric mean run time relative to the baseline's (lower is better); None: no data."""
    return geomean(times) / baseline_geomean if times else None


def propose(tree: Tree, rng: random.Random, max_flips: int = 2,
            backtrack_probability: float = 0.2) -> tuple[Tree, str]:
    """A mutation of ``tree``: flip 1..max_flips leaves, or sometimes undo an inlining.

    Draws from ``rng`` in a fixed pattern for a given tree, so proposals replay exactly.
    """
    can_backtrack = bool(backtrackable(tree))
    leaves = len(flippable(tree))
    choice = rng.random()
    if can_backtrack and (choice < backtrack_probability or leaves == 0):
        return backtrack(tree, rng), "backtrack"
    if leaves == 0:
        return tree, "none (nothing to mutate)"
    k = rng.randint(1, min(max_flips, leaves))
    return flip_leaves(tree, k, rng), f"flip {k}"
