"""What every search chain does, whichever its loop: the baseline (and its profile), compiling
and measuring against the baseline, recording a candidate, re-measuring the incumbent, the
A/A canary, the end-of-chain confirmation, and journaling how the chain ended.

The two loops that use it, ``dispatcher.search.sync`` and ``dispatcher.search.asynchronous``,
hold only what differs: how proposals are drawn and when they are judged.  ``Chain``
(``dispatcher.search.chain``) picks one by the mode its rundir recorded.
"""
from __future__ import annotations

import statistics
import threading
from concurrent import futures
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, TypeVar

from dispatcher.build.manifest import Benchmark
from dispatcher.build.service import CompileJob, CompileResult, CompileService
from dispatcher.core.comparison import Comparison, share_range
from dispatcher.core.decisions import read_overrides
from dispatcher.core.dump_cache import DUMPS, Build
from dispatcher.core.jobs import RunJob
from dispatcher.core.records import (
    BaselineEvent,
    CanaryEvent,
    Candidate,
    ConfirmEvent,
    DecisionCounts,
    FinishEvent,
    HotFunctions,
    Pointer,
    RemeasureEvent,
    ResumeEvent,
    RunResult,
    SearchSettings,
    canary_dir,
    candidate_dir,
    confirm_dir,
    pooled_pairs,
    remeasure_dir,
)
from dispatcher.core.rundir import Rundir
from dispatcher.core.stats import geomean, geomean_ci, paired_speedup_ci
from dispatcher.running.measurement import Measured, MeasurementService, PairingPolicy, Pending
from dispatcher.search.focus import hot_functions_of, profile_job
from dispatcher.storage.store import Artifact

T = TypeVar("T")


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
    # Why no candidate beat the heuristic, once the chain knows (None: one did, or not known
    # yet): the confirmation found the best not above 1 or its interval holds 1, could not
    # resolve it, or the heuristic's own tree stayed the best.
    none_better: Optional[str] = None
    unresolved: int = 0  # comparisons with too few undisturbed pairs (no speedup)
    state: str = "starting"
    error: Optional[str] = None


class Interrupted(Exception):
    pass


def counts(built: Build) -> DecisionCounts:
    inlined, not_inlined, prevented = built.counts()
    return DecisionCounts(inlined=inlined, not_inlined=not_inlined, prevented=prevented)


def interval(low: float | None, high: float | None) -> tuple[float, float] | None:
    return None if low is None or high is None else (low, high)


def excludes_one(low: float | None, high: float | None) -> bool:
    return low is not None and high is not None and (low > 1.0 or high < 1.0)


def beats_heuristic(speedup: float | None, low: float | None) -> bool:
    """A confirmed figure that says a candidate beat the heuristic: above 1, its interval
    too (an unresolved confirmation, None, says nothing)."""
    return speedup is not None and speedup > 1.0 and low is not None and low > 1.0


def paired_if_resolved(compared: Comparison) -> tuple[list[float], list[float]]:
    """(reference, candidate) times of a comparison's pairs, none when it is unresolved: the
    journal's events carry only pairs that may be pooled (its runs stay in its
    measurements.json)."""
    if not compared.resolved:
        return [], []
    return compared.reference_times, compared.candidate_times


