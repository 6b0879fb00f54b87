"""The data-generation driver: search chains that share one compile service and one
measurement service.

Each chain (one benchmark, one rundir) runs in its own thread and reads as the search it is:
propose candidates, compile them, read back the tree the compiler really produced, measure,
decide, journal.  Jobs of all chains meet in the scheduler's queue, so a free worker slot
takes whichever chain has work and no slot idles while one chain compiles.  Chains only write
their rundir (through ``dispatcher.core.records``) and a ``status`` record that the progress display
reads: data flows one way.

Two modes (``search.mode``): ``sync`` steps propose ``candidates_per_step`` candidates and wait
for all of them before deciding, so each step waits for its slowest candidate; ``async``
keeps ``in_flight`` candidates in flight and judges each as it lands, one step per candidate
(docs/measurement.md, "Asynchronous search").
"""
from __future__ import annotations

import queue
import random
import statistics
import threading
import time
from concurrent import futures
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, TypeVar, cast

from dispatcher.build.manifest import Benchmark
from dispatcher.build.service import CompileError, CompileJob, CompileResult, CompileService
from dispatcher.core.decisions import read_overrides
from dispatcher.core.records import (
    Algorithm,
    BaselineEvent,
    CanaryEvent,
    Candidate,
    ConfirmEvent,
    DecisionCounts,
    Experiment,
    FinishEvent,
    HotFunctions,
    Pointer,
    ProposeEvent,
    RemeasureEvent,
    ResumeEvent,
    RunResult,
    StepEvent,
    canary_dir,
    candidate_dir,
    confirm_dir,
    pooled_pairs,
    proposal_file,
    remeasure_dir,
)
from dispatcher.core.rundir import Rundir
from dispatcher.core.stats import geomean, geomean_ci, paired_speedup_ci
from dispatcher.core.tree import Tree, count, to_overrides
from dispatcher.running.agent_client import RunJob
from dispatcher.running.measurement import (
    Comparison,
    Measured,
    MeasurementService,
    PairingPolicy,
    Pending,
)
from dispatcher.search.focus import hot_functions_of, profile_job
from dispatcher.search.rules import (
    backlog,
    in_flight_share,
    judge,
    metropolis,
    proposal_rng,
    propose,
    temperature,
)
from dispatcher.storage.store import Artifact

T = TypeVar("T")


@dataclass(frozen=True)
class SearchParams:
    algorithm: str  # "sa" | "random-walk"
    steps: int
    seed: int
    size: str
    runs: int
    baseline_runs: int
    candidates_per_step: int
    t_start: float = 0.04
    t_end: float = 0.001
    remeasure_every: int = 10
    max_flips: int = 2
    timeout: float = 120.0
    perf: bool = True
    aslr: bool = False  # randomise the layout per run (docs/measurement.md)
    max_pairs: int = 20  # comparisons: runs is the fewest pairs, this the most
    half_width: float = 0.01
    canary_every: int = 0
    confirm: bool = False
    focus: str = "uniform"  # "hot": profile the baseline, then favour flips in code that ran
    mode: str = "sync"  # "async": judge each candidate as it lands (one step each)
    in_flight: int = 1  # async: candidates kept in flight

    def pairing(self, must_beat: float | None = None) -> PairingPolicy:
        return PairingPolicy(min_pairs=self.runs, max_pairs=max(self.max_pairs, self.runs),
                             half_width=self.half_width, must_beat=must_beat)


@dataclass
class ChainStatus:
    """What the progress display shows; written by the chain thread only."""

    task: str
    rundir: Path
    steps: int
    step: int = 0
    best_energy: Optional[float] = None
    best_ci: Optional[tuple[float, float]] = None  # of the best speedup
    confirmed: bool = False  # the best speedup is the end-of-chain confirmation's
    state: str = "starting"
    error: Optional[str] = None


def _rng_to_json(rng: random.Random) -> list[Any]:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _rng_from_json(data: list[Any]) -> random.Random:
    rng = random.Random()
    rng.setstate((data[0], tuple(data[1]), data[2]))
    return rng


def _counts(tree: Tree) -> DecisionCounts:
    inlined, not_inlined, prevented = count(tree)
    return DecisionCounts(inlined=inlined, not_inlined=not_inlined, prevented=prevented)


class Interrupted(Exception):
    pass


