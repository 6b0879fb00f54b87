"""The simulation's ground truth, for benches that score the search and the labels against it
(``bench/search_truth``, docs/simulation.md): when a search chain's best held a planted
effect, and how well labels name the planted decisions.

Pure: the journal's events, trees and labels come in; nothing is read here.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Optional

from dispatcher.core.records import Candidate, ConfirmEvent, StepEvent
from dispatcher.core.tree import Tree
from dispatcher.running.simulated.model import Effect

INLINE_LABELS = ("inline", "dont_inline")  # a label that decides; anything else: default


def taken(tree: Tree) -> dict[tuple[str, int, str], str]:
    """(unit, round, key) -> action of every call of ``tree``: what an effect is held in."""
    return {(u, r, k): a for u, r, k, a in tree.decisions()}


def holds(effect: Effect, tree: Tree) -> bool:
    """Whether ``tree`` takes ``effect``'s decision and every decision it requires."""
    return effect.holds(taken(tree))


@dataclass(frozen=True)
class Found:
    """What one chain's journal says of a planted effect.

    ``proposed``: the first step one of whose candidates held it (the search drew it);
    ``best``: the first step whose best candidate held it with an interval wholly above 1
    (the search found it, measurably); ``final``: the last step's best holds it;
    ``confirmed``: the chain's confirmation (fresh pairs of its best) lies above 1 and that
    best holds it (None: no confirmation was journaled); ``steps``: steps journaled;
    ``pairs``: the candidates' pairs over those steps, ``pairs_to_best``: up to ``best``'s
    step (the worker time the search spent to find it, in pairs)."""

    proposed: Optional[int]
    best: Optional[int]
    final: bool
    confirmed: Optional[bool]
    steps: int
    pairs: int = 0
    pairs_to_best: Optional[int] = None


def significant(c: Candidate | ConfirmEvent) -> bool:
    """An interval wholly above 1 (faster than the heuristic, measurably)."""
    return c.ci95 is not None and c.ci95[0] > 1.0


def found(events: Iterable[object], holds_in: Callable[[str], bool]) -> Found:
    """``Found`` from a chain's journal events; ``holds_in(dir)``: whether the candidate
    in that rundir directory holds the effect (called once per directory at most)."""
    seen: dict[str, bool] = {}

    def held(d: str) -> bool:
        if d not in seen:
            seen[d] = holds_in(d)
        return seen[d]

    by_dir: dict[str, Candidate] = {}
    proposed = best = pairs_to_best = None
    last: StepEvent | None = None
    confirmed: Optional[bool] = None
    pairs = 0
    for e in events:
        if isinstance(e, StepEvent):
            last = e
            for c in e.candidates:
                by_dir[c.dir] = c
                pairs += len(c.times)
                if proposed is None and c.sha256 is not None and held(c.dir):
                    proposed = e.step
            b = by_dir.get(e.best.dir)
            if best is None and b is not None and significant(b) and held(b.dir):
                best, pairs_to_best = e.step, pairs
        elif isinstance(e, ConfirmEvent):
            confirmed = significant(e) and e.dir in by_dir and held(e.dir)
    final = last is not None and last.best.dir in by_dir and held(last.best.dir)
    return Found(proposed, best, final, confirmed, 0 if last is None else last.step, pairs,
                 pairs_to_best)


# --------------------------------------------------------------------------- labels

Site = tuple[str, int, str]  # unit, round, key


@dataclass(frozen=True)
class LabelScore:
    """Labels against the planted decisions.

    ``planted``: decisions that matter (each effect's own and those it requires);
    ``recalled``: of them, labelled with their planted action; ``reversed``: labelled with the
    other one; ``labelled``: sites a label decides (``inline`` or ``dont_inline``);
    ``correct``: of them, a planted decision's site with its action."""

    planted: int = 0
    recalled: int = 0
    reversed: int = 0
    labelled: int = 0
    correct: int = 0

    @property
    def recall(self) -> float | None:
        return self.recalled / self.planted if self.planted else None

    @property
    def precision(self) -> float | None:
        return self.correct / self.labelled if self.labelled else None

    def __add__(self, other: LabelScore) -> LabelScore:
        return LabelScore(self.planted + other.planted, self.recalled + other.recalled,
                          self.reversed + other.reversed, self.labelled + other.labelled,
                          self.correct + other.correct)


def planted_decisions(effects: Sequence[Effect]) -> dict[Site, str]:
    """Site -> planted action of every decision that matters: each effect's own and each
    one it requires (without it the effect is lost)."""
    out: dict[Site, str] = {}
    for e in effects:
        for c in (e.when, *e.requires):
            out[(c.unit, c.round, c.key)] = c.action
    return out


def score_labels(labels: Mapping[Site, str], effects: Sequence[Effect]) -> LabelScore:
    """How ``labels`` (site -> ``inline``, ``dont_inline`` or ``default``, as
    ``analysis.label_training.label_sites`` gives them) name ``effects``' decisions."""
    truth = planted_decisions(effects)
    recalled = sum(labels.get(s) == a for s, a in truth.items())
    reversed_ = sum(labels.get(s) in INLINE_LABELS and labels.get(s) != a
                    for s, a in truth.items())
    decided = {s: a for s, a in labels.items() if a in INLINE_LABELS}
    correct = sum(truth.get(s) == a for s, a in decided.items())
    return LabelScore(planted=len(truth), recalled=recalled, reversed=reversed_,
                      labelled=len(decided), correct=correct)