@dataclass
class ChainCore:
    """One search chain's state and the work every loop shares, around the compile and
    measurement services.  ``settings``: its rundir's (``search.settings.recorded_settings``);
    ``from_config``: those of them a rundir of an earlier version did not record, taken from
    the config (journaled by the ``resume`` event)."""

    rundir: Rundir
    benchmark: Benchmark
    settings: SearchSettings
    builds: CompileService
    measurements: MeasurementService
    worker_class: str  # every run of this chain, baseline included, is on this class
    stop: threading.Event
    from_config: dict[str, Any] = field(default_factory=dict)
    status: ChainStatus = field(init=False)
    reference: Artifact = field(init=False)  # the baseline's binary: every comparison's
    hot: HotFunctions | None = field(init=False, default=None)  # the rundir's profile.json

    def __post_init__(self) -> None:
        unset = [f for f in ("timeout", "perf", "aslr", "max_pairs", "half_width")
                 if getattr(self.settings, f) is None]
        if unset:  # recorded_settings fills them for a rundir that lacks them
            raise ValueError(f"chain settings without {', '.join(unset)}")
        self.status = ChainStatus(self.benchmark.name, self.rundir.path, self.settings.steps)

    # -- waiting

    def check_stop(self) -> None:
        if self.stop.is_set():
            raise Interrupted

    def wait(self, future: Future[T]) -> T:
        """Wait for a future, but give up promptly on Ctrl-C (the job's result is dropped)."""
        while True:
            try:
                return future.result(timeout=0.2)
            except futures.TimeoutError:  # not the builtin before Python 3.11
                self.check_stop()

    def busy_s(self) -> float:
        return sum(self.measurements.scheduler.busy_s.values())

    # -- measuring

    def pairing(self, must_beat: float | None = None) -> PairingPolicy:
        s = self.settings
        assert s.max_pairs is not None and s.half_width is not None
        return PairingPolicy.between(s.runs, s.max_pairs, s.half_width, must_beat)

    def job(self, compiled: CompileResult | Artifact, runs: int = 1) -> RunJob:
        s = self.settings
        assert s.timeout is not None and s.perf is not None and s.aslr is not None
        size = self.benchmark.size(s.size)
        return RunJob(sha256=compiled.sha256, binary=compiled.binary, args=size.args,
                      runs=runs, timeout=s.timeout, expected_output=size.expected.to_json(),
                      perf=s.perf, aslr=s.aslr)

    def measure(self, compiled: CompileResult | Artifact, runs: int,
                reuse: bool = True) -> Pending:
        """Runs of a binary on this chain's worker class."""
        return self.measurements.submit(self.job(compiled, runs), self.worker_class,
                                        reuse=reuse)

    def start_comparison(self, compiled: CompileResult | Artifact,
                         policy: PairingPolicy, trial: str | None = None,
                         metric: str | None = None) -> Future[Comparison]:
        """``compiled`` against the baseline, in pairs on one slot of this chain's class (or
        counted, in an exact ``metric``: the chain's unless given); ``trial``: a repetition
        measured apart from other ones (``MeasurementService.compare``)."""
        return self.measurements.compare(self.job(self.reference), self.job(compiled),
                                         self.worker_class, policy, trial=trial,
                                         metric=metric or self.settings.metric)

    def compare(self, artifact: Artifact, policy: PairingPolicy,
                trial: str | None = None, metric: str | None = None) -> Comparison:
        return self.wait(self.start_comparison(artifact, policy, trial, metric))

    def trial(self, kind: str, step: int) -> str:
        """The name of a repeated measurement of this chain: new pairs at every step, the
        same ones for a chain of the same experiment redoing that step (a resume)."""
        e = self.rundir.experiment
        return f"{kind} {e.task} {e.algorithm} seed {e.seed} step {step}"

    def collect(self, pending: Pending) -> Measured:
        return self.measurements.wait(pending, self.wait)

    # -- the rundir

    def save_candidate(self, d: Path, compiled: CompileResult,
                       results: list[RunResult] | Comparison,
                       proposal: Path | None = None) -> Build:
        """A compiled candidate's outputs (the store's pack of its dumps; plain files in a
        rundir begun before version 6), overrides.sexp and measurements into its dir -> what
        the compiler really did (its counts; its tree when asked for), read from the dumps in
        hand (each parsed once per content: ``dump_cache``), not back from the files.
        ``proposal``: the proposal file it was compiled from (its overrides.sexp's bytes: a
        hard link to it, not a second copy)."""
        outputs = compiled.artifact.outputs()
        if self.rundir.experiment.packs_outputs:
            compiled.artifact.keep_packed(d, outputs, same_overrides=proposal)
        else:
            compiled.artifact.export(d, outputs)
        self.rundir.write_measurements(d, results)
        return DUMPS.build(outputs, str(d))

    def resumed(self, from_step: int) -> None:
        """Journal that this chain goes on from ``from_step``, naming any setting it took
        from the config (a rundir of an earlier version)."""
        self.rundir.append(ResumeEvent(from_step=from_step, from_config=self.from_config))

    def finish(self, reason: str) -> None:
        """Journal how the chain ended; a rundir that cannot be written any more (a full or
        read-only disk) fails the chain with that one line instead of killing the thread."""
        try:
            self.rundir.append(FinishEvent(reason=reason))
        except OSError as exc:
            why = f"{self.rundir.journal_path}: cannot write ({exc.strerror or exc})"
            self.status.state = "failed"
            self.status.error = why if self.status.error is None \
                else f"{self.status.error}; {why}"

    def record(self, step: int, entry: Candidate, c: CompileResult | None,
               compared: Comparison | None, proposal: Path | None = None
               ) -> tuple[Candidate, Build | None]:
        """A measured (or failed) candidate into its dir -> its record, and the build the
        compiler really produced, whose ``tree`` the search asks for if it keeps the
        candidate (None: it did not compile).  ``proposal``: its proposal file, if any."""
        d = self.rundir.fresh_candidate_dir(step, entry.candidate)
        if c is None or compared is None:
            return entry, None
        built = self.save_candidate(d, c, compared, proposal)  # what the compiler really did
        speedup, low, high = compared.interval  # None when unresolved: never accepted
        if not compared.resolved:
            self.status.unresolved += 1
        reference, times = paired_if_resolved(compared)
        return entry.model_copy(update=dict(
            sha256=c.sha256, artifact=c.artifact.key, decisions=counts(built),
            times=times, reference_times=reference, failed=compared.failed,
            speedup=speedup, ci95=interval(low, high), worker=compared.worker,
            stopped=compared.stopped,
            energy=None if speedup is None else 1.0 / speedup,
            error=entry.error or (f"{compared.failed} failed run(s)"
                                  if compared.failed else None)
            or (None if compared.resolved else compared.unresolved_line()))), built

    # -- the baseline

    def baseline(self) -> BaselineEvent:
        """The journaled baseline, or the heuristic build compiled, measured (and profiled,
        with focus ``hot``) and journaled now."""
        baseline = self.rundir.baseline()
        if baseline is not None:
            return baseline
        self.status.state = "baseline"
        compiled = self.wait(self.builds.submit(CompileJob(self.benchmark)))
        want = self.settings.baseline_runs
        measured = self.collect(self.measure(compiled, want))
        results = list(measured.results)
        # Disturbed runs are never used: as many again are run, once, for those missing.
        missing = want - len(measured.times)
        if missing > 0 and not measured.failed:
            results += self.collect(self.measure(compiled, missing, reuse=False)).results
        times = [t for r in results for t in r.times]
        if not times:
            failure = next((rec.failure for r in results for rec in r.records
                            if rec.failure), None)
            if failure is None:
                failure = (f"every run disturbed (CPU shares {share_range(results)}, "
                           f"floor {self.measurements.judge.floor:.2f})")
            raise RuntimeError(f"{self.benchmark.name}: baseline: {failure}")
        if self.settings.focus == "hot":
            self.profile(compiled, times)
        d = self.rundir.fresh_candidate_dir(0, 0)
        built = self.save_candidate(d, compiled, results)
        baseline = BaselineEvent(sha256=compiled.sha256, dir=candidate_dir(0, 0),
                                 artifact=compiled.artifact.key, times=times,
                                 geomean=geomean(times), median=sorted(times)[len(times) // 2],
                                 ci95=geomean_ci(times), decisions=counts(built))
        self.rundir.append(baseline)
        return baseline

    def profile(self, compiled: CompileResult, times: list[float]) -> None:
        """Where the baseline spends its time, sampled in one run on this chain's worker
        class, kept in the rundir before the baseline is journaled: every proposal, a resumed
        chain's too, is drawn with the same profile.  A profile that could not be taken is
        kept too (with its error): the search then treats every site alike."""
        self.status.state = "profiling"
        job = profile_job(self.job(compiled), statistics.median(times))
        measured = self.collect(self.measurements.submit(job, self.worker_class))
        self.rundir.write_profile(hot_functions_of(compiled.binary, measured.results))

    def binary_of(self, incumbent: Pointer) -> Artifact:
        """A journaled candidate's compiled artifact: from the store, or (a wiped or different
        store, e.g. a rundir resumed elsewhere) compiled again from its dir's proposal."""
        artifact = self.builds.stored(incumbent.artifact or "")
        if artifact is not None:
            return artifact
        proposal = self.rundir.path / incumbent.dir / "overrides.sexp"
        overrides = tuple(read_overrides(proposal)) if proposal.exists() else ()
        compiled = self.wait(self.builds.submit(CompileJob(self.benchmark, overrides)))
        if incumbent.sha256 is not None and compiled.sha256 != incumbent.sha256:
            raise RuntimeError(f"{incumbent.dir}: compiling its proposal again gave another "
                               f"binary ({compiled.sha256[:12]}, not {incumbent.sha256[:12]}): "
                               "was the compiler or the benchmark changed?")
        return compiled.artifact

    # -- measurements besides the candidates'

    def remeasure(self, step: int, incumbent: Pointer) -> Pointer:
        """Measure the incumbent again (noise must not keep a lucky candidate forever); its
        energy is then the one over all its pairs.  A re-measurement journaled for this step
        by a master killed before the step's own line is the one: a resume redoing the step
        takes it as it is rather than measuring (and pooling) the incumbent twice."""
        events = self.rundir.events()
        done = next((e for e in events if isinstance(e, RemeasureEvent) and e.step == step
                     and e.dir == incumbent.dir), None)
        if done is not None:
            return incumbent.model_copy(update={"energy": done.energy})
        compared = self.compare(self.binary_of(incumbent), self.pairing(),
                                self.trial("remeasure", step))
        new_reference, new_candidate = paired_if_resolved(compared)
        reference, candidate = pooled_pairs(events, incumbent)
        reference += new_reference
        candidate += new_candidate
        speedup, low, high = (paired_speedup_ci(reference, candidate) if candidate
                              else (None, None, None))
        new_energy = incumbent.energy if speedup is None else 1.0 / speedup
        self.rundir.write_measurements(self.rundir.path / remeasure_dir(step), compared)
        self.rundir.append(RemeasureEvent(
            step=step, dir=incumbent.dir,
            measurements=f"{remeasure_dir(step)}/measurements.json",
            times=new_candidate, reference_times=new_reference,
            energy=new_energy, speedup=speedup, ci95=interval(low, high)))
        return incumbent.model_copy(update={"energy": new_energy})

    def canary(self, step: int) -> None:
        """The baseline against itself, as a candidate would be (an A/A test)."""
        compared = self.compare(self.reference, self.pairing(), self.trial("canary", step))
        speedup, low, high = compared.interval
        reference, candidate = paired_if_resolved(compared)
        self.rundir.write_measurements(self.rundir.path / canary_dir(step), compared)
        self.rundir.append(CanaryEvent(step=step, times=candidate,
                                       reference_times=reference,
                                       speedup=speedup, ci95=interval(low, high),
                                       significant=excludes_one(low, high)))

    def confirm(self, best: Pointer) -> None:
        """The best candidate measured again against the baseline, once, at the end: in wall
        time, whatever the chain searched in (a winner screened on an exact metric is
        published on the clock)."""
        if any(isinstance(e, ConfirmEvent) and e.dir == best.dir for e in self.rundir.events()):
            return  # a resumed finished chain
        self.status.state = "confirming"
        compared = self.compare(self.binary_of(best), self.pairing(),
                                self.trial("confirm", best.step), metric="time")
        speedup, low, high = compared.interval
        reference, candidate = paired_if_resolved(compared)
        self.rundir.write_measurements(self.rundir.path / confirm_dir(best.step), compared)
        self.rundir.append(ConfirmEvent(step=best.step, candidate=best.candidate, dir=best.dir,
                                        times=candidate, reference_times=reference,
                                        speedup=speedup, ci95=interval(low, high),
                                        significant=excludes_one(low, high)))
        if speedup is not None:  # what batch-log will show: the live line agrees
            self.status.best_energy, self.status.best_ci = 1.0 / speedup, interval(low, high)
            self.status.confirmed = True
        if not compared.resolved:
            self.status.none_better = f"its confirmation was {compared.unresolved_line()}"
        elif not beats_heuristic(speedup, low):
            assert speedup is not None
            ci = "" if low is None else f" [{low:.3f}, {high:.3f}]"
            self.status.none_better = f"confirmed best {speedup:.3f}x{ci}"
