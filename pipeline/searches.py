"""``run_training_experiments``' procedure: a search chain per task, one rundir each.

The chains are planned (``dispatcher.planning``) or resumed, run side by side under the
long-run protocol (``pipeline.longrun``: a status line per chain, the graceful stop, the
session aborting in its own exit), then plotted.  What they did comes back as a
``SearchReport`` for the command to word.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from dispatcher.build.manifest import Benchmark, ManifestError, bundled_benchmarks
from dispatcher.build.toolchain import CompilerNotFound
from dispatcher.config import Config, ConfigError, load_config, with_metric
from dispatcher.core.rundir import Rundir, RundirError
from dispatcher.cpu_split import split_config
from dispatcher.planning import (
    Overrides,
    PlanError,
    check_new_outputs,
    open_resumes,
    plan_chains,
    task_benchmarks,
)
from dispatcher.running.backend import EXACT_CLASS
from dispatcher.running.scheduler import Scheduler
from dispatcher.search.chain import Chain, ChainStatus
from dispatcher.session import Session
from dispatcher.storage.store import StoreError
from pipeline.longrun import Ending, GracefulStop, StatusLine, progress, watch

#: The one-line errors of bad input or a refused plan (each names what is wrong).
INPUT_ERRORS = (ConfigError, ManifestError, CompilerNotFound, RundirError, StoreError,
                PlanError)
STOPPING = "stopping: runs in flight are dropped and done again on --resume"


@dataclass(frozen=True)
class SearchRequest:
    """What run_training_experiments was asked: new chains for ``tasks_file``'s benchmarks
    (default: the training split) with ``overrides``, or ``resume``'s rundirs continued."""

    config_path: Path | None = None
    tasks_file: Path | None = None
    overrides: Overrides = Overrides()
    resume: tuple[Path, ...] = ()


@dataclass(frozen=True)
class Searched:
    """How one chain ended (its status as the progress lines showed it) and its rundir."""

    status: ChainStatus
    rundir: Path


@dataclass(frozen=True)
class SearchReport:
    chains: list[Searched]
    busy: float  # the share of slot time spent running jobs
    wall: float  # seconds the chains ran
    slots: int
    lost_workers: list[str]
    plot_notes: list[str]  # plots that could not be made (a plot never costs the run)
    ending: Ending


@dataclass(frozen=True)
class _Work:
    """What the chains run with: the config split between compiles and runs, the new
    benchmarks and the resumed rundirs."""

    config: Config
    benches: list[Benchmark]
    resumed: list[tuple[Rundir, Benchmark]]


def run_searches(request: SearchRequest, stop: GracefulStop) -> SearchReport | None:
    """Plan or resume the chains, run them to their end (or the stop), plot them.  None when
    every rundir to resume had already finished.  One of INPUT_ERRORS for bad input."""
    work = _work(request)
    if work is None:
        return None
    session = Session(work.config)
    with session:
        session.stop_on(stop.event)
        measurements = session.start_workers()
        scheduler = session.scheduler
        # an exact chain's candidates may also run on the CPUs lent to exact jobs
        lent = sum(x.worker_class == EXACT_CLASS for x in scheduler.slots) \
            if work.config.measure.metric != "time" else 0
        slots = {c: sum(x.worker_class == c for x in scheduler.slots) + lent
                 for c in session.worker_classes}
        plan = plan_chains(work.config, work.benches, work.resumed, request.overrides, slots,
                           session.builds.toolchain, datetime.now().strftime("%Y%m%d-%H%M%S"))
        for note in plan.notes:
            progress(note)
        chains = [Chain.of_rundir(c.rundir, c.bench, work.config, session.builds,
                                  measurements, c.worker_class, stop.event)
                  for c in plan.chains]
        stop.arm(lambda: [(c.status.state, c.rundir.path) for c in chains])
        t0 = time.monotonic()
        _search_all(chains, scheduler, t0)
    wall = time.monotonic() - t0
    busy = sum(scheduler.busy_s.values()) / max(wall * len(scheduler.slots), 1e-9)
    notes = [] if stop.is_set() else plot_chains(chains, stop)
    for c in chains:
        c.rundir.close()  # the lock: a --resume may start now
    return SearchReport([Searched(c.status, c.rundir.path) for c in chains], min(busy, 1.0),
                        wall, len(scheduler.slots), session.lost_workers(), notes,
                        Ending.of(stop, [(c.status.state, c.rundir.path) for c in chains]))


