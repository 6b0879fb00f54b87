"""Which classifier ``train-policy --validate measured`` keeps, and the gate it must pass.

Each leave-one-benchmark-out fold's policy is measured on the benchmark it never saw
(``FoldMeasure``); a classifier is judged by its worst such fold, because one held-out
benchmark where its answers cost everything (docs/policies.md, "lu") is what a user would meet.
The campaign imports ``GATE`` and ``EXIT_GATE`` from here: they are this rule's numbers.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dispatcher.core.figures import Figure, geomean_figure

GATE = 0.95  # the worst held-out measured speedup a kept policy may have
EXIT_GATE = 3  # train-policy's exit status when the kept policy fails the gate


@dataclass(frozen=True)
class FoldMeasure:
    """One fold's policy measured on its held-out benchmark against the heuristic: its
    ``figure`` (speedup = heuristic time / policy time), or why there is none; ``fallback``:
    why its build is past the cost guards (``dispatcher.core.guards``), so the held-out
    program is judged at the heuristic's figure, 1, whatever was measured."""

    classifier: str
    held_out: str
    policy: Path
    figure: Figure
    fallback: str | None = None

    @property
    def judged(self) -> Figure:
        """The figure the gate and the choice judge: the heuristic's past the guards."""
        if self.fallback is None:
            return self.figure
        return Figure(1.0, 1.0, 1.0, 0, 1.0, metric=self.figure.metric)

    @property
    def measured(self) -> bool:
        return self.judged.ok

    @property
    def speedup(self) -> float | None:
        return self.judged.speedup

    def text(self) -> str:
        """The figure as the report writes it, or why there is none."""
        if self.fallback is not None:
            return f"{self.judged.text()} ({self.fallback}: counted at the heuristic's figure)"
        return self.figure.text(missing=f"not measured ({self.figure.error})")


def worst(measures: Sequence[FoldMeasure]) -> FoldMeasure | None:
    """The fold with the lowest measured speedup; None when any fold is not measured (a
    policy whose worst case is unknown has no worst case to compare)."""
    if not measures or not all(m.measured for m in measures):
        return None
    return min(measures, key=lambda m: (m.speedup, m.held_out))


def choose_measured(measures: Sequence[FoldMeasure], classifiers: Sequence[str]
                    ) -> str | None:
    """The classifier whose worst held-out measured speedup is best (the first given on a
    tie); only classifiers with every fold measured compete.  None when none has."""
    best: tuple[float, str] | None = None
    for name in classifiers:
        w = worst([m for m in measures if m.classifier == name])
        if w is not None and w.speedup is not None and (best is None or w.speedup > best[0]):
            best = (w.speedup, name)
    return best[1] if best else None


def geomean_text(measures: Sequence[FoldMeasure]) -> str:
    """The geometric mean of measured speedups with its interval, as run-plugin-benchmark
    reports a split's; ``-`` unless every fold is measured."""
    g = geomean_figure(m.judged for m in measures)
    return g.text() if g is not None else "-"


def gate_line(chosen: str, measures: Sequence[FoldMeasure], gate: float = GATE
              ) -> tuple[bool, str]:
    """(passed, the one line that says so) for the kept classifier's folds."""
    w = worst([m for m in measures if m.classifier == chosen])
    if w is None:
        missing = ", ".join(m.held_out for m in measures
                            if m.classifier == chosen and not m.measured) or "no fold"
        return False, (f"FAIL: {chosen} has no measured worst held-out speedup (not "
                       f"measured: {missing}); the gate needs every fold measured")
    assert w.speedup is not None
    if w.speedup < gate:
        return False, (f"FAIL: {chosen}'s worst held-out measured speedup {w.text()} "
                       f"({w.held_out}) is below the gate {gate:.2f}")
    return True, (f"PASS: {chosen}'s worst held-out measured speedup {w.text()} "
                  f"({w.held_out}) is at or above the gate {gate:.2f}")
