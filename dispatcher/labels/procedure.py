"""``measure-sites`` for one benchmark: each decision's effect measured directly
(docs/labels.md).

The procedure, in its rundir's journal order:

1. the reference: the heuristic's build (its dumps kept in ``reference/``: the features);
2. attribution of a winner (when a search confirmed one): its decisions where it differs from
   the heuristic; the whole set measured; delta debugging down to a minimal subset that keeps
   ``keep`` of the whole set's log speedup; fresh pairs of both (the share kept); then each
   kept decision labelled alone on the heuristic's tree, removed from the winner, and
   removed from the minimal subset;
3. a sweep: the ``sweep`` hottest flippable sites of the heuristic build (sampled profile),
   each flipped alone;
4. with ``retest``, every measured label measured again, independently (fresh pairs); under
   an exact metric (a rundir recording ``confirm_above``) only the labels whose exact effect
   is at least that, in wall time at ``confirm_size``: their confirmation.

Every measured label also carries its cycles effect (``Paired.cycles``) where the experiment
names a ``cycles_size``: the tested binary and its reference counted once each under cachegrind
at that size (exact, load-independent; the store answers a label's retest and any tree counted
before), so a label kept has its wall effect with its interval beside an exact cycles effect.

Every timed test is a paired comparison by the measurement protocol, spread over every slot of
the class (one part per slot, the parts' pairs pooled), so one label takes the whole machine;
an exact test is one count of each binary on any slot, so under an exact metric several
labellers (one per benchmark, each in its own thread) run at once (``pipeline.sites``).  A
test's outcome is journaled when it completes; a resume replays the procedure and reads back
each answer the journal has, measuring only the rest.  The same tree against the same
reference is measured once: the store answers it again (two contexts may ask for one tree).
"""
from __future__ import annotations

import math
import shutil
import statistics
import threading
from collections.abc import Callable, Sequence
from concurrent import futures
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Optional, TypeVar

from dispatcher.build.driver import BuildInterrupted
from dispatcher.build.manifest import Benchmark
from dispatcher.build.policies import PolicySpec, parse_policy
from dispatcher.build.service import CompileError, CompileJob, CompileResult, CompileService
from dispatcher.core.comparison import Comparison
from dispatcher.core.decisions import Override, override_reach, read_overrides
from dispatcher.core.dump_cache import DUMPS
from dispatcher.core.jobs import RunJob
from dispatcher.core.records import FinishEvent, ResumeEvent
from dispatcher.core.rundir import SitesRundir
from dispatcher.core.site_records import (
    ALWAYS_INLINE,
    REFERENCE_DIR,
    WINNER_DIR,
    Context,
    LabelEvent,
    MinimalEvent,
    Paired,
    ReferenceEvent,
    SiteDecision,
    SubsetEvent,
    WinnerChoice,
    WinnerEvent,
    reference_name,
)
from dispatcher.core.stats import paired_speedup_ci
from dispatcher.core.tree import Tree, flippable, split_key
from dispatcher.labels.ddmin import ddmin
from dispatcher.labels.reference import REFERENCE_TREE, flip_back_sites, flipped_back
from dispatcher.labels.winner import flipped, reverted, tree_with, winner_decisions
from dispatcher.running.agent_client import AgentError
from dispatcher.running.exact import ExactUnavailable, check_workers
from dispatcher.running.measurement import MeasurementService, PairingPolicy, ReferenceFailed
from dispatcher.search.focus import hot_functions_of, profile_job, site_heat
from dispatcher.storage.store import Artifact

T = TypeVar("T")


class Interrupted(Exception):
    pass


@dataclass
class LabelsStatus:
    """What the progress lines show; written by the labeller's thread only."""

    task: str
    rundir: Path
    phase: str = "starting"
    tests: int = 0  # delta-debugging tests answered
    labels: int = 0  # labels journaled
    planned: int = 0  # labels the current phase will journal
    last: str = ""  # the last outcome, in words
    state: str = "running"  # running | finished | failed | interrupted
    error: Optional[str] = None


