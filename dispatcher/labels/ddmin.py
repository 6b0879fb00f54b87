"""Delta debugging (Zeller and Hildebrandt's ``ddmin``) over a winner's decisions: the
smallest subset found that still passes the test "keeps the gain".

Pure and deterministic: the same answers give the same questions in the same order, which is
what lets a resumed ``measure-sites`` replay its journal (the answers it has) and measure only
the questions it had not reached.  The stopping rules (docs/labels.md):

- the subset is 1-minimal: at the finest granularity (one decision per part) no part and no
  complement passes;
- or the budget of tests is spent: the smallest passing subset so far is kept, and the result
  says so (``stopped == "budget"``).

The whole set is assumed to pass (the caller measured it); the empty set is never tested (it is
the reference itself).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Reduced:
    subset: tuple[int, ...]  # the smallest passing subset found, in the items' order
    tests: int  # distinct subsets tested (answers read back count too)
    stopped: str  # minimal | budget


class _Budget(Exception):
    pass


def split(items: Sequence[int], n: int) -> list[tuple[int, ...]]:
    """``items`` in ``n`` contiguous parts of near-equal size (the larger ones first)."""
    size, extra = divmod(len(items), n)
    parts, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        parts.append(tuple(items[start:end]))
        start = end
    return [p for p in parts if p]


def ddmin(items: Sequence[int], test: Callable[[tuple[int, ...]], bool],
          max_tests: int) -> Reduced:
    """The smallest subset of ``items`` for which ``test`` passes, by ddmin: try each of
    ``n`` parts, then each complement, then twice as many parts; every subset is asked once."""
    answers: dict[tuple[int, ...], bool] = {}

    def passes(subset: tuple[int, ...]) -> bool:
        if subset not in answers:
            if len(answers) >= max_tests:
                raise _Budget
            answers[subset] = test(subset)
        return answers[subset]

    current = tuple(items)
    n = 2
    try:
        while len(current) >= 2:
            parts = split(current, n)
            reduced = next((p for p in parts if passes(p)), None)
            if reduced is not None:
                current, n = reduced, 2
                continue
            if n > 2:  # with two parts the complements are the parts themselves
                complements = [tuple(x for x in current if x not in p) for p in parts]
                reduced = next((c for c in complements if passes(c)), None)
                if reduced is not None:
                    current, n = reduced, max(n - 1, 2)
                    continue
            if n >= len(current):
                break
            n = min(len(current), 2 * n)
    except _Budget:
        return Reduced(current, len(answers), "budget")
    return Reduced(current, len(answers), "minimal")
