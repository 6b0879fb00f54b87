"""``measure-sites``' procedure: each inlining decision's effect measured (docs/labels.md).

The labels rundirs are planned (``dispatcher.labels.planning``) or resumed, a labeller per
benchmark runs under the long-run protocol (``pipeline.longrun``: status lines, the graceful
stop, the session aborting in its own exit), then each benchmark's labels table, report and
plot are written (``analysis.labels``).  Under time the labellers run one after another (a
timed label takes every slot of its class); under an exact metric one per worker slot run at
once (``labellers_at_once``), each in a thread of its own, so one compiles while another's
binaries are counted.  What it did comes back as a ``SitesReport`` for the command to word.
"""
from __future__ import annotations

import collections
import math
import queue
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from dispatcher.build.manifest import (
    Benchmark,
    ManifestError,
    load_benchmark,
    resolve_benchmark,
)
from dispatcher.config import Config, load_config, with_metric
from dispatcher.core.decisions import MAX_OVERRIDES, parse_overrides
from dispatcher.core.files import read_regular_text
from dispatcher.core.rundir import SitesRundir, check_batch_log, check_rundirs_dir
from dispatcher.core.site_records import ALWAYS_INLINE, HEURISTIC
from dispatcher.labels.planning import (
    Job,
    LabelsSettings,
    gain_first,
    open_label_resumes,
    plan_labels,
    search_rundirs,
)
from dispatcher.labels.procedure import LabelsStatus, SiteLabeller, enable_cycle_counts
from dispatcher.planning import PlanError, rundir_name, task_benchmarks
from dispatcher.session import Session
from pipeline.longrun import Ending, GracefulStop, StatusLine, progress, watch
from pipeline.searches import INPUT_ERRORS

__all__ = ["INPUT_ERRORS", "STOPPING", "SitesReport", "SitesRequest", "measure_sites"]
STOPPING = "stopping: tests in flight are dropped and measured again on --resume"
MAX_TREE_BYTES = MAX_OVERRIDES * 4096  # an overrides file of the most entries, long keys


@dataclass(frozen=True)
class SitesRequest:
    """What measure-sites was asked: new labels rundirs from ``rundirs`` (search rundirs),
    ``batch_log``'s searches, ``tasks_file``'s benchmarks and ``trees`` (BENCH=FILE); or
    ``resume``'s labels rundirs continued.  None: the config's (or the default)."""

    config_path: Path | None = None
    rundirs: tuple[Path, ...] = ()
    batch_log: Path | None = None
    tasks_file: Path | None = None
    trees: tuple[str, ...] = ()
    sweep: int | None = None
    size: str | None = None
    runs: int | None = None
    max_pairs: int | None = None
    keep: float = 0.9
    max_tests: int = 64
    retest: bool = False
    labels_dir: Path = Path("labels")
    resume: tuple[Path, ...] = ()
    metric: str | None = None  # what tests are measured in (None: measure.metric)
    cycles: bool = True  # labels measured in time counted in cycles too, where workers can
    # under an exact metric: the size labels are confirmed at in wall time, and the |log
    # effect| from which they are (None: the defaults, dispatcher.labels.planning)
    confirm_size: str | None = None
    confirm_above: float | None = None
    # the build labels flip sites of and are measured against: heuristic (None),
    # always-inline, or an overrides file (dispatcher.labels.reference)
    reference: str | None = None


@dataclass(frozen=True)
class Labelled:
    """How one benchmark's labeller ended (``running``: never started)."""

    task: str
    rundir: Path
    state: str
    error: str | None


@dataclass(frozen=True)
class LabelsTable:
    """One benchmark's labels table as written (``files``, the report's ``lines``), or
    ``error``: why none was (the rundir stays; a --resume writes it)."""

    name: str
    lines: list[str]
    files: list[Path]
    error: str | None = None
    rundir: Path | None = None  # the labels rundir it is made from


@dataclass(frozen=True)
class SitesReport:
    labelled: list[Labelled]
    tables: list[LabelsTable]
    lost_workers: list[str]
    ending: Ending