def describe(outcome: Paired) -> str:
    """An outcome in words: "1.034x [1.021, 1.047], 12 pairs" or its status and why."""
    if outcome.measured:
        assert outcome.speedup is not None
        ci = "" if outcome.ci95 is None else \
            f" [{outcome.ci95[0]:.3f}, {outcome.ci95[1]:.3f}]"
        return f"{outcome.speedup:.3f}x{ci}, {outcome.pairs} pairs"
    return outcome.status.replace("_", " ") + (f" ({outcome.why})" if outcome.why else "")


def log_effect(outcome: Paired) -> tuple[float, float, float] | None:
    """(effect, low, high) in log speedup; None unless measured with an interval."""
    if not outcome.measured or outcome.ci95 is None or outcome.speedup is None:
        return None
    return (math.log(outcome.speedup), math.log(outcome.ci95[0]), math.log(outcome.ci95[1]))


def keeps_gain(outcome: Paired, full_log: float, keep: float) -> bool:
    """A delta-debugging test passes: its speedup's interval lies above 1 and its log
    speedup is at least ``keep`` of the whole set's (docs/labels.md, stopping rules)."""
    effect = log_effect(outcome)
    return effect is not None and effect[1] > 0.0 and effect[0] >= keep * full_log


@dataclass
class SiteLabeller:
    rundir: SitesRundir
    benchmark: Benchmark
    builds: CompileService
    measurements: MeasurementService
    stop: threading.Event
    # whether the workers can count now (the session checked them); False: a rundir that
    # records a cycles size gets no cycles effect for the labels measured from now on
    count_cycles: bool = True
    status: LabelsStatus = field(init=False)
    reference: Artifact = field(init=False)
    heuristic: Tree = field(init=False)
    _answers: dict[tuple[str, str, str], Paired] = field(init=False, default_factory=dict)
    # run(defer_confirmation=True) ended with wall-time retests still to measure (confirm())
    awaiting_confirmation: bool = field(init=False, default=False)
    # the reference build's own overrides and policy (dispatcher.labels.reference): none for
    # the heuristic's; always-inline's policy; a tree's overrides (the rundir's copy)
    base_overrides: tuple[Override, ...] = field(init=False, default=())
    base_policy: PolicySpec | None = field(init=False, default=None)
    # the journal's minimal subset (its MinimalEvent's), once read or appended: the retest
    # asks for it per label, and reading the journal per label was quadratic in the labels
    _minimal_subset: list[int] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.status = LabelsStatus(self.rundir.experiment.task, self.rundir.path)

    # -- running

    def run(self, defer_confirmation: bool = False) -> None:
        """The whole procedure; how it ended goes to the journal and ``status``.
        ``defer_confirmation``: the wall-time retests are left for ``confirm()`` (then
        ``awaiting_confirmation``), so that a thread counting exact labels is not held by
        timed runs that wait for the one timed CPU (``pipeline.sites``)."""
        self._guarded(lambda: self._run(defer_confirmation))

    def confirm(self) -> None:
        """The retests ``run(defer_confirmation=True)`` left, then the finish; a stop that
        came meanwhile ends it interrupted (its confirmations measured on --resume)."""
        self.awaiting_confirmation = False
        self._guarded(self._retest)

    def _guarded(self, body: Callable[[], None]) -> None:
        try:
            body()
        except (Interrupted, BuildInterrupted):  # a compiler the Ctrl-C reached: the same
            self.status.state = "interrupted"
            self._finish("interrupted")
        except ReferenceFailed as exc:
            self._fail(f"{self._reference_build} failed a run: {exc}")
        except CompileError as exc:
            self._fail(f"{self._reference_build} failed to compile: {exc}")
        except Exception as exc:  # one line for the user, the rundir kept for --resume
            self._fail(" ".join(str(exc).split()) or type(exc).__name__)
        else:
            if self.awaiting_confirmation:  # still running: its confirmations to come
                return
            self.status.state, self.status.phase = "finished", "done"
            self._finish("completed")

    def _fail(self, why: str) -> None:
        self.status.state, self.status.error = "failed", why
        self._finish(f"failed: {why}")

    def _finish(self, reason: str) -> None:
        try:
            self.rundir.append(FinishEvent(reason=reason))
        except OSError as exc:
            self.status.state = "failed"
            self.status.error = f"{self.rundir.journal_path}: cannot write ({exc})"

    def _run(self, defer_confirmation: bool = False) -> None:
        events = self.rundir.events()
        if any(isinstance(e, (ReferenceEvent, FinishEvent)) for e in events):
            self.rundir.append(ResumeEvent(from_step=0))
        for e in events:  # the answers a resume reads back
            if isinstance(e, SubsetEvent):
                self._answers[("test", "labels", _subset_key(e.subset))] = e.outcome
            elif isinstance(e, LabelEvent):
                self._answers[("label", e.trial, _label_key(e))] = e.outcome
        self._reference(events)
        winner = next((e for e in events if isinstance(e, WinnerEvent)), None)
        chosen = self.rundir.experiment.winner
        if winner is None and chosen is not None:
            winner = self._journal_winner(chosen)
        if winner is not None:
            self._attribute(winner, events)
        if self.rundir.experiment.sweep:
            self._sweep()
        if self.rundir.experiment.retest:
            waiting = self._to_retest() if defer_confirmation else 0
            if waiting:
                self.awaiting_confirmation = True
                self.status.phase = f"{waiting} label(s) waiting for their wall-time retest"
                return
            self._retest()

    def check_stop(self) -> None:
        if self.stop.is_set():
            raise Interrupted

    def wait(self, future: Future[T]) -> T:
        while True:
            try:
                return future.result(timeout=0.2)
            except futures.TimeoutError:
                self.check_stop()

    # -- the reference and the winner

    @property
    def _reference_build(self) -> str:
        """The reference build as a failure names it: the heuristic's, or the other one
        ``--reference`` asked for (a failure of always-inline's build is not the heuristic's)."""
        return f"the {reference_name(self.rundir.experiment.reference)} build"

    def _reference(self, events: list[Any]) -> None:
        self.status.phase = "reference"
        reference = self.rundir.experiment.reference
        if reference == ALWAYS_INLINE:
            self.base_policy = parse_policy(ALWAYS_INLINE)
        elif reference is not None:
            copy = self.rundir.path / REFERENCE_TREE
            try:
                self.base_overrides = tuple(read_overrides(copy))
            except (OSError, ValueError) as exc:
                raise RuntimeError(f"{copy}: cannot read the reference tree "
                                   f"({' '.join(str(exc).split())[:200]})") from None
        compiled = self.wait(self.builds.submit(self.job_of(())))
        known = next((e for e in events if isinstance(e, ReferenceEvent)), None)
        if known is not None and known.sha256 != compiled.sha256:
            raise RuntimeError(f"the reference build is another binary than the one this "
                               f"rundir measured against ({compiled.sha256[:12]}, not "
                               f"{known.sha256[:12]}): was the compiler or the benchmark "
                               "changed?")
        self.reference = compiled.artifact
        d = self.rundir.path / REFERENCE_DIR
        if known is None:
            if d.exists():
                shutil.rmtree(d)
            d.mkdir()
            compiled.artifact.export(d)
            self.rundir.append(ReferenceEvent(sha256=compiled.sha256,
                                              artifact=compiled.artifact.key))
        self.heuristic = DUMPS.tree_of_dir(d)

    def _journal_winner(self, winner: WinnerChoice) -> WinnerEvent:
        d = self.rundir.path / WINNER_DIR
        if d.exists():
            shutil.rmtree(d)
        if winner.overrides is not None:  # a file: the tree the compiler builds from it
            try:
                overrides = tuple(read_overrides(winner.overrides))
            except (OSError, ValueError) as exc:
                raise RuntimeError(f"{winner.overrides}: cannot read the tree to attribute "
                                   f"({' '.join(str(exc).split())[:200]})") from None
            compiled = self.wait(self.builds.submit(CompileJob(self.benchmark, overrides)))
            d.mkdir()
            compiled.artifact.export(d)
        else:
            shutil.copytree(Path(winner.rundir) / winner.dir, d,
                            ignore=shutil.ignore_patterns("measurements.json"))
        event = WinnerEvent(rundir=winner.overrides or winner.rundir, dir=winner.dir,
                            speedup=winner.speedup, ci95=winner.ci95,
                            decisions=winner_decisions(self.heuristic, DUMPS.tree_of_dir(d)))
        self.rundir.append(event)
        return event

    # -- attribution

    def _attribute(self, winner: WinnerEvent, events: list[Any]) -> None:
        decisions = winner.decisions
        everything = tuple(range(len(decisions)))
        if not decisions:
            self.status.last = "the winner takes no decision the heuristic does not"
            return
        self.status.phase = f"attribution: {len(decisions)} decisions"
        exp = self.rundir.experiment
        full = self._test(decisions, everything)
        full_effect = log_effect(full)
        if full_effect is None or full_effect[1] <= 0.0:
            self.status.last = f"its decisions together: {describe(full)}; no gain to attribute"
            minimal, stopped, tests = everything, "no_gain", 1
        else:
            reduced = ddmin(everything, lambda s: keeps_gain(
                self._test(decisions, s), full_effect[0], exp.keep), exp.max_tests)
            minimal, stopped, tests = reduced.subset, reduced.stopped, reduced.tests + 1
        done = next((e for e in events if isinstance(e, MinimalEvent)), None)
        if done is None:
            self.status.phase = "confirming the minimal subset"
            fresh_full = self._measure_tree(tree_with(self.heuristic, decisions), (),
                                            self.reference, "confirm")
            fresh_kept = self._measure_tree(
                tree_with(self.heuristic, [decisions[i] for i in minimal]), (),
                self.reference, "confirm")
            share = None
            fe, ke = log_effect(fresh_full), log_effect(fresh_kept)
            if stopped != "no_gain" and fe is not None and ke is not None and fe[0] != 0.0:
                share = ke[0] / fe[0]
            self.rundir.append(MinimalEvent(subset=list(minimal), tests=tests, stopped=stopped,
                                            full=fresh_full, kept=fresh_kept,
                                            kept_share=share))
            self._minimal_subset = list(minimal)
        if stopped == "no_gain":
            return
        kept = [decisions[i] for i in minimal]
        self.status.phase = f"labelling {len(kept)} kept decisions"
        self.status.planned = self.status.labels + len(kept) * (3 if len(kept) > 1 else 2)
        winner_build = self._build(tree_with(self.heuristic, decisions))
        minimal_build = self._build(tree_with(self.heuristic, kept))
        for i in minimal:
            d = decisions[i]
            self._label(d, "alone", tree_with(self.heuristic, [d]), self.reference, i)
            if winner_build is not None:
                self._label(reverted(d), "removed", self._without(decisions, decisions, i),
                            winner_build.artifact, i, changed=False)
            if len(kept) > 1 and minimal_build is not None:
                self._label(reverted(d), "minimal", self._without(decisions, kept, i),
                            minimal_build.artifact, i, changed=False)

    def _without(self, decisions: list[SiteDecision], within: list[SiteDecision],
                 i: int) -> list[Override]:
        """The overrides of ``within`` (the winner's decisions, or the minimal subset's)
        without decision ``i``: its site is left to the heuristic."""
        return tree_with(self.heuristic, [x for j, x in enumerate(decisions)
                                          if j != i and x in within])

    def _test(self, decisions: list[SiteDecision], subset: tuple[int, ...]) -> Paired:
        """The heuristic's tree with ``subset`` of the winner's decisions, against the
        heuristic build (journaled, or read back)."""
        key = ("test", "labels", _subset_key(subset))
        if key in self._answers:
            self.status.tests += 1
            return self._answers[key]
        self.check_stop()
        outcome = self._measure_tree(tree_with(self.heuristic, [decisions[i] for i in subset]),
                                     (), self.reference, "labels")
        exp = self.rundir.experiment
        full = self._answers.get(("test", "labels", _subset_key(range(len(decisions)))))
        full_effect = log_effect(full) if full is not None else None
        passes = full_effect is not None and keeps_gain(outcome, full_effect[0], exp.keep)
        self.rundir.append(SubsetEvent(subset=list(subset), outcome=outcome, passes=passes))
        self._answers[key] = outcome
        self.status.tests += 1
        self.status.last = f"test of {len(subset)} decision(s): {describe(outcome)}"
        return outcome

    # -- the sweep

    def _sweep(self) -> None:
        exp = self.rundir.experiment
        self.status.phase = ("profiling the heuristic build" if exp.reference is None
                             else "profiling the reference build")
        hot = self.rundir.profile()  # of the reference build
        if hot is None:
            job = self.job(self.reference, runs=3)
            measured = self.measurements.wait(
                self.measurements.submit(job, exp.worker_class), self.wait)
            times = measured.times or [1.0]
            sampled = self.measurements.wait(self.measurements.submit(
                profile_job(job, statistics.median(times)), exp.worker_class), self.wait)
            hot = hot_functions_of(self.reference.binary, sampled.results)
            self.rundir.write_profile(hot)
        if exp.reference is not None:  # the sites the reference inlined, set back alone
            sites = flip_back_sites(self.heuristic, hot, exp.sweep)
            self.status.phase = f"sweep: {len(sites)} hottest sites the reference inlined"
            self.status.planned = self.status.labels + len(sites)
            for d in sites:
                self._label(d, "alone", self._alone(d), self.reference, None,
                            heat=site_heat(d.unit, d.key, d.callee, hot))
            return
        ranked = sorted(((site_heat(u, n.key, n.name, hot), i, u, r, n)
                         for i, (u, r, n) in enumerate(flippable(self.heuristic, None))),
                        key=lambda x: (-x[0], x[1]))
        chosen: list[tuple[int, int, str, int, Any]] = []
        seen: set[tuple[str, str, str]] = set()
        for x in ranked:  # a site decided in several rounds: its earliest flip of each kind
            heat, _, unit, round_, node = x
            what = (unit, node.key, node.decided)
            if heat > 0 and what not in seen and len(chosen) < exp.sweep:
                seen.add(what)
                chosen.append(x)
        self.status.phase = f"sweep: {len(chosen)} hottest sites"
        self.status.planned = self.status.labels + len(chosen)
        for heat, _, unit, round_, node in chosen:
            d = flipped(unit, round_, node.key, node.name, node.decided)
            self._label(d, "alone", tree_with(self.heuristic, [d]), self.reference, None,
                        heat=heat)

    # -- the retest

    def _retest(self) -> None:
        """Every measured label again, with fresh pairs; under an exact metric (a rundir that
        records ``confirm_above``) only those whose exact effect is at least that, in wall
        time at ``confirm_size``: the confirmation of the labels that matter (docs/labels.md,
        "Confirmation")."""
        exp = self.rundir.experiment
        measured = [e for e in self.rundir.events()
                    if isinstance(e, LabelEvent) and e.trial == "labels" and e.outcome.measured]
        firsts = [e for e in measured if exp.confirms(e.outcome)]
        if exp.confirm_above is None:
            self.status.phase = f"retest: {len(firsts)} labels"
        else:
            self.status.phase = (f"confirming {len(firsts)} labels in wall time at "
                                 f"{exp.retest_size} size ({len(measured) - len(firsts)} "
                                 f"below {exp.confirm_above:g})")
        self.status.planned = self.status.labels + len(firsts)
        decisions = next((e.decisions for e in self.rundir.events()
                          if isinstance(e, WinnerEvent)), [])
        for e in firsts:
            reference = self.reference
            overrides = self._label_overrides(e, decisions)
            if e.context != "alone":
                base = tree_with(self.heuristic, decisions if e.context == "removed" else
                                 [decisions[i] for i in self._minimal()])
                built = self._build(base)
                if built is None:
                    continue
                reference = built.artifact
            self._label(e.site, e.context, overrides, reference, e.decision, e.heat,
                        trial="retest", changed=e.context == "alone")

    def _to_retest(self) -> int:
        """How many retests the journal still lacks (of the labels ``_retest`` measures)."""
        exp = self.rundir.experiment
        return sum(e.trial == "labels" and exp.confirms(e.outcome)
                   and ("label", "retest", _label_key(e)) not in self._answers
                   for e in self.rundir.events() if isinstance(e, LabelEvent))

    def _minimal(self) -> list[int]:
        """The journaled minimal subset (none yet: empty), the journal read once."""
        if self._minimal_subset is None:
            self._minimal_subset = next((e.subset for e in self.rundir.events()
                                         if isinstance(e, MinimalEvent)), None)
        return self._minimal_subset or []

    def _label_overrides(self, e: LabelEvent, decisions: list[SiteDecision]) -> list[Override]:
        """The tree a journaled label tested, again."""
        if e.context == "alone" or e.decision is None:
            return self._alone(e.site)
        within = decisions if e.context == "removed" else \
            [decisions[j] for j in self._minimal()]
        return self._without(decisions, within, e.decision)

    def _alone(self, site: SiteDecision) -> list[Override]:
        """The tree of a label ``alone``: the reference's with ``site`` alone changed (the
        heuristic's: only the site pinned; another reference: its own overrides kept)."""
        if self.rundir.experiment.reference is None:
            return tree_with(self.heuristic, [site])
        return flipped_back(self.base_overrides, self.heuristic, site)

    def job_of(self, overrides: Sequence[Override]) -> CompileJob:
        """The build of ``overrides`` in the reference's setting (always-inline's policy
        file evaluated beside them, for that reference: an override wins over it)."""
        return CompileJob(self.benchmark, tuple(overrides), policy=self.base_policy)

    # -- labels

    def _label(self, site: SiteDecision, context: Context, overrides: list[Override],
               reference: Artifact, decision: int | None, heat: int | None = None,
               trial: Literal["labels", "retest"] = "labels", changed: bool = True) -> None:
        """Measure one label (or read it back) and journal it; ``changed``: the site's
        override is what makes the tree differ from its reference (a flip; not a removal,
        which leaves the site to the heuristic), checked to reach the code that runs."""
        probe = LabelEvent(site=site, context=context, decision=decision, heat=heat,
                           trial=trial, outcome=Paired(status="failed"))
        key = ("label", trial, _label_key(probe))
        if key in self._answers:  # journaled before a resume
            self.status.labels += 1
            return
        self.check_stop()
        flip = (Override(site.unit, site.round, site.key, site.action),) if changed else ()
        exp = self.rundir.experiment
        # a confirmation runs at its own size; any other test at the labels'
        size = exp.confirm_size if trial == "retest" else None
        outcome = self._measure_tree(overrides, flip, reference,
                                     "labels" if trial == "labels" else "retest", cycles=True,
                                     size=size)
        self.rundir.append(probe.model_copy(update={"outcome": outcome, "size": size}))
        self._answers[key] = outcome
        self.status.labels += 1
        self.status.last = (f"{site.callee} {site.action} ({context}): {describe(outcome)}")

    # -- building and measuring

    def _build(self, overrides: list[Override]) -> CompileResult | None:
        try:
            return self.wait(self.builds.submit(self.job_of(overrides)))
        except CompileError:
            return None

    def _measure_tree(self, overrides: list[Override], changed: tuple[Override, ...],
                      reference: Artifact, trial: str, cycles: bool = False,
                      size: str | None = None) -> Paired:
        """Build the tree ``overrides`` ask for and measure it against ``reference`` (at
        ``size``; None: the experiment's); ``changed``: the overrides that make it differ
        from its reference, checked to reach the code that runs; ``cycles``: a measured
        outcome gets its cycles effect too."""
        try:
            compiled = self.wait(self.builds.submit(self.job_of(overrides)))
        except CompileError as exc:
            return Paired(status="failed", why=f"compile failed: {' '.join(str(exc).split())}"
                          [:300])
        if changed:
            reach = override_reach(changed, DUMPS.dumps(compiled.artifact.outputs(),
                                                        str(compiled.artifact.directory)))
            # Decided again in a body inlined into another unit: that copy is the code the
            # other unit runs (lu: Matrix.update's call of Matrix.get, flipped in Matrix,
            # decided again where Lu inlined Matrix.update).  A copy that is the other
            # unit's own declaration (the flip was in an inlined copy) does not say so.
            reach = replace(reach, elsewhere=tuple(
                (o, d) for o, d in reach.elsewhere if inlined_copy(d.key)))
            if reach.unmatched or reach.elsewhere:
                why = reach.line("the flip")
                return Paired(status="not_reached", sha256=compiled.sha256,
                              why=(why or "").removeprefix("warning: the flip: ")[:300])
        if compiled.sha256 == reference.sha256:
            return Paired(status="same_binary", sha256=compiled.sha256,
                          why="the tree built its reference's binary")
        outcome = self._compare(compiled.artifact, reference, trial, size)
        return self._with_cycles(outcome, compiled.artifact, reference) if cycles else outcome

    def _with_cycles(self, outcome: Paired, tested: Artifact, reference: Artifact) -> Paired:
        """``outcome`` with its binaries' ratio in estimated cycles, reference over tested,
        counted at the experiment's ``cycles_size`` (its worker seconds added to ``cpu_s``);
        as it was when not measured, when this rundir counts nothing, or when the count
        cannot be made (a failed or non-deterministic run, a worker without counts: said in
        the status line, the label kept without its cycles effect)."""
        exp = self.rundir.experiment
        if not outcome.measured or exp.cycles_size is None or not self.count_cycles:
            return outcome
        if outcome.metric == "cycles" and exp.cycles_size == exp.size:  # its own counts
            return outcome.model_copy(update={"cycles": outcome.speedup})
        try:
            counted = self.wait(self.measurements.compare(
                self.job(reference, size=exp.cycles_size),
                self.job(tested, size=exp.cycles_size), exp.worker_class,
                self.part_policy(), metric="cycles"))
        except (ReferenceFailed, AgentError) as exc:
            self.status.last = f"no cycles effect: {' '.join(str(exc).split())}"[:300]
            return outcome
        ratio = counted.interval[0] if counted.metric == "cycles" else None
        cost = 0.0 if counted.reused else sum(rec.wall_s for r in counted.results
                                              for rec in r.records)
        return outcome.model_copy(update={"cycles": ratio,
                                          "cpu_s": round(outcome.cpu_s + cost, 3)})

    def job(self, artifact: Artifact | CompileResult, runs: int = 1,
            size: str | None = None) -> RunJob:
        exp = self.rundir.experiment
        size_ = self.benchmark.size(size or exp.size)
        return RunJob(sha256=artifact.sha256, binary=artifact.binary, args=size_.args,
                      runs=runs, timeout=exp.timeout, expected_output=size_.expected.to_json(),
                      perf=exp.perf, aslr=exp.aslr)

    def slots(self) -> int:
        cls = self.rundir.experiment.worker_class
        return max(1, sum(s.worker_class == cls for s in self.measurements.scheduler.slots))

    def part_policy(self) -> PairingPolicy:
        """One slot's share of a test: the run settings divided over the slots (a part
        whose interval is as wide as sqrt(parts) times the target gives a pooled one at
        about the target)."""
        exp, n = self.rundir.experiment, self.slots()
        return PairingPolicy.between(max(2, math.ceil(exp.runs / n)),
                                     max(2, math.ceil(exp.max_pairs / n)),
                                     exp.half_width * math.sqrt(n))

    def _compare(self, tested: Artifact, reference: Artifact, trial: str,
                 size: str | None = None) -> Paired:
        """``tested`` against ``reference`` in one comparison per slot, started together,
        pooled: pairs never mix slots, a label takes the whole class.  Under an exact metric,
        one counted comparison (a retest stays in time: the label's wall-time check, at
        ``size`` when it is a confirmation)."""
        exp = self.rundir.experiment
        policy = self.part_policy()
        if exp.metric != "time" and trial != "retest":
            counted = self.wait(self.measurements.compare(
                self.job(reference), self.job(tested), exp.worker_class, policy,
                metric=exp.metric))
            if counted.metric != "time":
                return exact_outcome(counted, tested.sha256)
            return pooled([counted], exp.runs, tested.sha256)  # not deterministic: timed
        parts = [self.measurements.compare(self.job(reference, size=size),
                                           self.job(tested, size=size),
                                           exp.worker_class, policy,
                                           trial=f"{trial} part {i}")
                 for i in range(self.slots())]
        done: list[Comparison] = [self.wait(p) for p in parts]
        return pooled(done, exp.runs, tested.sha256)


