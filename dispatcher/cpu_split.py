"""The automatic split of this machine's CPUs between timing runs and compiling
(``local.cpus: auto`` for a search).

Every search candidate costs one compile, on a CPU left to the master, and one run job, on a
worker slot.  With ``c`` compile CPUs taking ``C`` seconds per compile and ``w`` slots taking
``R`` seconds per run job, a search makes at most ``min(c / C, w / R)`` candidates a second:
too few slots and compiled candidates queue, too few compile CPUs and slots idle.  The split
is the ``w`` that maximises that bound, from ``C`` and ``R`` measured at start on the tasks'
own baselines (``calibrate``); ties go to more compile CPUs, which also carry the master's
own threads.  Choosing (``choose_split``) is pure; calibrating does the I/O.

``C`` is the compile of one candidate one flip away from the baseline, as a search step
compiles it (only the units its flips touch, then the link); ``R`` is the first measurement
job of a candidate: ``run.runs`` pairs of runs (candidate and baseline), so twice ``runs``
runs of the baseline's length.  A candidate whose interval needs more pairs costs more slot
time, which the split does not foresee: the bound is an upper one.

In an exact metric a candidate's job is one count under cachegrind (the baseline's is
counted once), and the compile CPUs count too whenever no compile needs them (the local
backend lends them, at the lowest priority): all ``n`` CPUs share ``C + R`` per candidate, so
at most ``n / (C + R)`` candidates a second, and ``c`` compile CPUs keep pace with that while
``c / C`` is not below it.  The split is the fewest compile CPUs that keep pace: the others
can also time runs (a chain's winner is confirmed in wall time), which a lent CPU cannot.
"""
from __future__ import annotations

import random
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from dispatcher.build.manifest import Benchmark
from dispatcher.build.service import CompileError, CompileJob, CompileService
from dispatcher.config import Config
from dispatcher.core.tree import Tree, to_overrides
from dispatcher.running.exact import SLOWDOWN
from dispatcher.running.local import LocalConfig, agent_cpus
from dispatcher.search.rules import propose
from dispatcher.session import Session
from workers.agent import cachegrind

TRIES = 8  # proposals tried for a candidate the store does not hold already


@dataclass(frozen=True)
class Calibration:
    """What one search candidate costs, averaged over the calibrated benchmarks."""

    compile_s: float  # one candidate's compile, on one CPU
    run_job_s: float  # one candidate's first run job (exact: its count), on one slot
    benchmarks: tuple[str, ...]
    exact: bool = False  # run jobs are counts, which the compile CPUs run too when idle


@dataclass(frozen=True)
class CpuSplit:
    workers: tuple[int, ...]  # one worker slot each
    compilers: tuple[int, ...]  # compiles (and the master's threads) run here
    bound: float  # candidates per second the split allows at most

    def describe(self, calibration: Calibration) -> str:
        def cpus(xs: tuple[int, ...]) -> str:
            return ",".join(map(str, xs))
        if calibration.exact:
            return (f"automatic split: {len(self.compilers)} CPUs compile "
                    f"({cpus(self.compilers)}) and count when idle, {len(self.workers)} count "
                    f"and time runs ({cpus(self.workers)}); measured on "
                    f"{', '.join(calibration.benchmarks)}: {calibration.compile_s:.3g} s per "
                    f"compile, {calibration.run_job_s:.3g} s per count; at most "
                    f"{self.bound:.3g} candidates/s")
        return (f"automatic split: {len(self.workers)} CPUs time runs ({cpus(self.workers)}), "
                f"{len(self.compilers)} compile ({cpus(self.compilers)}); measured on "
                f"{', '.join(calibration.benchmarks)}: {calibration.compile_s:.3g} s per "
                f"compile, {calibration.run_job_s:.3g} s per run job; at most "
                f"{self.bound:.3g} candidates/s")


def bound(compile_cpus: int, worker_cpus: int, calibration: Calibration) -> float:
    """Candidates per second that ``compile_cpus`` and ``worker_cpus`` allow at most (exact:
    the compile CPUs count too when no compile needs them)."""
    compiles = compile_cpus / calibration.compile_s
    if calibration.exact:
        cpus = compile_cpus + worker_cpus
        return min(compiles, cpus / (calibration.compile_s + calibration.run_job_s))
    return min(compiles, worker_cpus / calibration.run_job_s)


