"""Search rules as pure functions: temperature schedule, Metropolis acceptance, proposals,
and the bookkeeping of the asynchronous search (how many candidates a chain keeps in flight,
how a landed one is judged, which journaled proposals a resume must measure again).
The driver (``dispatcher.search.chain``) does the I/O around them; energies come from paired
comparisons (``dispatcher.running.measurement``), their statistics from ``dispatcher.core.stats``.
"""
from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Optional

from dispatcher.core.records import Candidate, HotFunctions, Pointer, ProposeEvent, StepEvent
from dispatcher.core.tree import Located, Tree, backtrack, backtrackable, flip_leaves, flippable
from dispatcher.search.focus import focus_weights, site_samples


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
    (``dispatcher.search.focus.focus_weights``); None or a failed profile: every leaf alike.
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


# --------------------------------------------------------------------------- asynchronous search

def in_flight_share(slots: int, chains: int, exact: bool = False) -> int:
    """Candidates one of ``chains`` chains keeps in flight on ``slots`` worker slots: its
    share of the slots, so that each slot has a comparison, and one more, compiled while the
    others are measured, to take the first slot that frees (a slot never waits on a
    compile).  In an ``exact`` metric a comparison is one count, about four times a
    compile (2.2 s median count at tiny, results/metric-agreement; 0.58 s mean compile of a
    search candidate, results/compile-times), so a quarter of the share more is compiling
    at any time (at 256 slots, 23 chains: 81% of the bound with 13 in flight, 87-91% with
    17; docs/simulation.md).  More would only draw proposals from older incumbents."""
    share = max(1, math.ceil(slots / max(chains, 1)))
    return share + (math.ceil(share / 4) if exact else 0) + 1


def proposal_rng(seed: int, proposal: int) -> random.Random:
    """The stream proposal ``proposal`` of the chain seeded ``seed`` draws from (its tree, then
    its Metropolis draw).  One stream per proposal: a proposal's draws do not depend on how
    many the tree before it took, nor on the order candidates landed in, and a resume needs
    no RNG state to go on."""
    return random.Random(f"inlining-orchestrator proposal {seed} {proposal}")


def accept(algorithm: str, incumbent: float, energy: float | None, temp: float | None,
           u: float) -> bool:
    """Whether a measured candidate replaces the incumbent: SA by the Metropolis rule at
    ``temp``; a random walk moves to every measured candidate; none without an energy."""
    if energy is None:
        return False
    if algorithm != "sa":
        return True
    assert temp is not None
    return metropolis(incumbent, energy, temp, u)


@dataclass(frozen=True)
class Verdict:
    """The search state after judging one landed candidate."""

    accepted: bool
    incumbent: Pointer
    best: Pointer
    current: str | None  # random walk: the last tree it moved to


def judge(algorithm: str, step: int, candidate: Candidate, incumbent: Pointer, best: Pointer,
          current: str | None, temp: float | None, u: float) -> Verdict:
    """Judge ``candidate`` as step ``step``, against the incumbent of the moment it landed
    (not the one it was drawn from): accepted by ``accept``, and the best if it beats it."""
    accepted = accept(algorithm, incumbent.energy, candidate.energy, temp, u)
    if accepted:
        incumbent, current = candidate.pointer(step), candidate.dir
    if candidate.energy is not None and candidate.energy < best.energy:
        best = candidate.pointer(step)
    return Verdict(accepted, incumbent, best, current)


@dataclass(frozen=True)
class Backlog:
    """What a journal says of an asynchronous chain's proposals."""

    pending: tuple[ProposeEvent, ...]  # journaled, not judged: measured (again) on resume
    next_proposal: int  # the number the next one drawn gets


class JournalOrderError(ValueError):
    """A journal whose proposals and judgements do not fit together (one line)."""


def backlog(events: Iterable[object]) -> Backlog:
    """The proposals of a journal no step has judged yet, in the order they were drawn.
    Refuses a journal where a proposal is journaled twice or out of order, or a step judges
    one that was never proposed or was judged already: resuming it would not continue it."""
    proposed: dict[int, ProposeEvent] = {}
    judged: set[int] = set()
    for e in events:
        if isinstance(e, ProposeEvent):
            if e.proposal != len(proposed) + 1:
                raise JournalOrderError(f"proposal {e.proposal} journaled after proposal "
                                        f"{len(proposed)}")
            proposed[e.proposal] = e
        elif isinstance(e, StepEvent) and e.proposal is not None:
            if e.proposal not in proposed:
                raise JournalOrderError(f"step {e.step} judges proposal {e.proposal}, which "
                                        "was never proposed")
            if e.proposal in judged:
                raise JournalOrderError(f"step {e.step} judges proposal {e.proposal} a second "
                                        "time")
            judged.add(e.proposal)
    return Backlog(pending=tuple(e for n, e in proposed.items() if n not in judged),
                   next_proposal=len(proposed) + 1)
