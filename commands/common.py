"""What the commands share: warnings on stderr, one-line errors, lost-worker reports, and the
one way a command measures a build against the heuristic (``run-benchmark``'s comparison,
``run-all-benchmarks``)."""
from __future__ import annotations

import functools
import logging
from concurrent.futures import Future
from dataclasses import replace
from typing import Any, Callable, TypeVar

import click

from dispatcher.build.manifest import Benchmark, Size
from dispatcher.build.service import CompileJob, CompileResult
from dispatcher.config import Config
from dispatcher.core.jobs import RunJob
from dispatcher.running.backend import BackendUnavailable
from dispatcher.running.measurement import Comparison, PairingPolicy
from dispatcher.session import Session

F = TypeVar("F", bound=Callable[..., Any])


def backend_errors_in_one_line(command: F) -> F:
    """A backend that cannot start (a Ray cluster not there, no token) ends the command with
    its one line, whenever the workers are first needed."""
    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except BackendUnavailable as exc:
            raise click.ClickException(str(exc)) from None
    return wrapper  # type: ignore[return-value]


def show_warnings() -> None:
    """Lost workers, retried jobs and quarantined hosts are reported on stderr as they happen."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")


def report_lost_workers(session: Session) -> None:
    """Slots taken out of service, and slots still lost when the command ended."""
    for line in session.lost_workers():
        click.echo(line, err=True)


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
    """Start the workers if need be, then measuring ``job``'s binary against the heuristic
    build of ``bench`` (same arguments and settings): paired, interleaved, on one slot of the
    first slot's worker class, as the search measures a candidate (docs/measurement.md).  A
    comparison measured before with the same binaries and policy comes from the store unless
    ``remeasure``.

    Raises CompileError when the heuristic build fails; the future raises AgentError (the
    workers were lost) or ReferenceFailed (a run of the heuristic failed)."""
    measurements = session.start_workers()
    worker_class = measurements.scheduler.slots[0].worker_class
    heuristic = session.compiler.compile(CompileJob(bench))
    reference = replace(job, sha256=heuristic.sha256, binary=heuristic.binary)
    return measurements.compare(reference, job, worker_class, policy, reuse=not remeasure)
