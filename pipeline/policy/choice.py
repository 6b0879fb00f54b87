"""Which kind of policy to keep, by measurement (issue 35, item 4): pure functions, no I/O.

``select-policy`` (``pipeline.policy.choosing``) makes each kind of policy -- the searched
policy, the classifier trained on labels, and the search started from the classifier -- once
per fold of the training split, each time from the other folds' programs only, and measures
it on the fold's programs, which it never saw.  Every training program is held out exactly
once, so each kind has one counted figure per program.  The rule (docs/policies.md,
"Choosing the kind of policy"):

1. A program's counted figure is its speedup over the heuristic, or the heuristic's own, 1,
   where the policy's build failed or went past a cost guard (as every evaluation counts it).
2. A kind's figure is the geometric mean of its counted figures over every training program;
   its worst fold is the lowest geometric mean over one fold's programs.
3. The gate of a fold is what the heuristic measured against itself (A/A) shows on that fold:
   the geometric mean of the A/A comparisons' lower bounds over its programs (1 exactly in an
   exact metric, whose A/A has no noise).  A kind whose worst fold is below its fold's gate
   could lose on programs it never saw by more than noise: it is not kept.
4. A kind that ships the heuristic's own binary for every training program (its policy built
   the same bytes, or its build fell back to the heuristic's) is refused: it is the heuristic
   under another name (the first campaign's kept policy was, on 22 of 24 programs).
5. Of the kinds left, the one with the best figure is kept (ties: the order asked); none left:
   nothing is kept, and the heuristic stays.

A kind that cannot be made from some fold's training programs (their labels have one class
only, or give no linear start; a study with no complete trial) has no figure and is refused
with the reason: it could not be made for programs like that fold's.  The other kinds are
still compared.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dispatcher.core.stats import geomean

#: The kinds of policy compared, in the order a tie keeps them.
KINDS = ("searched", "classifier", "combined")


class ChoiceError(ValueError):
    """Folds that cannot be made or judged: one line."""


def fold_groups(names: Sequence[str], folds: int) -> list[tuple[str, ...]]:
    """The training programs dealt into ``folds`` groups in name order (program i to group
    i mod folds): the same names always give the same folds, and the groups differ in size
    by at most one."""
    ordered = sorted(set(names))
    if folds < 2:
        raise ChoiceError(f"--folds {folds}: expected at least 2 (a fold is held out of "
                          "what the others train)")
    if len(ordered) < folds:
        raise ChoiceError(f"{folds} folds of {len(ordered)} program(s): expected at least "
                          "one program per fold")
    return [tuple(ordered[i::folds]) for i in range(folds)]


@dataclass(frozen=True)
class HeldOut:
    """One program measured with a kind's policy of the fold that held it out: ``counted``
    is its speedup, or 1 (the heuristic's build shipped) where ``fallback`` says why not;
    ``same_binary``: the policy built the heuristic's own binary."""

    program: str
    fold: int
    speedup: float | None
    low: float | None
    high: float | None
    size_ratio: float | None
    fallback: str | None
    same_binary: bool

    @property
    def counted(self) -> float:
        if self.fallback is not None or self.speedup is None:
            return 1.0
        return self.speedup


@dataclass(frozen=True)
class KindResult:
    """One kind judged by the rule: its figure, its worst fold against that fold's gate, and
    why it is not eligible (None: it is)."""

    kind: str
    figure: float | None  # None: not made on some fold (``unmade``)
    fold_figures: tuple[float, ...]
    worst_fold: int
    gate: float
    refused: str | None

    @property
    def eligible(self) -> bool:
        return self.refused is None


@dataclass(frozen=True)
class Choice:
    """Every kind judged, and the one kept (None: none passed; the heuristic stays)."""

    results: tuple[KindResult, ...]
    kept: str | None


def aa_gates(aa_low: Mapping[str, float], groups: Sequence[Sequence[str]]) -> list[float]:
    """Each fold's gate: the geometric mean of its programs' A/A lower bounds (``aa_low``:
    the heuristic against itself, per program; a bound above 1 counts as 1: the gate never
    asks a policy to beat the heuristic)."""
    gates = []
    for i, group in enumerate(groups):
        missing = [p for p in group if p not in aa_low]
        if missing:
            raise ChoiceError(f"fold {i}: no A/A figure for {', '.join(missing)}")
        lows = [min(1.0, aa_low[p]) for p in group]
        if any(not (math.isfinite(x) and x > 0) for x in lows):
            raise ChoiceError(f"fold {i}: an A/A lower bound that is not a positive number")
        gates.append(geomean(lows))
    return gates


def judge(kind: str, held: Sequence[HeldOut], groups: Sequence[Sequence[str]],
          gates: Sequence[float]) -> KindResult:
    """One kind by rules 1-4 (``held``: its figure on every training program)."""
    by_program = {h.program: h for h in held}
    wanted = [p for g in groups for p in g]
    missing = [p for p in wanted if p not in by_program]
    if missing:
        raise ChoiceError(f"{kind}: no figure for {', '.join(missing)}")
    figure = geomean([by_program[p].counted for p in wanted])
    folds = tuple(geomean([by_program[p].counted for p in g]) for g in groups)
    margins = [f / gate for f, gate in zip(folds, gates)]
    worst = min(range(len(folds)), key=lambda i: (margins[i], i))
    refused = None
    if all(by_program[p].same_binary or by_program[p].fallback is not None for p in wanted):
        refused = "the heuristic's own binary on every training program"
    elif folds[worst] < gates[worst]:
        refused = (f"fold {worst} ({', '.join(groups[worst])}) at {folds[worst]:.4f}, below "
                   f"its A/A gate {gates[worst]:.4f}")
    return KindResult(kind, figure, folds, worst, gates[worst], refused)


def unmade(kind: str, fold: int, gate: float, why: str) -> KindResult:
    """A kind that could not be made from fold ``fold``'s training programs: no figure, and
    refused with ``why``."""
    return KindResult(kind, None, (), fold, gate, f"not made for fold {fold}: {why}")


def choose(results: Sequence[KindResult]) -> Choice:
    """Rule 5: the eligible kind with the best figure (ties: the first given)."""
    eligible = [r for r in results if r.eligible and r.figure is not None]
    kept = max(eligible, key=lambda r: r.figure or 0.0) if eligible else None
    return Choice(tuple(results), None if kept is None else kept.kind)