def enable_cycle_counts(slots: Sequence[Any], measurements: MeasurementService) -> str | None:
    """Ask every worker whether it can count in cycles (``check_workers``: valgrind there, one
    version) and give the measurement service the identity of their counts, so that labels
    measured in time carry their cycles effect; None when they can, else why not (one line)."""
    try:
        measurements.exact_identity = check_workers(slots, "cycles")
    except ExactUnavailable as exc:
        return " ".join(str(exc).split())
    return None


def pooled(parts: list[Comparison], fewest: int, sha256: str) -> Paired:
    """One outcome of a test's parts: their resolved pairs pooled (a pair's ratio is
    within its slot, so the pool mixes no slots)."""
    reference: list[float] = []
    candidate: list[float] = []
    runs = disturbed = 0
    cpu = 0.0
    for c in parts:
        runs += c.runs
        disturbed += c.disturbed
        if not c.reused:  # a comparison the store answered cost no worker time now
            cpu += sum(rec.wall_s for r in c.results for rec in r.records)
        if c.resolved and c.stopped != "failed":
            reference += c.reference_times
            candidate += c.candidate_times
    common: dict[str, Any] = dict(runs=runs, disturbed=disturbed, cpu_s=round(cpu, 3),
                                  sha256=sha256)
    failed = next((c for c in parts if c.stopped == "failed"), None)
    if failed is not None:
        failure = next((rec.failure for r in failed.results for rec in r.records
                        if rec.failure), "a run failed")
        return Paired(status="failed", why=f"the tested binary failed: {failure}"[:300],
                      **common)
    if len(candidate) < fewest:
        return Paired(status="unresolved", pairs=len(candidate),
                      why=f"{len(candidate)} undisturbed pairs of the {fewest} needed; "
                          f"{disturbed} of {runs} runs disturbed", **common)
    speedup, low, high = paired_speedup_ci(reference, candidate)
    return Paired(status="measured", speedup=speedup,
                  ci95=None if low is None or high is None else (low, high),
                  pairs=len(candidate), **common)