def choose_split(cpus: Sequence[int], calibration: Calibration) -> CpuSplit:
    """The split of ``cpus`` (at least two) that allows the most candidates per second; the
    lowest-numbered CPUs compile (CPU 0 also takes most interrupts).  Among equal bounds, the
    most compile CPUs when timing (they carry the master's threads too), the fewest when
    counting (the compile CPUs count as well; the others can also time a confirmation)."""
    ordered = tuple(sorted(cpus))
    if len(ordered) < 2:
        raise ValueError("a split needs at least two CPUs")
    n = len(ordered)
    more = -1 if calibration.exact else 1
    compilers = max(range(1, n), key=lambda c: (bound(c, n - c, calibration), more * c))
    return CpuSplit(workers=ordered[compilers:], compilers=ordered[:compilers],
                    bound=bound(compilers, n - compilers, calibration))


class CalibrationError(RuntimeError):
    """No benchmark could be calibrated; the message is one line."""


def _run_seconds(binary: str, args: Sequence[str], timeout: float) -> float:
    t0 = time.perf_counter()
    subprocess.run([binary, *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=timeout, check=True)
    return time.perf_counter() - t0


def _count_seconds(binary: str, args: Sequence[str], timeout: float) -> float:
    """One count of ``binary`` under cachegrind, as an exact job runs it: its seconds."""
    probe = cachegrind.probe()
    if not probe["available"]:
        raise OSError(f"cannot count: {probe['reason']}")
    with tempfile.TemporaryDirectory(prefix="calibrate-") as scratch:
        t0 = time.perf_counter()
        subprocess.run(cachegrind.wrap(probe["path"], [binary, *args], scratch),
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, env=dict(cachegrind.BASE_ENV),
                       timeout=timeout * SLOWDOWN, check=True)
        return time.perf_counter() - t0


def calibrate(compiler: CompileService, benches: Sequence[Benchmark], size: str, runs: int,
              timeout: float, most: int = 3, exact: bool = False) -> Calibration:
    """Compile and run the baselines of (at most ``most`` of) ``benches``, and compile one
    candidate of each: what a candidate costs (``exact``: its run job one count under
    cachegrind).  A benchmark that fails either is passed over; CalibrationError if all
    do."""
    compiles: list[float] = []
    jobs: list[float] = []
    names: list[str] = []
    errors: list[str] = []
    for bench in benches[:most]:
        try:
            base = compiler.compile(CompileJob(bench))
            tree = Tree.from_dumps(base.artifact.dumps())
            rng = random.Random(0)
            seconds = None
            for _ in range(TRIES):
                candidate, _how = propose(tree, rng)
                result = compiler.compile(CompileJob(bench, to_overrides(candidate)))
                if not result.cached:
                    seconds = result.seconds
                    break
            if seconds is None:  # every proposal stored already: a whole build's time
                seconds = base.seconds if not base.cached else None
            args = bench.size(size).args
            job_s = (_count_seconds(str(base.binary), args, timeout) if exact
                     else 2 * runs * _run_seconds(str(base.binary), args, timeout))
        except (CompileError, OSError, subprocess.SubprocessError) as exc:
            errors.append(f"{bench.name}: {str(exc).splitlines()[0] if str(exc) else exc}")
            continue
        if seconds is not None:
            compiles.append(seconds)
        jobs.append(job_s)
        names.append(bench.name)
    if not compiles or not jobs:
        why = errors[0] if errors else "every candidate tried was in the store already"
        raise CalibrationError(f"cannot calibrate the automatic CPU split ({why})")
    return Calibration(compile_s=statistics.mean(compiles), run_job_s=statistics.mean(jobs),
                       benchmarks=tuple(names), exact=exact)


def split_config(config: Config, benches: Sequence[Benchmark], size: str, runs: int,
                 cpus: Sequence[int] | None = None) -> tuple[Config, str | None]:
    """``config`` with its local CPUs split by measurement, and the line that says so; as it
    is (and None) unless the local backend's ``cpus`` is ``auto`` on more than two CPUs
    (``cpus``: this process's, by default).  With two, one times runs and one compiles
    whatever the figures.  ``compile.jobs: auto`` follows the split; a number stays."""
    local = config.backend_settings
    cpus = tuple(sorted(agent_cpus() if cpus is None else cpus))
    if config.backend != "local" or not isinstance(local, LocalConfig) or not local.auto \
            or len(cpus) <= 2:
        return config, None
    with Session(config) as session:
        try:
            calibration = calibrate(session.builds, benches, size, runs, config.run.timeout,
                                    exact=config.measure.metric != "time")
        except CalibrationError as exc:  # the search itself will say what is wrong
            return config, f"{exc}: every CPU but one times runs"
    split = choose_split(cpus, calibration)
    backends = {**config.backends, "local": replace(local, cpus=split.workers)}
    jobs = len(split.compilers) if config.compile_jobs_auto else config.compile_jobs
    return replace(config, backends=backends, compile_jobs=jobs), split.describe(calibration)
