"""Compile builds of benchmarks, then measure each against its benchmark's heuristic build.

The one driver behind ``run-benchmark``'s speedup line, ``run-all-benchmarks`` (optimal
trees) and ``run-plugin-benchmark`` (policies), in the config's ``measure.metric``: every
build is asked for at once (each benchmark's heuristic first, so a comparison never waits for
it), a comparison starts as soon
as its build lands, and each outcome is handed back as soon as it ends, so a command can write
its results file while the others are still measured.  Comparisons are paired and interleaved
on one slot, as the search measures a candidate, or under an exact metric one counted run
of each binary (docs/measurement.md).

Commands word the outcomes; this module never prints.
"""
from __future__ import annotations

from collections.abc import Generator, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Generic, TypeVar

from dispatcher.build.manifest import Benchmark, Size
from dispatcher.build.service import CompileError, CompileJob, CompileResult
from dispatcher.config import Config
from dispatcher.core.comparison import Comparison
from dispatcher.core.decisions import OverrideReach, override_reach
from dispatcher.core.jobs import RunJob
from dispatcher.running.agent_client import AgentError
from dispatcher.running.measurement import PairingPolicy, ReferenceFailed
from dispatcher.session import Session

T = TypeVar("T")


def run_job(config: Config, size: Size, compiled: CompileResult, runs: int) -> RunJob:
    """The run job of a compiled benchmark at ``size``, with the config's run settings."""
    return RunJob(sha256=compiled.sha256, binary=compiled.binary, args=size.args, runs=runs,
                  timeout=config.run.timeout, expected_output=size.expected.to_json(),
                  perf=config.run.perf, aslr=config.run.aslr)


def pairing_policy(config: Config, runs: int, max_pairs: int | None = None) -> PairingPolicy:
    """At least ``runs`` pairs, at most ``max_pairs`` (default ``measure.max_pairs``, never
    fewer than ``runs``), stopping early at the config's ``measure.half_width``."""
    most = config.measure.max_pairs if max_pairs is None else max_pairs
    return PairingPolicy.between(runs, most, config.measure.half_width)


def heuristic_comparison(session: Session, bench: Benchmark, job: RunJob,
                         policy: PairingPolicy, remeasure: bool = False) -> Future[Comparison]:
    """Start measuring ``job``'s binary against the heuristic build of ``bench`` (same
    arguments and settings) on one slot of the first slot's worker class.  A comparison
    measured before with the same binaries and policy comes from the store unless
    ``remeasure``.  In the config's ``measure.metric``: time (pairs), or an exact metric (one
    counted run of each: ``MeasurementService.compare``).

    Raises CompileError when the heuristic build fails; the future raises AgentError (the
    workers were lost) or ReferenceFailed (a run of the heuristic failed)."""
    measurements = session.start_workers()
    worker_class = session.scheduler.slots[0].worker_class
    heuristic = session.builds.compile(CompileJob(bench))
    reference = replace(job, sha256=heuristic.sha256, binary=heuristic.binary)
    return measurements.compare(reference, job, worker_class, policy, reuse=not remeasure,
                                metric=session.config.measure.metric)


@dataclass(frozen=True)
class Contender(Generic[T]):
    """One build to measure against its benchmark's heuristic build; ``tag`` is the caller's
    (an optimal tree, a policy's name)."""

    tag: T
    bench: Benchmark
    build: CompileJob
    size: Size


class Failure(str, Enum):
    COMPILE = "compile"  # the contender's build failed (OverridesMismatch among them)
    HEURISTIC = "heuristic"  # the heuristic build of its benchmark failed
    MEASURE = "measure"  # the comparison could not be finished (workers lost, a run failed)


@dataclass(frozen=True)
class Compared(Generic[T]):
    """A contender's outcome: its comparison, or why there is none (``error``, one line).
    A benchmark whose heuristic build fails is reported once, for its first contender; its
    other contenders are not measured and not reported again."""

    contender: Contender[T]
    comparison: Comparison | None = None
    failure: Failure | None = None
    error: Exception | None = None
    compiled: CompileResult | None = None  # the contender's build, once it compiled

    def override_reach(self) -> OverrideReach | None:
        """What the contender's overrides did not reach in its build (None: not built)."""
        if self.compiled is None:
            return None
        return override_reach(self.contender.build.overrides, self.compiled.artifact.dumps())


def compare_with_heuristic(session: Session, contenders: Iterable[Contender[T]], runs: int,
                           pairing: PairingPolicy, remeasure: bool = False
                           ) -> Generator[Compared[T], None, None]:
    """Each contender's comparison with its benchmark's heuristic build, as each ends.
    Closing the iterator early (Ctrl-C) cancels the builds not started yet.  The workers start
    first: a backend that builds (Ray's compile nodes, the simulated builder) takes the builds
    only from then on, and a build asked for before would go to this machine's compiler."""
    session.start_workers()
    compiling: list[tuple[Future[CompileResult], Contender[T] | None, Contender[T]]] = []
    pending: list[tuple[Future[Comparison], Contender[T], CompileResult]] = []
    failed: set[Any] = set()  # benchmarks (directories) whose heuristic build failed
    submitted: set[Any] = set()
    try:
        for c in contenders:
            if c.bench.directory not in submitted:
                submitted.add(c.bench.directory)
                compiling.append((session.builds.submit(CompileJob(c.bench)), None, c))
            compiling.append((session.builds.submit(c.build), c, c))
        while compiling or pending:
            futures: set[Future[Any]] = ({f for f, _, _ in compiling}
                                         | {f for f, _, _ in pending})
            wait(futures, return_when=FIRST_COMPLETED)
            for item in [x for x in compiling if x[0].done()]:
                compiling.remove(item)
                future, contender, first = item
                if first.bench.directory in failed:
                    continue
                try:
                    compiled = future.result()
                except CompileError as exc:
                    if contender is None:
                        failed.add(first.bench.directory)
                        yield Compared(first, failure=Failure.HEURISTIC, error=exc)
                    else:
                        yield Compared(contender, failure=Failure.COMPILE, error=exc)
                    continue
                if contender is None:
                    continue
                job = run_job(session.config, contender.size, compiled, runs)
                try:
                    pending.append((heuristic_comparison(session, contender.bench, job,
                                                         pairing, remeasure), contender,
                                    compiled))
                except CompileError as exc:  # the heuristic's build, asked for again
                    failed.add(contender.bench.directory)
                    yield Compared(contender, failure=Failure.HEURISTIC, error=exc,
                                   compiled=compiled)
            for done in [p for p in pending if p[0].done()]:
                pending.remove(done)
                future_c, contender, built = done
                try:
                    yield Compared(contender, comparison=future_c.result(), compiled=built)
                except (AgentError, ReferenceFailed) as exc:
                    yield Compared(contender, failure=Failure.MEASURE, error=exc,
                                   compiled=built)
    finally:
        for f, _, _ in compiling:  # builds not started yet are not waited for
            f.cancel()
