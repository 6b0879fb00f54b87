"""The data-generation driver: search chains that share one compile service and one
measurement service.

Each chain (one benchmark, one rundir) runs in its own thread and reads as the search it is:
propose candidates, compile them, read back the tree the compiler really produced, measure,
decide, journal.  Jobs of all chains meet in the scheduler's queue, so a free worker slot
takes whichever chain has work and no slot idles while one chain compiles.  Chains only write
their rundir (through ``dispatcher.records``) and a ``status`` record that the progress display
reads: data flows one way.
"""
from __future__ import annotations

import random
import shutil
import threading
import time
from concurrent import futures
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, TypeVar, cast

from dispatcher.benchmark import Benchmark
from dispatcher.compile import CompileError, CompileJob, CompileResult, CompileService
from dispatcher.decisions import read_overrides
from dispatcher.measure import Measured, MeasurementService, Pending
from dispatcher.records import (
    Algorithm,
    BaselineEvent,
    Candidate,
    DecisionCounts,
    Experiment,
    FinishEvent,
    Pointer,
    RemeasureEvent,
    ResumeEvent,
    RunResult,
    StepEvent,
    candidate_dir,
    remeasure_dir,
)
from dispatcher.rundir import Rundir
from dispatcher.search import energy, metropolis, propose, temperature
from dispatcher.stats import geomean, geomean_ci
from dispatcher.store import Artifact
from dispatcher.tree import Tree, count, to_overrides
from dispatcher.worker import RunJob

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