@dataclass
class _Flight:
    """An asynchronous proposal between its journal line and its judgement.  Filled in by
    the compile and comparison callbacks, then put on the chain's landing queue once."""

    proposal: ProposeEvent
    key: str  # its compile key: the chain holds its binary until it is judged
    compiled: CompileResult | None = None
    compared: Comparison | None = None
    error: str | None = None  # the compile failed: judged without an energy
    exc: BaseException | None = None  # anything else: the chain fails with it


@dataclass
class Chain:
    """One search chain: a pure search loop around the compile and measurement services."""

    rundir: Rundir
    benchmark: Benchmark
    params: SearchParams
    compiler: CompileService
    measurements: MeasurementService
    worker_class: str  # every run of this chain, baseline included, is on this class
    stop: threading.Event
    status: ChainStatus = field(init=False)
    _reference: Artifact = field(init=False)  # the baseline's binary: every comparison's
    _hot: HotFunctions | None = field(init=False, default=None)  # the rundir's profile.json

    def __post_init__(self) -> None:
        self.status = ChainStatus(self.benchmark.name, self.rundir.path, self.params.steps)

    # -- helpers

    def _check_stop(self) -> None:
        if self.stop.is_set():
            raise Interrupted

    def _wait(self, future: Future[T]) -> T:
        """Wait for a future, but give up promptly on Ctrl-C (the job's result is dropped)."""
        while True:
            try:
                return future.result(timeout=0.2)
            except futures.TimeoutError:  # not the builtin before Python 3.11
                self._check_stop()

    def _job(self, compiled: CompileResult | Artifact, runs: int = 1) -> RunJob:
        size = self.benchmark.size(self.params.size)
        return RunJob(sha256=compiled.sha256, binary=compiled.binary, args=size.args,
                      runs=runs, timeout=self.params.timeout,
                      expected_output=size.expected.to_json(), perf=self.params.perf,
                      aslr=self.params.aslr)

    def _measure(self, compiled: CompileResult | Artifact, runs: int,
                 reuse: bool = True) -> Pending:
        """Runs of a binary on this chain's worker class."""
        return self.measurements.submit(self._job(compiled, runs), self.worker_class,
                                        reuse=reuse)

    def _compare(self, artifact: Artifact, policy: PairingPolicy,
                 trial: str | None = None) -> Comparison:
        """``artifact`` against the baseline, in pairs on one slot of this chain's class;
        ``trial``: a repetition measured apart from other ones (``MeasurementService.compare``)."""
        return self._wait(self.measurements.compare(self._job(self._reference),
                                                    self._job(artifact), self.worker_class,
                                                    policy, trial=trial))

    def _trial(self, kind: str, step: int) -> str:
        """The name of a repeated measurement of this chain: new pairs at every step, the
        same ones for a chain of the same experiment redoing that step (a resume)."""
        e = self.rundir.experiment
        return f"{kind} {e.task} {e.algorithm} seed {e.seed} step {step}"

    def _collect(self, pending: Pending) -> Measured:
        return self.measurements.wait(pending, self._wait)

    def _save_candidate(self, d: Path, compiled: CompileResult,
                        results: list[RunResult]) -> None:
        compiled.artifact.export(d)  # its dumps and overrides.sexp, uncompressed
        self.rundir.write_measurements(d, results)

    # -- the search

    def run(self) -> None:
        try:
            self._run()
        except Interrupted:
            self.status.state = "interrupted"
            self._finish("interrupted")
        except Exception as exc:  # recorded in the rundir, never lost silently
            message = " ".join(str(exc).split())[:300] or type(exc).__name__
            self.status.state, self.status.error = "failed", message
            self._finish(f"failed: {message}")

    def _finish(self, reason: str) -> None:
        """Journal how the chain ended; a rundir that cannot be written any more (a full or
        read-only disk) fails the chain with that one line instead of killing the thread."""
        try:
            self.rundir.append(FinishEvent(reason=reason))
        except OSError as exc:
            why = f"{self.rundir.journal_path}: cannot write ({exc.strerror or exc})"
            self.status.state = "failed"
            self.status.error = why if self.status.error is None \
                else f"{self.status.error}; {why}"

    def _baseline(self) -> BaselineEvent:
        baseline = self.rundir.baseline()
        if baseline is not None:
            return baseline
        self.status.state = "baseline"
        compiled = self._wait(self.compiler.submit(CompileJob(self.benchmark)))
        measured = self._collect(self._measure(compiled, self.params.baseline_runs))
        times = measured.times
        if not times:
            failure = next((rec.failure for r in measured.results for rec in r.records
                            if rec.failure), "no successful run")
            raise RuntimeError(f"{self.benchmark.name}: baseline: {failure}")
        if self.params.focus == "hot":
            self._profile(compiled, times)
        d = self.rundir.fresh_candidate_dir(0, 0)
        self._save_candidate(d, compiled, measured.results)
        baseline = BaselineEvent(sha256=compiled.sha256, dir=candidate_dir(0, 0),
                                 artifact=compiled.artifact.key, times=times,
                                 geomean=geomean(times), median=sorted(times)[len(times) // 2],
                                 ci95=geomean_ci(times), decisions=_counts(Tree.from_dir(d)))
        self.rundir.append(baseline)
        return baseline

    def _profile(self, compiled: CompileResult, times: list[float]) -> None:
        """Where the baseline spends its time, sampled in one run on this chain's worker
        class, kept in the rundir before the baseline is journaled: every proposal, a resumed
        chain's too, is drawn with the same profile.  A profile that could not be taken is
        kept too (with its error): the search then treats every site alike."""
        self.status.state = "profiling"
        job = profile_job(self._job(compiled), statistics.median(times))
        measured = self._collect(self.measurements.submit(job, self.worker_class))
        self.rundir.write_profile(hot_functions_of(compiled.binary, measured.results))

    def _step_candidates(self, step: int, origin: Tree, rng: random.Random,
                         incumbent_energy: float) -> tuple[list[Candidate], dict[int, Tree]]:
        """Propose, compile and measure one step's candidates -> their records and the trees
        the compiler really produced (by candidate index)."""
        p = self.params
        n = p.candidates_per_step if p.algorithm == "sa" else 1
        proposals = [propose(origin, rng, p.max_flips, hot=self._hot) for _ in range(n)]
        compiles = [self.compiler.submit(CompileJob(self.benchmark, tuple(to_overrides(t))))
                    for t, _ in proposals]
        compiled: list[CompileResult | None] = []
        errors: list[str | None] = []
        for future in compiles:
            try:
                compiled.append(self._wait(future))
                errors.append(None)
            except CompileError as exc:
                compiled.append(None)
                errors.append(f"compile failed: {exc}")
        self.status.state = "running"
        # Every comparison starts before any is waited for: the slots fill at once.  One
        # that cannot beat the incumbent stops early.
        bar = 1.0 / incumbent_energy
        pending = {k: self.measurements.compare(self._job(self._reference), self._job(c),
                                                self.worker_class, self.params.pairing(bar))
                   for k, c in enumerate(compiled) if c is not None}
        candidates, trees = [], {}
        for k, ((_, mutation), c) in enumerate(zip(proposals, compiled)):
            entry = Candidate(candidate=k, dir=candidate_dir(step, k), mutation=mutation,
                              error=errors[k])
            compared = self._wait(pending[k]) if c is not None else None
            entry, tree = self._record(step, entry, c, compared)
            if tree is not None:
                trees[k] = tree
            candidates.append(entry)
        return candidates, trees

    def _record(self, step: int, entry: Candidate, c: CompileResult | None,
                compared: Comparison | None) -> tuple[Candidate, Tree | None]:
        """A measured (or failed) candidate into its dir -> its record, and the tree the
        compiler really produced (None: it did not compile)."""
        d = self.rundir.fresh_candidate_dir(step, entry.candidate)
        if c is None or compared is None:
            return entry, None
        self._save_candidate(d, c, compared.results)
        tree = Tree.from_dir(d)  # what the compiler really did
        speedup, low, high = compared.interval
        return entry.model_copy(update=dict(
            sha256=c.sha256, artifact=c.artifact.key, decisions=_counts(tree),
            times=compared.candidate_times,
            reference_times=compared.reference_times, failed=compared.failed,
            speedup=speedup, ci95=_interval(low, high), worker=compared.worker,
            stopped=compared.stopped,
            energy=None if speedup is None else 1.0 / speedup,
            error=entry.error or (f"{compared.failed} failed run(s)"
                                  if compared.failed else None))), tree

    def _run(self) -> None:
        baseline = self._baseline()
        self._reference = self._binary_of(baseline.pointer())
        self._hot = self.rundir.profile()
        if self.params.mode == "async":
            best = self._run_async(baseline)
        else:
            best = self._run_sync(baseline)
        if self.params.confirm and best.step > 0:
            self._confirm(best)
        self.rundir.append(FinishEvent(reason="completed"))
        self.compiler.release(set())
        self.status.state = "finished"

    def _run_sync(self, baseline: BaselineEvent) -> Pointer:
        """Steps of ``candidates_per_step`` proposals, each step waiting for all of its
        candidates before deciding -> the best candidate."""
        p = self.params
        last = self.rundir.last_step()
        if last is None:
            rng = random.Random(p.seed)
            incumbent = best = baseline.pointer()
            current_dir = baseline.dir  # random walk: the last compiled tree
            first = 1
        else:
            rng = _rng_from_json(last.rng)
            incumbent, best = last.incumbent, last.best
            current_dir = last.current or incumbent.dir
            first = last.step + 1
            self.rundir.append(ResumeEvent(from_step=first))
        incumbent_tree = Tree.from_dir(self.rundir.path / incumbent.dir)
        current_tree = Tree.from_dir(self.rundir.path / current_dir)
        self.status.best_energy = best.energy
        # elapsed_s and busy_s go on from where the journal left them (cumulative over
        # resumes); the time of a step lost to a crash is not counted.
        elapsed_before = (last.elapsed_s or 0.0) if last is not None else 0.0
        busy_before = (last.busy_s or 0.0) if last is not None else 0.0
        t_begin = time.monotonic()
        busy_begin = self._busy_s()

        for step in range(first, p.steps + 1):
            self._check_stop()
            self.status.step, self.status.state = step - 1, "compiling"
            temp = temperature(step, p.steps, p.t_start, p.t_end) if p.algorithm == "sa" else None
            origin = incumbent_tree if p.algorithm == "sa" else current_tree
            # The proposals' draws, then the Metropolis draw, taken whatever happens.
            candidates, trees = self._step_candidates(step, origin, rng, incumbent.energy)
            u = rng.random()
            scored = [c for c in candidates if c.energy is not None]
            chosen = min(scored, key=lambda c: c.energy or 0.0) if scored else None
            if chosen is None:
                accepted = False
            elif p.algorithm == "sa":
                assert temp is not None and chosen.energy is not None
                accepted = metropolis(incumbent.energy, chosen.energy, temp, u)
            else:
                accepted = True
            if accepted and chosen is not None:
                incumbent = chosen.pointer(step)
                incumbent_tree = trees[chosen.candidate]
                current_dir, current_tree = chosen.dir, incumbent_tree
            for c in scored:
                if c.energy is not None and c.energy < best.energy:
                    best = c.pointer(step)
                    self.status.best_ci = c.ci95
            if (p.algorithm == "sa" and p.remeasure_every and step % p.remeasure_every == 0
                    and incumbent.step > 0):
                incumbent = self._remeasure(step, incumbent)
            self._check_stop()  # a step cut short by a stop is redone on resume, not recorded
            event = StepEvent(step=step, temperature=temp, candidates=candidates,
                              chosen=chosen.candidate if chosen else None, accepted=accepted,
                              incumbent=incumbent, best=best, current=current_dir,
                              rng=_rng_to_json(rng),
                              elapsed_s=elapsed_before + time.monotonic() - t_begin,
                              busy_s=busy_before + self._busy_s() - busy_begin)
            self.rundir.append(event)
            self.rundir.write_state(event.state())
            # Binaries no later step runs leave the store (compiled again if ever needed).
            self.compiler.release({self._reference.key, incumbent.artifact, best.artifact})
            self.status.step, self.status.best_energy = step, best.energy
            if p.canary_every and step % p.canary_every == 0:
                self._canary(step)  # after the step: a resume never repeats it
        return best

    # -- the asynchronous search

    def _run_async(self, baseline: BaselineEvent) -> Pointer:
        """Keep ``in_flight`` candidates in flight and judge each as it lands, one step each
        -> the best candidate.  A proposal is drawn from the incumbent (random walk: the
        current tree) of the moment and journaled before it is compiled; a step judges the
        candidate that landed against the incumbent of the moment it landed.  The journal's
        order is the decision order: a resume takes the state of its last step, measures
        again the proposals no step judged (the same files) and goes on drawing."""
        p = self.params
        events = self.rundir.events()
        log = backlog(events)
        steps = [e for e in events if isinstance(e, StepEvent)]
        last = steps[-1] if steps else None
        if last is None:
            incumbent = best = baseline.pointer()
            current: str | None = baseline.dir
            judged = 0
        else:
            incumbent, best = last.incumbent, last.best
            current = last.current or incumbent.dir
            judged = last.step
        if last is not None or log.next_proposal > 1:
            self.rundir.append(ResumeEvent(from_step=judged + 1))
        trees: dict[str, Tree] = {}  # the incumbent's and the current tree, by dir

        def tree_of(d: str) -> Tree:
            if d not in trees:
                trees[d] = Tree.from_dir(self.rundir.path / d)
            return trees[d]

        self.status.step, self.status.best_energy = judged, best.energy
        elapsed_before = (last.elapsed_s or 0.0) if last is not None else 0.0
        busy_before = (last.busy_s or 0.0) if last is not None else 0.0
        t_begin = time.monotonic()
        busy_begin = self._busy_s()
        landed: queue.SimpleQueue[_Flight] = queue.SimpleQueue()
        flights = {e.proposal: self._launch(e, landed) for e in log.pending}
        proposal = log.next_proposal
        while judged < p.steps:
            while len(flights) < p.in_flight and proposal <= p.steps:
                origin = incumbent.dir if p.algorithm == "sa" else (current or incumbent.dir)
                drawn = self._propose(proposal, origin, tree_of(origin), incumbent)
                flights[proposal] = self._launch(drawn, landed)
                proposal += 1
            self.status.state = "running"
            flight = self._landing(landed)
            del flights[flight.proposal.proposal]
            step = judged + 1
            temp = temperature(step, p.steps, p.t_start, p.t_end) if p.algorithm == "sa" else None
            entry = Candidate(candidate=0, dir=candidate_dir(step, 0),
                              mutation=flight.proposal.mutation, error=flight.error)
            entry, tree = self._record(step, entry, flight.compiled, flight.compared)
            verdict = judge(p.algorithm, step, entry, incumbent, best, current, temp,
                            flight.proposal.u)
            if verdict.best is not best:
                self.status.best_ci = entry.ci95
            incumbent, best, current = verdict.incumbent, verdict.best, verdict.current
            if tree is not None and verdict.accepted:
                trees[entry.dir] = tree
            if (p.algorithm == "sa" and p.remeasure_every and step % p.remeasure_every == 0
                    and incumbent.step > 0):
                incumbent = self._remeasure(step, incumbent)
            self._check_stop()  # a judgement cut short by a stop is made again on resume
            event = StepEvent(step=step, temperature=temp, candidates=[entry],
                              chosen=0 if entry.energy is not None else None,
                              accepted=verdict.accepted, incumbent=incumbent, best=best,
                              current=current, rng=[], proposal=flight.proposal.proposal,
                              elapsed_s=elapsed_before + time.monotonic() - t_begin,
                              busy_s=busy_before + self._busy_s() - busy_begin)
            self.rundir.append(event)
            self.rundir.write_state(event.state())
            judged = step
            for d in [d for d in trees if d not in (incumbent.dir, current)]:
                del trees[d]
            # Binaries no later step runs leave the store; those in flight stay.
            self.compiler.release({self._reference.key, incumbent.artifact, best.artifact}
                                  | {f.key for f in flights.values()})
            self.status.step, self.status.best_energy = step, best.energy
            if p.canary_every and step % p.canary_every == 0:
                self._canary(step)  # after the step: a resume never repeats it
        return best

    def _propose(self, n: int, origin: str, tree: Tree, incumbent: Pointer) -> ProposeEvent:
        """Draw proposal ``n`` from ``tree`` (its own stream: ``search.proposal_rng``), with its
        Metropolis draw; its file, then its event, are written before it is compiled."""
        rng = proposal_rng(self.params.seed, n)
        mutated, mutation = propose(tree, rng, self.params.max_flips, hot=self._hot)
        u = rng.random()
        path = proposal_file(n)
        self.rundir.write_proposal(path, to_overrides(mutated))
        event = ProposeEvent(proposal=n, origin=origin, mutation=mutation, overrides=path,
                             bar=1.0 / incumbent.energy, u=u)
        self.rundir.append(event)
        return event

    def _launch(self, proposal: ProposeEvent, landed: queue.SimpleQueue[_Flight]) -> _Flight:
        """Compile a journaled proposal from its file, then compare it with the baseline
        (callbacks: the chain thread is not needed between the two); the flight goes on
        ``landed`` once, when it has its comparison or cannot have one."""
        job = CompileJob(self.benchmark, self.rundir.proposal_overrides(proposal))
        flight = _Flight(proposal, self.compiler.key(job))

        def compared(future: Future[Comparison]) -> None:
            try:
                flight.compared = future.result()
            except BaseException as exc:
                flight.exc = exc
            landed.put(flight)

        def compiled(future: Future[CompileResult]) -> None:
            try:
                flight.compiled = future.result()
                comparison = self.measurements.compare(
                    self._job(self._reference), self._job(flight.compiled), self.worker_class,
                    self.params.pairing(proposal.bar))
            except CompileError as exc:
                flight.error = f"compile failed: {exc}"
                landed.put(flight)
            except BaseException as exc:
                flight.exc = exc
                landed.put(flight)
            else:
                comparison.add_done_callback(compared)

        self.compiler.submit(job).add_done_callback(compiled)
        return flight

    def _landing(self, landed: queue.SimpleQueue[_Flight]) -> _Flight:
        """The next candidate to land (in the order they landed); promptly on Ctrl-C."""
        while True:
            try:
                flight = landed.get(timeout=0.2)
            except queue.Empty:
                self._check_stop()
                continue
            if flight.exc is not None:
                raise flight.exc
            return flight

    def _busy_s(self) -> float:
        return sum(self.measurements.scheduler.busy_s.values())

    def _binary_of(self, incumbent: Pointer) -> Artifact:
        """A journaled candidate's compiled artifact: from the store, or (a wiped or different
        store, e.g. a rundir resumed elsewhere) compiled again from its dir's proposal."""
        artifact = self.compiler.stored(incumbent.artifact or "")
        if artifact is not None:
            return artifact
        proposal = self.rundir.path / incumbent.dir / "overrides.sexp"
        overrides = tuple(read_overrides(proposal)) if proposal.exists() else ()
        compiled = self._wait(self.compiler.submit(CompileJob(self.benchmark, overrides)))
        if incumbent.sha256 is not None and compiled.sha256 != incumbent.sha256:
            raise RuntimeError(f"{incumbent.dir}: compiling its proposal again gave another "
                               f"binary ({compiled.sha256[:12]}, not {incumbent.sha256[:12]}): "
                               "was the compiler or the benchmark changed?")
        return compiled.artifact

    def _remeasure(self, step: int, incumbent: Pointer) -> Pointer:
        """Measure the incumbent again (noise must not keep a lucky candidate forever); its
        energy is then the one over all its pairs.  A re-measurement journaled for this step
        by a master killed before the step's own line is the one: a resume redoing the step
        takes it as it is rather than measuring (and pooling) the incumbent twice."""
        events = self.rundir.events()
        done = next((e for e in events if isinstance(e, RemeasureEvent) and e.step == step
                     and e.dir == incumbent.dir), None)
        if done is not None:
            return incumbent.model_copy(update={"energy": done.energy})
        compared = self._compare(self._binary_of(incumbent), self.params.pairing(),
                                 self._trial("remeasure", step))
        reference, candidate = pooled_pairs(events, incumbent)
        reference += compared.reference_times
        candidate += compared.candidate_times
        speedup, low, high = (paired_speedup_ci(reference, candidate) if candidate
                              else (None, None, None))
        new_energy = incumbent.energy if speedup is None else 1.0 / speedup
        self.rundir.write_measurements(self.rundir.path / remeasure_dir(step), compared.results)
        self.rundir.append(RemeasureEvent(
            step=step, dir=incumbent.dir,
            measurements=f"{remeasure_dir(step)}/measurements.json",
            times=compared.candidate_times, reference_times=compared.reference_times,
            energy=new_energy, speedup=speedup, ci95=_interval(low, high)))
        return incumbent.model_copy(update={"energy": new_energy})

    def _canary(self, step: int) -> None:
        """The baseline against itself, as a candidate would be (an A/A test)."""
        compared = self._compare(self._reference, self.params.pairing(),
                                 self._trial("canary", step))
        speedup, low, high = compared.interval
        self.rundir.write_measurements(self.rundir.path / canary_dir(step), compared.results)
        self.rundir.append(CanaryEvent(step=step, times=compared.candidate_times,
                                       reference_times=compared.reference_times,
                                       speedup=speedup, ci95=_interval(low, high),
                                       significant=_excludes_one(low, high)))

    def _confirm(self, best: Pointer) -> None:
        """The best candidate measured again against the baseline, once, at the end."""
        if any(isinstance(e, ConfirmEvent) and e.dir == best.dir for e in self.rundir.events()):
            return  # a resumed finished chain
        self.status.state = "confirming"
        compared = self._compare(self._binary_of(best), self.params.pairing(),
                                 self._trial("confirm", best.step))
        speedup, low, high = compared.interval
        self.rundir.write_measurements(self.rundir.path / confirm_dir(best.step),
                                       compared.results)
        self.rundir.append(ConfirmEvent(step=best.step, candidate=best.candidate, dir=best.dir,
                                        times=compared.candidate_times,
                                        reference_times=compared.reference_times,
                                        speedup=speedup, ci95=_interval(low, high),
                                        significant=_excludes_one(low, high)))
        if speedup is not None:  # what batch-log will show: the live line agrees
            self.status.best_energy, self.status.best_ci = 1.0 / speedup, _interval(low, high)
            self.status.confirmed = True


def _interval(low: float | None, high: float | None) -> tuple[float, float] | None:
    return None if low is None or high is None else (low, high)


def _excludes_one(low: float | None, high: float | None) -> bool:
    return low is not None and high is not None and (low > 1.0 or high < 1.0)


def new_experiment(bench: Benchmark, chain: int, config, slots: int, worker_class: str, *,
                   algorithm: str | None = None, steps: int | None = None,
                   seed: int | None = None, size: str | None = None,
                   runs: int | None = None, max_pairs: int | None = None,
                   chains: int = 1, compiler: str | None = None) -> Experiment:
    """The experiment record of a new chain: the config's search settings, then overrides.
    ``slots``: the worker slots of its class; ``chains``: the chains sharing them (an
    asynchronous chain keeps its share of the slots in flight, recorded so that a resume
    keeps it)."""
    s, m = config.search, config.measure
    sync = s.mode != "async"
    return Experiment(
        task=bench.name, benchmark=str(bench.directory),
        algorithm=cast(Algorithm, algorithm or s.algorithm),
        seed=(s.seed if seed is None else seed) + chain,
        chain=chain, steps=steps or s.steps, size=size or config.run.size,
        runs=runs or config.run.runs, baseline_runs=s.baseline_runs,
        candidates_per_step=(s.candidates_per_step or slots) if sync else 1,
        mode="sync" if sync else "async",
        in_flight=None if sync else (s.in_flight or in_flight_share(slots, chains)),
        t_start=s.t_start, t_end=s.t_end,
        remeasure_every=s.remeasure_every, max_flips=s.max_flips, worker_class=worker_class,
        max_pairs=max_pairs or m.max_pairs, half_width=m.half_width, canary_every=m.canary_every,
        confirm=m.confirm, compiler=compiler)


def params_of(experiment: Experiment, config) -> SearchParams:
    """Search parameters from a rundir's experiment record (so a resume uses the same)."""
    e = experiment
    return SearchParams(
        algorithm=e.algorithm, steps=e.steps, seed=e.seed, size=e.size, runs=e.runs,
        baseline_runs=e.baseline_runs, candidates_per_step=e.candidates_per_step,
        t_start=e.t_start, t_end=e.t_end, remeasure_every=e.remeasure_every,
        max_flips=e.max_flips, timeout=config.run.timeout, perf=config.run.perf,
        aslr=config.run.aslr,
        # Version 1 did not pair: a resumed one pairs as the config says from now on.
        max_pairs=e.max_pairs or config.measure.max_pairs,
        half_width=e.half_width or config.measure.half_width,
        canary_every=e.canary_every, confirm=e.confirm, focus=config.search.focus,
        mode=e.mode, in_flight=e.in_flight or 1)
