"""Estimated cycles: one number from cachegrind's counts, the exact metric's figure.

Cachegrind counts instructions (``Ir``), simulated cache misses at the first level (``I1mr``,
``D1mr``, ``D1mw``) and the last level (``ILmr``, ``DLmr``, ``DLmw``) and mispredicted
conditional (``Bcm``) and indirect (``Bim``) branches.  A cycle estimate charges each event
its typical cost on an out-of-order x86-64 core, one cycle per instruction:

    cycles = Ir + l1 * (I1mr + D1mr + D1mw) + ll * (ILmr + DLmr + DLmw)
                + branch * Bcm + indirect * Bim

The default weights (``DEFAULT``) are the usual round figures (an L2 hit about 10 cycles, a
memory access about 100, a mispredicted branch about 15-20: the costs KCachegrind's estimate
and the optimisation manuals use), not fitted to this project's programs yet: measuring how
well they track wall time and refitting them on the training programs is issue 34's item 5
(not written yet; ``bench/tiny_agreement`` checks only that tiny and quick sizes agree).  The
model is part of a figure's identity: a table in cycles names its weights.

Counts are exact for a binary, its arguments and environment (``workers/agent/cachegrind``),
so a ratio of two estimates has no sampling interval.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

EVENTS = ("Ir", "I1mr", "ILmr", "Dr", "D1mr", "DLmr", "Dw", "D1mw", "DLmw",
          "Bc", "Bcm", "Bi", "Bim")


@dataclass(frozen=True)
class CycleModel:
    """The weights of the estimate (cycles per event beyond the instruction's own one)."""

    l1: float = 10.0
    ll: float = 100.0
    branch: float = 15.0
    indirect: float = 20.0

    def cycles(self, counts: Mapping[str, int]) -> float:
        """Estimated cycles of one run; KeyError names a count that is missing."""
        return (counts["Ir"]
                + self.l1 * (counts["I1mr"] + counts["D1mr"] + counts["D1mw"])
                + self.ll * (counts["ILmr"] + counts["DLmr"] + counts["DLmw"])
                + self.branch * counts["Bcm"] + self.indirect * counts["Bim"])

    def name(self) -> str:
        """The weights, as a table's caption names them."""
        return (f"cycles(l1={self.l1:g}, ll={self.ll:g}, branch={self.branch:g}, "
                f"indirect={self.indirect:g})")


DEFAULT = CycleModel()


def metric_value(metric: str, counts: Mapping[str, int], model: CycleModel = DEFAULT) -> float:
    """The figure of an exact metric: ``instructions`` (Ir) or ``cycles`` (the estimate)."""
    if metric == "instructions":
        return float(counts["Ir"])
    if metric == "cycles":
        return model.cycles(counts)
    raise ValueError(f"not an exact metric: {metric!r} (instructions or cycles)")