@dataclass
class ChainStatus:
    """What the progress display shows; written by the chain thread only."""

    task: str
    rundir: Path
    steps: int
    step: int = 0
    best_energy: Optional[float] = None
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

    def _measure(self, compiled: CompileResult | Artifact, runs: int,
                 reuse: bool = True) -> Pending:
        """Runs of a binary on this chain's worker class."""
        size = self.benchmark.size(self.params.size)
        job = RunJob(sha256=compiled.sha256, binary=compiled.binary, args=size.args,
                     runs=runs, timeout=self.params.timeout,
                     expected_output=size.expected.to_json(), perf=self.params.perf)
        return self.measurements.submit(job, self.worker_class, reuse=reuse)

    def _collect(self, pending: Pending) -> Measured:
        return self.measurements.wait(pending, self._wait)

    def _save_candidate(self, d: Path, compiled: CompileResult,
                        results: list[RunResult]) -> None:
        for f in compiled.artifact.decision_files:
            shutil.copyfile(f, d / f.name)
        overrides = compiled.artifact.directory / "overrides.sexp"
        if overrides.exists():
            shutil.copyfile(overrides, d / "overrides.sexp")
        self.rundir.write_measurements(d, results)

    # -- the search

    def run(self) -> None:
        try:
            self._run()
        except Interrupted:
            self.rundir.append(FinishEvent(reason="interrupted"))
            self.status.state = "interrupted"
        except Exception as exc:  # recorded in the rundir, never lost silently
            message = " ".join(str(exc).split())[:300] or type(exc).__name__
            self.rundir.append(FinishEvent(reason=f"failed: {message}"))
            self.status.state, self.status.error = "failed", message

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
        d = self.rundir.fresh_candidate_dir(0, 0)
        self._save_candidate(d, compiled, measured.results)
        baseline = BaselineEvent(sha256=compiled.sha256, dir=candidate_dir(0, 0),
                                 artifact=compiled.artifact.key, times=times,
                                 geomean=geomean(times), median=sorted(times)[len(times) // 2],
                                 ci95=geomean_ci(times), decisions=_counts(Tree.from_dir(d)))
        self.rundir.append(baseline)
        return baseline

    def _step_candidates(self, step: int, origin: Tree, rng: random.Random, base: float
                         ) -> tuple[list[Candidate], dict[int, Tree]]:
        """Propose, compile and measure one step's candidates -> their records and the trees
        the compiler really produced (by candidate index)."""
        p = self.params
        n = p.candidates_per_step if p.algorithm == "sa" else 1
        proposals = [propose(origin, rng, p.max_flips) for _ in range(n)]
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
        # Submit every candidate's runs before waiting for any: slots fill at once.
        pending = {k: self._measure(c, p.runs) for k, c in enumerate(compiled) if c is not None}
        candidates, trees = [], {}
        for k, ((_, mutation), c) in enumerate(zip(proposals, compiled)):
            entry = Candidate(candidate=k, dir=candidate_dir(step, k), mutation=mutation,
                              error=errors[k])
            d = self.rundir.fresh_candidate_dir(step, k)
            if c is not None:
                measured = self._collect(pending[k])
                self._save_candidate(d, c, measured.results)
                trees[k] = Tree.from_dir(d)  # what the compiler really did
                entry = entry.model_copy(update=dict(
                    sha256=c.sha256, artifact=c.artifact.key, cached=measured.reused,
                    decisions=_counts(trees[k]), times=measured.times,
                    failed=measured.failed, energy=energy(measured.times, base)))
            candidates.append(entry)
        return candidates, trees

    def _run(self) -> None:
        p = self.params
        baseline = self._baseline()
        base = baseline.geomean
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
        t_begin = time.monotonic()

        for step in range(first, p.steps + 1):
            self._check_stop()
            self.status.step, self.status.state = step - 1, "compiling"
            temp = temperature(step, p.steps, p.t_start, p.t_end) if p.algorithm == "sa" else None
            origin = incumbent_tree if p.algorithm == "sa" else current_tree
            # The proposals' draws, then the Metropolis draw, taken whatever happens.
            candidates, trees = self._step_candidates(step, origin, rng, base)
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
            if (p.algorithm == "sa" and p.remeasure_every and step % p.remeasure_every == 0
                    and incumbent.step > 0):
                incumbent = self._remeasure(step, incumbent, base)
            self._check_stop()  # a step cut short by a stop is redone on resume, not recorded
            event = StepEvent(step=step, temperature=temp, candidates=candidates,
                              chosen=chosen.candidate if chosen else None, accepted=accepted,
                              incumbent=incumbent, best=best, current=current_dir,
                              rng=_rng_to_json(rng), elapsed_s=time.monotonic() - t_begin,
                              busy_s=sum(self.measurements.scheduler.busy_s.values()))
            self.rundir.append(event)
            self.rundir.write_state(event.state())
            self.status.step, self.status.best_energy = step, best.energy
        self.rundir.append(FinishEvent(reason="completed"))
        self.status.state = "finished"

    def _incumbent_binary(self, incumbent: Pointer) -> Artifact:
        """The incumbent's compiled artifact: from the store, or (a wiped or different store,
        e.g. a rundir resumed elsewhere) compiled again from its dir's proposal."""
        artifact = self.compiler.store.artifact(incumbent.artifact or "")
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

    def _remeasure(self, step: int, incumbent: Pointer, base: float) -> Pointer:
        """Measure the incumbent again (noise must not keep a lucky candidate forever)."""
        artifact = self._incumbent_binary(incumbent)
        fresh = self._collect(self._measure(artifact, self.params.runs, reuse=False))
        size = self.benchmark.size(self.params.size)
        every = self.measurements.store.measurements_for(artifact.sha256, size.args,
                                                         self.worker_class)
        times = [t for r in every for t in r.times]
        new_energy = energy(times, base) if times else incumbent.energy
        assert new_energy is not None
        d = self.rundir.path / remeasure_dir(step)
        self.rundir.write_measurements(d, fresh.results)
        self.rundir.append(RemeasureEvent(step=step, dir=incumbent.dir,
                                          measurements=f"{remeasure_dir(step)}/measurements.json",
                                          times=fresh.times, energy=new_energy))
        return incumbent.model_copy(update={"energy": new_energy})


def new_experiment(bench: Benchmark, chain: int, config, slots: int, worker_class: str, *,
                   algorithm: str | None = None, steps: int | None = None,
                   seed: int | None = None, size: str | None = None,
                   runs: int | None = None) -> Experiment:
    """The experiment record of a new chain: the config's search settings, then overrides."""
    s = config.search
    return Experiment(
        task=bench.name, benchmark=str(bench.directory),
        algorithm=cast(Algorithm, algorithm or s.algorithm),
        seed=(s.seed if seed is None else seed) + chain,
        chain=chain, steps=steps or s.steps, size=size or config.run.size,
        runs=runs or config.run.runs, baseline_runs=s.baseline_runs,
        candidates_per_step=s.candidates_per_step or slots, t_start=s.t_start, t_end=s.t_end,
        remeasure_every=s.remeasure_every, max_flips=s.max_flips, worker_class=worker_class)


def params_of(experiment: Experiment, config) -> SearchParams:
    """Search parameters from a rundir's experiment record (so a resume uses the same)."""
    e = experiment
    return SearchParams(
        algorithm=e.algorithm, steps=e.steps, seed=e.seed, size=e.size, runs=e.runs,
        baseline_runs=e.baseline_runs, candidates_per_step=e.candidates_per_step,
        t_start=e.t_start, t_end=e.t_end, remeasure_every=e.remeasure_every,
        max_flips=e.max_flips, timeout=config.run.timeout, perf=config.run.perf)
