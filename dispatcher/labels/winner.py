"""Which tree ``measure-sites`` attributes, and which of its decisions: a search's confirmed
best, where it differs from the heuristic's build."""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from dispatcher.core.decisions import Override
from dispatcher.core.records import (
    ConfirmEvent,
    FinishEvent,
    RecordError,
    StepEvent,
    read_experiment,
)
from dispatcher.core.rundir import EXPERIMENT, RundirError, read_journal
from dispatcher.core.site_records import SiteDecision, WinnerChoice
from dispatcher.core.tree import DONT_INLINE, Tree, flip


def confirmed_winner(rundirs: Iterable[Path]) -> WinnerChoice | None:
    """The best tree the searches of ``rundirs`` confirmed faster than the heuristic: the
    highest confirmed speedup whose interval lies above 1 (None: none did).  A confirmation
    is fresh pairs of the search's best against the heuristic build (docs/measurement.md),
    not the maximum of the noisy estimates the search compared along the way.

    A search stopped before its end (a budget, Ctrl-C) has no confirmation.  Only where no
    search of the benchmark confirmed anything, such a search's best so far is taken when
    its own pairs put it above 1, marked ``confirmed: false``: the attribution's first test
    measures it again on fresh pairs against the heuristic and attributes nothing unless
    that interval lies above 1 (docs/labels.md), so it serves as the confirmation."""
    confirmed: WinnerChoice | None = None
    unconfirmed: WinnerChoice | None = None
    for rundir in rundirs:
        try:
            events = read_journal(rundir / "journal.jsonl")
        except (RundirError, OSError) as exc:
            raise RundirError(f"{rundir}: cannot read its journal ({exc})") from None
        for e in events:
            if isinstance(e, ConfirmEvent) and e.significant and e.speedup is not None \
                    and e.speedup > 1.0 and e.ci95 is not None and e.ci95[0] > 1.0 \
                    and (confirmed is None or e.speedup > (confirmed.speedup or 0.0)):
                confirmed = WinnerChoice(rundir=str(rundir.resolve()), dir=e.dir,
                                         speedup=e.speedup, ci95=e.ci95)
        so_far = best_so_far(rundir, events)
        if so_far is not None and (unconfirmed is None
                                   or (so_far.speedup or 0.0) > (unconfirmed.speedup or 0.0)):
            unconfirmed = so_far
    return confirmed or unconfirmed


def best_so_far(rundir: Path, events: Sequence[object]) -> WinnerChoice | None:
    """The best candidate of a search that ended without its confirmation (stopped, not
    finished, or finished without confirming), where the pairs it was judged on put its
    interval wholly above 1; None otherwise."""
    if any(isinstance(e, ConfirmEvent) for e in events):
        return None
    if any(isinstance(e, FinishEvent) and e.reason == "completed" for e in events):
        return None  # it ended as planned: no confirmation means it had none to make
    steps = [e for e in events if isinstance(e, StepEvent)]
    if not steps or steps[-1].best.step == 0:
        return None
    best = steps[-1].best
    for e in steps:
        if e.step != best.step:
            continue
        for c in e.candidates:
            if c.candidate == best.candidate and c.dir == best.dir and c.speedup is not None \
                    and c.speedup > 1.0 and c.ci95 is not None and c.ci95[0] > 1.0:
                return WinnerChoice(rundir=str(rundir.resolve()), dir=c.dir,
                                    speedup=c.speedup, ci95=c.ci95, confirmed=False)
    return None


def search_compiler(rundir: Path) -> str | None:
    """The compiler identity a search rundir recorded (None: an old one that did not)."""
    try:
        return read_experiment(rundir / EXPERIMENT).compiler
    except RecordError as exc:
        raise RundirError(str(exc)) from None


def winner_decisions(heuristic: Tree, winner: Tree) -> list[SiteDecision]:
    """The decisions the winner's search forced (reason ``override``) that the heuristic
    did not take: another action at the same site, or a site only the winner has (in a body
    it inlined and the heuristic did not).  Decisions the compiler took by itself in the
    winner's build (its heuristic, in new bodies) are consequences, not choices."""
    out = []
    for unit, round_, node in winner.calls():
        if node.reason != "override" or node.action is None:
            continue
        theirs = heuristic.find(unit, round_, node.key)
        if theirs is not None and theirs.action == node.action:
            continue
        out.append(SiteDecision(unit=unit, round=round_, key=node.key, callee=node.name,
                                action=node.action,
                                heuristic=None if theirs is None else theirs.action))
    return out


def tree_with(heuristic: Tree, decisions: Sequence[SiteDecision]) -> list[Override]:
    """Overrides taking ``decisions`` and leaving every other site to the heuristic.

    Only the decisions are pinned: pinning the rest of the heuristic's tree as well does not
    give the heuristic's build back (the later rounds decide otherwise: kahan, lu and
    float_functor each built another binary), so a flip measured that way would carry that
    difference too.  A ``dont_inline`` decision is pinned in the unit's later rounds as well
    (as ``to_overrides`` does), or a later round could inline the call after all."""
    last = {unit: max(heuristic.rounds(unit)) for unit in heuristic.units()}
    pins: dict[tuple[str, int, str], Override] = {}
    for d in decisions:
        pins[(d.unit, d.round, d.key)] = Override(d.unit, d.round, d.key, d.action)
        if d.action == DONT_INLINE:
            for later in range(d.round + 1, last.get(d.unit, d.round) + 1):
                pins.setdefault((d.unit, later, d.key),
                                Override(d.unit, later, d.key, DONT_INLINE))
    return sorted(pins.values())


def reverted(d: SiteDecision) -> SiteDecision:
    """``d`` set back to what the heuristic did there (the action a "removed" label tests);
    a site the heuristic's tree lacks gets the opposite of the winner's action."""
    action = d.heuristic if d.heuristic is not None else flip(d.action)
    return d.model_copy(update={"action": action, "heuristic": d.heuristic})


def flipped(unit: str, round_: int, key: str, callee: str, action: str) -> SiteDecision:
    """A site of the heuristic's tree with its action flipped (a sweep's label)."""
    return SiteDecision(unit=unit, round=round_, key=key, callee=callee, action=flip(action),
                        heuristic=action)