def measure_sites(request: SitesRequest, stop: GracefulStop) -> SitesReport:
    """Plan or resume the labels rundirs, measure them, write their tables (a resumed rundir
    that had already finished gets its table written again: the run that finished it may
    have been stopped before it wrote it).  One of INPUT_ERRORS for bad input."""
    config = with_metric(load_config(request.config_path), request.metric)
    finished: list[SitesRundir] = []
    if request.resume:
        jobs, finished = open_label_resumes(request.resume)
        exact = [rd.experiment.metric for rd, _ in jobs if rd.experiment.metric != "time"]
        config = with_metric(config, exact[0] if exact else "time")  # the rundirs' metric
        check_labels_dir(request.labels_dir)
        for rd in finished:
            progress(f"{rd.path}: already finished; nothing to resume (its labels table is "
                     "written again)")
        if not jobs:
            return SitesReport([], write_tables([], finished, request.labels_dir), [],
                               Ending.of(stop, []))
        inputs = None
    else:
        check_confirmation(request, config.measure.metric)
        inputs = _inputs(request, config)
    session = Session(config)
    with session:
        session.stop_on(stop.event)
        counted = config.measure.metric != "time"
        counts = counted or (any(rd.experiment.cycles_size for rd, _ in jobs)
                             if inputs is None else request.cycles)
        if counts:  # workers that cannot count: before any rundir
            session.start_workers()
        if counts and not counted:  # a label's cycles effect beside its wall effect
            why = enable_cycle_counts(session.backend.slots, session.measurements)
            if why is not None:
                progress(f"labels carry no cycles effect: {why}")
                counts = False
        if inputs is not None:
            jobs = _plan(request, config, session, *inputs, cycles=counts)
        measurements = session.start_workers()
        labellers = [SiteLabeller(rd, bench, session.builds, measurements, stop.event,
                                  count_cycles=counts)
                     for rd, bench in sorted(jobs, key=gain_first)]
        stop.arm(lambda: [(lab.status.state, lab.rundir.path) for lab in labellers])
        _label_all(labellers, stop, labellers_at_once(config.measure.metric,
                                                      len(session.backend.slots)),
                   defer=config.measure.metric != "time")
    for lab in labellers:
        lab.rundir.close()  # the lock: a --resume may start now
    return SitesReport(
        [Labelled(lab.status.task, lab.rundir.path, lab.status.state, lab.status.error)
         for lab in labellers],
        write_tables(labellers, finished, request.labels_dir), session.lost_workers(),
        Ending.of(stop, [(lab.status.state, lab.rundir.path) for lab in labellers]))


Inputs = tuple[list[Path], list[Benchmark], list[tuple[Benchmark, Path]],
               tuple[str | None, str | None]]


def _inputs(request: SitesRequest, config: Config) -> Inputs:
    """The search rundirs, swept benchmarks, trees and reference asked for, every one
    checked before a rundir is made."""
    sources = search_rundirs(request.rundirs, request.batch_log)
    swept = task_benchmarks(request.tasks_file) if request.tasks_file else []
    trees = [tree_option(t) for t in request.trees]
    if not sources and not swept and not trees:
        raise PlanError("nothing to measure: give search rundirs, --batch-log, --tree or "
                        "--tasks")
    reference = reference_option(request.reference, swept)
    if reference[0] is not None and (sources or trees):
        raise PlanError(f"--reference {request.reference}: only with --tasks (a sweep of the "
                        "sites it inlined); a search's winner or a --tree is attributed "
                        "against the heuristic's build")
    check_batch_log(config.search.batch_log)
    check_rundirs_dir(config.search.rundirs)
    check_labels_dir(request.labels_dir)
    return sources, swept, trees, reference


def reference_option(value: str | None, benches: Sequence[Benchmark]
                     ) -> tuple[str | None, str | None]:
    """``--reference``: (what the rundirs record, None for the heuristic; a tree's text, read
    now and checked against every benchmark to sweep, or None).  PlanError (one line)."""
    if value is None or value == HEURISTIC:
        return None, None
    if value == ALWAYS_INLINE:
        return ALWAYS_INLINE, None
    if not value.endswith(".sexp"):
        raise PlanError(f"--reference {value}: expected heuristic, always-inline or an "
                        "overrides file (PATH.sexp)")
    path = Path(value)
    try:
        text = read_regular_text(path, MAX_TREE_BYTES)
        overrides = parse_overrides(text, str(path))
    except FileNotFoundError:
        raise PlanError(f"{path}: --reference: no such file") from None
    except ValueError as exc:  # not a regular file, too large, not UTF-8, malformed
        raise PlanError(" ".join(str(exc).split())) from None
    for bench in benches:
        units = {u.module for u in bench.units() if u.is_impl}
        strangers = sorted({o.unit for o in overrides} - units)
        if strangers:
            raise PlanError(f"{path}: --reference: its decisions are for unit {strangers[0]}, "
                            f"which {bench.name} does not have: a tree of another program?")
    return str(path.resolve()), text


