"""Search rules as pure functions: temperature schedule, Metropolis acceptance, proposals.
The driver (``dispatcher.experiment``) does the I/O around them; energies come from paired
comparisons (``dispatcher.measure``), their statistics from ``dispatcher.stats``.
"""
from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Optional

from dispatcher.profile import focus_weights, site_samples
from dispatcher.records import HotFunctions
from dispatcher.tree import Located, Tree, backtrack, backtrackable, flip_leaves, flippable


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


def propose(tree: Tree, rng: random.Random, max_flips: int = 2,
            backtrack_probability: float = 0.2,
            hot: HotFunctions | None = None) -> tuple[Tree, str]:
    """A mutation of ``tree``: flip 1..max_flips leaves, or sometimes undo an inlining.

    ``hot`` (where the baseline spent its time): flips favour leaves in code that ran
    (``dispatcher.profile.focus_weights``); None or a failed profile: every leaf alike.
    Draws from ``rng`` in a fixed pattern for a given tree and profile, so proposals replay
    exactly.
    """
    can_backtrack = bool(backtrackable(tree))
    leaves = len(flippable(tree))
    choice = rng.random()
    if can_backtrack and (choice < backtrack_probability or leaves == 0):
        return backtrack(tree, rng), "backtrack"
    if leaves == 0:
        return tree, "none (nothing to mutate)"
    k = rng.randint(1, min(max_flips, leaves))
    return flip_leaves(tree, k, rng, weights=focus(hot)), f"flip {k}"


Weights = Callable[[list[Located]], Optional[Sequence[float]]]


def focus(hot: HotFunctions | None) -> Weights | None:
    """The leaf weighting of ``propose`` for profile ``hot`` (None: every leaf alike)."""
    if hot is None or hot.error is not None or not hot.functions:
        return None
    profile = hot

    def weights(pool: list[Located]) -> Sequence[float] | None:
        return focus_weights(site_samples(pool, profile))
    return weights