def exact_outcome(c: Comparison, sha256: str) -> Paired:
    """A test's outcome from one exact comparison: the ratio of the counts, its interval
    [ratio, ratio] (docs/measurement.md, "Exact metrics")."""
    common: dict[str, Any] = dict(runs=c.runs, sha256=sha256, metric=c.metric,
                                  cpu_s=0.0 if c.reused else round(sum(
                                      rec.wall_s for r in c.results for rec in r.records), 3))
    if c.stopped == "failed":
        failure = next((rec.failure for r in c.results for rec in r.records
                        if rec.failure and r.sha256 == sha256), "a run failed")
        return Paired(status="failed", why=f"the tested binary failed: {failure}"[:300],
                      **common)
    speedup, low, high = c.interval
    assert speedup is not None and low is not None and high is not None
    return Paired(status="measured", speedup=speedup, ci95=(low, high), pairs=1, **common)


def inlined_copy(key: str) -> bool:
    """Whether the call ``key`` lies in a body inlined or specialised at a call above it."""
    return any(frame in ("I", "S") for frame in split_key(key))


def _subset_key(subset: Any) -> str:
    return ",".join(str(i) for i in sorted(subset))


def _label_key(e: LabelEvent) -> str:
    s = e.site
    return f"{e.context}|{s.unit}|{s.round}|{s.key}|{s.action}"