def check_confirmation(request: SitesRequest, metric: str) -> None:
    """``--confirm-size`` and ``--confirm-above`` only under an exact metric (under time every
    label is in wall time already: ``--retest``), the threshold a finite log effect >= 0;
    PlanError (one line) otherwise, before anything is made.  A size no benchmark has is
    refused by the planning, likewise."""
    asked = [o for o, v in (("--confirm-size", request.confirm_size),
                            ("--confirm-above", request.confirm_above)) if v is not None]
    if asked and metric == "time":
        raise PlanError(f"{' and '.join(asked)}: only under an exact metric (--metric cycles "
                        "or instructions), whose labels are confirmed in wall time; under "
                        "time, --retest measures every label again")
    above = request.confirm_above
    if above is not None and not (math.isfinite(above) and above >= 0.0):
        raise PlanError(f"--confirm-above {above}: expected a log effect of 0 or more (0: "
                        "confirm every measured label)")
    if request.confirm_size is not None and not request.confirm_size.strip():
        raise PlanError("--confirm-size: expected a benchmark size (tiny, quick, full)")


def check_labels_dir(directory: Path) -> None:
    """``--labels`` can hold the tables: a directory (made if need be) a file can be written
    in; PlanError (one line) otherwise, before anything is measured."""
    if directory.exists() and not directory.is_dir():
        raise PlanError(f"{directory}: --labels: not a directory (the labels tables go there)")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):  # O_TMPFILE: never a name left behind
            pass
    except OSError as exc:
        raise PlanError(f"{directory}: --labels: cannot write the labels tables there "
                        f"({exc.strerror or exc})") from None


def tree_option(value: str) -> tuple[Benchmark, Path]:
    """``BENCH=FILE``: the benchmark (a bundled name or a directory) and an overrides file,
    read now so a malformed one is refused before anything starts."""
    bench, sep, file = value.partition("=")
    if not sep or not bench or not file:
        raise PlanError(f"--tree {value}: expected BENCH=FILE (a benchmark and an overrides "
                        "file)")
    path = Path(file)
    benchmark = resolve_benchmark(bench)
    try:
        overrides = parse_overrides(read_regular_text(path, MAX_TREE_BYTES), str(path))
    except FileNotFoundError:
        raise PlanError(f"{path}: --tree {bench}: no such file") from None
    except ValueError as exc:  # not a regular file, too large, not UTF-8, malformed
        raise PlanError(" ".join(str(exc).split())) from None
    units = [u.module for u in benchmark.units() if u.is_impl]
    strangers = sorted({o.unit for o in overrides} - set(units))
    if strangers:
        raise PlanError(f"{path}: --tree {bench}: its decisions are for unit "
                        f"{', '.join(strangers[:3])}{', ...' if len(strangers) > 3 else ''}, "
                        f"which {benchmark.name} does not have (its units: {', '.join(units)}):"
                        " a tree of another program?")
    return benchmark, path.resolve()


def _plan(request: SitesRequest, config: Config, session: Session, sources: list[Path],
          swept: list[Benchmark], trees: list[tuple[Benchmark, Path]],
          reference: tuple[str | None, str | None] = (None, None),
          cycles: bool = False) -> list[Job]:
    r = request
    settings = LabelsSettings(
        size=r.size, default_size=config.run.size, runs=r.runs or config.run.runs,
        max_pairs=r.max_pairs or config.measure.max_pairs,
        half_width=config.measure.half_width, timeout=config.run.timeout,
        perf=config.run.perf, aslr=config.run.aslr, sweep=r.sweep, keep=r.keep,
        # an exact label is confirmed in wall time (those at least --confirm-above, at
        # --confirm-size): a label kept carries both (DESIGN, Labels)
        max_tests=r.max_tests, retest=r.retest or config.measure.metric != "time",
        rundirs=config.search.rundirs,
        batch_log=config.search.batch_log, config_raw=config.raw,
        metric=config.measure.metric, cycles=cycles, confirm_size=r.confirm_size,
        confirm_above=r.confirm_above, reference=reference[0], reference_tree=reference[1])
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    plan = plan_labels(settings, session.builds.toolchain.identity, session.worker_classes[0],
                       sources, swept, trees,
                       lambda bench, k: rundir_name(bench, "sites", k, stamp))
    for note in plan.notes:
        progress(note)
    return plan.jobs


def labellers_at_once(metric: str, slots: int) -> int:
    """How many labellers run at once: one under time (a timed label takes every slot of its
    class, and a timed run wants the machine quiet); under an exact metric one per worker
    slot, i.e. per CPU the exact jobs may use (the local backend lends the master's CPU to
    them too): a count depends on nothing else running, so one labeller compiles while
    another's binaries are counted or its wall-time retest runs."""
    return 1 if metric == "time" else max(1, slots)