def _work(request: SearchRequest) -> _Work | None:
    """The config, with its CPU split for the benchmarks to run, and what to run."""
    config = load_config(request.config_path)
    if request.resume:
        resumes = open_resumes(request.resume)
        for done in resumes.finished:
            progress(f"{done.path}: already finished; nothing to resume")
        _plot_unplotted([done.path for done in resumes.finished])
        if not resumes.rundirs:
            return None
        first = resumes.rundirs[0][0].experiment
        # a resume measures in its rundirs' metric, whatever the config says: workers are
        # checked for the exact metric only when a chain resumed counts (its confirmation, in
        # time, needs nothing more)
        exact = [r.experiment.metric for r, _ in resumes.rundirs if r.experiment.metric != "time"]
        config = with_metric(config, exact[0] if exact else "time")
        config, split = split_config(config, [b for _, b in resumes.rundirs], first.size,
                                     first.runs)
        benches: list[Benchmark] = []
        resumed = resumes.rundirs
    else:
        o = request.overrides
        benches = (task_benchmarks(request.tasks_file) if request.tasks_file
                   else bundled_benchmarks("training"))
        check_new_outputs(config)
        config = with_metric(config, o.metric)
        config, split = split_config(config, benches, o.size or config.run.size,
                                     o.runs or config.run.runs)
        resumed = []
    if split:
        progress(split)
    return _Work(config, benches, resumed)


def _search_all(chains: list[Chain], scheduler: Scheduler, t0: float) -> None:
    """The chains side by side, a thread each, with their status lines until all ended."""
    threads = [threading.Thread(target=c.run, daemon=True) for c in chains]
    for t in threads:
        t.start()

    def busy_now() -> float:
        elapsed = max(time.monotonic() - t0, 1e-9)
        return min(sum(scheduler.busy_s.values()) / (elapsed * len(scheduler.slots)), 1.0)

    watch(lambda: any(t.is_alive() for t in threads),
          lambda: [plain_line(c.status, busy_now()) for c in chains],
          lambda: [live_line(c.status, busy_now()) for c in chains])


def plot_chains(chains: list[Chain], stop: GracefulStop) -> list[str]:
    """Each chain's plot (matplotlib takes seconds to import: not after a stop, while the
    user waits); a line for each that could not be made."""
    from analysis.plots import plot_experiment
    notes = []
    for c in chains:
        if stop.is_set():
            break
        try:
            plot_experiment(c.rundir.path)
        except Exception as exc:  # a plot is a convenience: never lose the run over it
            notes.append(f"{c.rundir.path}: no plot ({exc})")
    return notes


def _plot_unplotted(rundirs: list[Path]) -> None:
    """The plot of each finished rundir that has none: its chain ended in a run a stop cut
    short later (plots are drawn only when no stop came), so a resume draws it."""
    missing = [p for p in rundirs if not (p / "plot.png").exists()]
    if not missing:
        return
    from analysis.plots import plot_experiment
    for path in missing:
        try:
            plot_experiment(path)
        except Exception as exc:  # a plot is a convenience: never lose the run over it
            progress(f"{path}: no plot ({' '.join(str(exc).split())})")


def best_figure(status: ChainStatus) -> str:
    """The chain's best speedup as the journal has it (paired, with its interval); once the
    confirmation found it no better than the heuristic, that is what it says."""
    best = "-" if status.best_energy is None else f"{1 / status.best_energy:.3f}x"
    if status.best_ci is not None:
        best += f" [{status.best_ci[0]:.3f}, {status.best_ci[1]:.3f}]"
    if status.none_better:
        return f"no candidate beat the heuristic ({status.none_better})"
    if status.confirmed:
        best += " confirmed"
    return best


def live_line(status: ChainStatus, slots_busy: float, width: int = 20) -> str:
    """The chain's line on a terminal, redrawn in place."""
    done = int(width * status.step / max(status.steps, 1))
    bar = "#" * done + "-" * (width - done)
    unresolved = f"  {status.unresolved} unresolved" if status.unresolved else ""
    return (f"{status.task:14} [{bar}] step {status.step:>4}/{status.steps:<4} "
            f"best {best_figure(status):>7}  busy {100 * slots_busy:3.0f}%{unresolved}  "
            f"{status.state}")


def plain_line(status: ChainStatus, slots_busy: float) -> StatusLine:
    """The chain's line in a log: a new one for a step done, a best changed, a phase."""
    phase = "searching" if status.state in ("compiling", "running") else status.state
    unresolved = f", {status.unresolved} unresolved" if status.unresolved else ""
    return StatusLine(
        (status.step, phase, status.best_energy, status.confirmed, status.none_better,
         status.unresolved),
        f"{status.task}: step {status.step}/{status.steps}, best {best_figure(status)}, busy "
        f"{100 * slots_busy:.0f}%{unresolved}, {status.state} ({status.rundir})")