def _label_all(labellers: list[SiteLabeller], stop: GracefulStop, at_once: int = 1,
               defer: bool = False) -> None:
    """The labellers, ``at_once`` at a time, each in one thread from start to end (its journal
    and status written by that thread only), taken in order: a stop leaves the rest
    unstarted.  Their status lines are shown until the last has ended.

    ``defer`` (an exact metric): a labeller's wall-time retests (its confirmations) are left
    to one thread of their own, taking labellers in the order their exact phase ended, so
    that the threads counting exact labels are never held waiting for the timed CPU: one
    confirmation at a time, as a timed label takes every slot of its class.  A labeller is
    in one thread at a time all the same (the confirmation thread takes it once the other
    has let it go)."""
    waiting = collections.deque(labellers)
    taking = threading.Lock()
    confirming: queue.Queue[SiteLabeller | None] = queue.Queue()

    def take() -> SiteLabeller | None:
        with taking:
            return waiting.popleft() if waiting and not stop.is_set() else None

    def ended(labeller: SiteLabeller) -> None:
        if labeller.status.state == "interrupted":  # its compiler was stopped by a Ctrl-C
            stop.set()  # (or a user's kill): the others are not begun

    def run_some() -> None:
        while (labeller := take()) is not None:
            if defer:
                labeller.run(defer_confirmation=True)
                if labeller.awaiting_confirmation:
                    confirming.put(labeller)
            else:
                labeller.run()
            ended(labeller)

    def confirm_all() -> None:
        while (labeller := confirming.get()) is not None:
            labeller.confirm()  # after a stop: ends it interrupted, for a --resume
            ended(labeller)

    threads = [threading.Thread(target=run_some, daemon=True, name=f"labeller-{i}")
               for i in range(max(1, min(at_once, len(labellers))))]
    confirmer = threading.Thread(target=confirm_all, daemon=True, name="confirmations")
    for thread in threads:
        thread.start()
    if defer:
        confirmer.start()

    closed = threading.Event()

    def at_work() -> bool:
        if any(t.is_alive() for t in threads):
            return True
        if not closed.is_set():  # the exact phases are over: the confirmations end after
            closed.set()  # theirs
            confirming.put(None)
        return confirmer.is_alive()

    watch(at_work, lambda: [status_line(lab.status) for lab in labellers])


def status_line(s: LabelsStatus) -> StatusLine:
    """A labeller's line: none before it starts; repeated only while it runs."""
    planned = f"/{s.planned}" if s.planned else ""
    last = f"; last: {s.last}" if s.last else ""
    starting = s.state == "running" and s.phase == "starting"
    return StatusLine(None if starting else (s.phase, s.tests, s.labels, s.state),
                      f"{s.task}: {s.phase}, {s.tests} test(s), {s.labels}{planned} "
                      f"label(s){last}", repeat=s.state == "running")


def write_tables(labellers: list[SiteLabeller], finished: list[SitesRundir],
                 labels_dir: Path) -> list[LabelsTable]:
    """The labels table, report and plot of each benchmark measured (one not started is
    left for a later --resume), and of each rundir resumed that had already finished."""
    from analysis.label_training import read_sites_table, table_path
    from analysis.labels import (
        LabelsError,
        label_rows,
        merged_table,
        plot_effects,
        report,
        write_table,
    )
    done: list[tuple[str, Path]] = []
    for rd in finished:
        try:
            done.append((load_benchmark(rd.experiment.benchmark).name, rd.path))
        except ManifestError as exc:
            done.append((Path(rd.experiment.benchmark).name, rd.path))
            progress(f"{rd.path}: {' '.join(str(exc).split())}")
    out = []
    for name, path in done + [(lab.benchmark.name, lab.rundir.path) for lab in labellers
                              if lab.status.phase != "starting"]:
        try:
            table = label_rows(path)
            directory = labels_dir / name
            before = table_path(labels_dir, name)  # its other references' rows are kept
            written = write_table(merged_table(
                table, read_sites_table(before) if before is not None else None), directory)
            lines = report([path], table)
            (directory / "report.txt").write_text("\n".join(lines) + "\n")
            plot = plot_effects(table, directory / "effects.png", f"{name}: labels",
                                SitesRundir(path).experiment.confirm_size)
        except (LabelsError, OSError, ValueError) as exc:  # a full disk, say: the rundir stays
            out.append(LabelsTable(name, [], [], " ".join(str(exc).split()), path))
            continue
        out.append(LabelsTable(name, lines, [*written, directory / "report.txt",
                                             *([plot] if plot else [])], rundir=path))
    return out
