"""``measure-sites``: each inlining decision's effect measured directly (docs/labels.md).

For each benchmark of the given search rundirs (or of a batch log's), the best tree its
searches confirmed is attributed decision by decision; a benchmark without one, or every one
with ``--sweep K``, gets its K hottest flippable sites flipped alone.  One labels rundir per
benchmark (listed in the batch log, resumable with ``--resume``), then the labels table
``<labels>/<bench>/sites.parquet`` and ``.csv``, a report and a plot.
"""
from __future__ import annotations

import faulthandler
import shlex
import signal
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import click

from commands.common import backend_errors_in_one_line, report_lost_workers, show_warnings
from dispatcher.build.manifest import (
    Benchmark,
    ManifestError,
    load_benchmark,
    resolve_benchmark,
)
from dispatcher.build.toolchain import CompilerNotFound
from dispatcher.config import MAX_RUNS, ConfigError, load_config
from dispatcher.core.decisions import read_overrides
from dispatcher.core.records import BatchEntry, RecordError, read_experiment
from dispatcher.core.rundir import (
    EXPERIMENT,
    RundirError,
    SitesRundir,
    append_batch_log,
    check_batch_log,
    check_rundirs_dir,
    read_batch_log,
)
from dispatcher.core.site_records import (
    SITES_FORMAT_VERSION,
    SITES_KIND,
    SitesExperiment,
    WinnerChoice,
    is_sites_rundir,
)
from dispatcher.labels.procedure import LabelsStatus, SiteLabeller
from dispatcher.labels.winner import confirmed_winner, search_compiler
from dispatcher.planning import PlanError, rundir_name, task_benchmarks
from dispatcher.session import Session
from dispatcher.storage.store import StoreError

DEFAULT_SWEEP = 10  # hottest sites of a benchmark no search confirmed a winner for
PLAIN_EVERY_S = 60.0


def _line(status: LabelsStatus) -> str:
    planned = f"/{status.planned}" if status.planned else ""
    last = f"; last: {status.last}" if status.last else ""
    return (f"{datetime.now().strftime('%Y-%m-%d %H:%M:%S')} {status.task}: {status.phase}, "
            f"{status.tests} test(s), {status.labels}{planned} label(s){last}")


def _search_rundirs(paths: list[Path], batch_log: Path | None) -> list[Path]:
    """The search rundirs named and those the batch log lists (labels rundirs skipped)."""
    out = list(paths)
    if batch_log is not None:
        if not batch_log.is_file():
            raise click.ClickException(f"{batch_log}: batch log not found")
        for e in read_batch_log(batch_log):
            p = Path(e.rundir)
            p = p if p.is_absolute() else batch_log.parent / p
            if e.algorithm != SITES_KIND and not is_sites_rundir(p):
                out.append(p)
    for p in out:
        if is_sites_rundir(p):
            raise click.ClickException(f"{p}: a labels rundir, not a search's (use --resume "
                                       "to continue it)")
        if not (p / EXPERIMENT).is_file():
            raise click.ClickException(f"{p}: not a rundir (no {EXPERIMENT})")
    return out


def _group(rundirs: list[Path]) -> dict[Path, list[Path]]:
    """Search rundirs by the benchmark directory they searched."""
    groups: dict[Path, list[Path]] = {}
    for r in rundirs:
        try:
            exp = read_experiment(r / EXPERIMENT)
        except RecordError as exc:
            raise click.ClickException(str(exc)) from None
        groups.setdefault(Path(exp.benchmark).resolve(), []).append(r)
    return groups


@click.command()
@click.argument("rundirs", nargs=-1, type=click.Path(path_type=Path))
@click.option("--batch-log", type=click.Path(path_type=Path),
              help="Attribute the winners of every search this batch log lists.")
@click.option("--tasks", "tasks_file", type=click.Path(path_type=Path),
              help="Benchmarks (one per line) to sweep without a search of theirs.")
@click.option("--tree", "trees", multiple=True, metavar="BENCH=FILE",
              help="Attribute the tree an overrides file asks for (an optimal.sexp, a "
                   "decision file of your own) instead of a search's winner (repeatable).")
@click.option("--sweep", type=click.IntRange(0, 10_000),
              help=f"Flip the K hottest sites of each benchmark alone (default: {DEFAULT_SWEEP} "
                   "for a benchmark without a confirmed winner, 0 otherwise).")
@click.option("--config", "config_path", type=click.Path(path_type=Path),
              help="Config file (default: configs/local.yaml).")
@click.option("--size", help="Benchmark size (default: the searches', else config run.size).")
@click.option("--runs", type=click.IntRange(2, MAX_RUNS),
              help="The fewest pairs per test (default: config run.runs).")
@click.option("--max-pairs", type=click.IntRange(2, MAX_RUNS),
              help="The most pairs per test (default: config measure.max_pairs).")
@click.option("--keep", type=click.FloatRange(0.0, 1.0, min_open=True), default=0.9,
              show_default=True, help="Share of the winner's log speedup a subset must keep.")
@click.option("--max-tests", type=click.IntRange(1, 10_000), default=64, show_default=True,
              help="Delta-debugging tests at most per benchmark.")
@click.option("--retest", is_flag=True,
              help="Measure every label again, independently (fresh pairs).")
@click.option("--labels", "labels_dir", type=click.Path(path_type=Path), default=Path("labels"),
              show_default=True, help="Where the labels tables are written.")
@click.option("--resume", "resume", multiple=True, type=click.Path(path_type=Path),
              help="Continue this labels rundir where it stopped (repeatable).")
@backend_errors_in_one_line
def measure_sites(rundirs, batch_log, tasks_file, trees, sweep, config_path, size, runs,
                  max_pairs, keep, max_tests, retest, labels_dir, resume) -> None:
    """Measure each inlining decision's effect: attribute search winners, sweep hot sites."""
    try:
        config = load_config(config_path)
        if resume:
            given = [o for o, v in (("RUNDIR", rundirs), ("--batch-log", batch_log),
                                    ("--tasks", tasks_file), ("--tree", trees),
                                    ("--sweep", sweep is not None),
                                    ("--size", size), ("--runs", runs),
                                    ("--max-pairs", max_pairs), ("--retest", retest)) if v]
            if given:
                raise click.ClickException(f"{', '.join(given)} cannot be used with --resume: "
                                           "a labels rundir continues with what it recorded")
            opened = []
            for p in resume:
                rd = SitesRundir.open(p, lock=False)
                if rd.finished_completed():
                    click.echo(f"{p}: already finished; nothing to resume", err=True)
                    continue
                rd.take()
                opened.append(rd)
            if not opened:
                return
            jobs = [(rd, load_benchmark(rd.experiment.benchmark)) for rd in opened]
            session = Session(config)
        else:
            sources = _search_rundirs(list(rundirs), batch_log)
            swept = task_benchmarks(tasks_file) if tasks_file else []
            files = [_tree_option(t) for t in trees]
            if not sources and not swept and not files:
                raise click.ClickException("nothing to measure: give search rundirs, "
                                           "--batch-log, --tree or --tasks")
            check_batch_log(config.search.batch_log)
            check_rundirs_dir(config.search.rundirs)
            session = Session(config)
            jobs = _new_rundirs(config, session, sources, swept, files, sweep, size, runs,
                                max_pairs, keep, max_tests, retest)
    except (ConfigError, ManifestError, CompilerNotFound, RundirError, StoreError,
            PlanError) as exc:
        raise click.ClickException(str(exc)) from None
    show_warnings()
    stop = threading.Event()
    try:
        measurements = session.start_workers()
    except BaseException:
        session.close()
        raise
    labellers = [SiteLabeller(rd, bench, session.builds, measurements, stop)
                 for rd, bench in sorted(jobs, key=_gain_first)]

    def interrupt(signum, frame):
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        click.echo("\nstopping: tests in flight are dropped and measured again on --resume",
                   err=True)

    def run_all() -> None:
        for labeller in labellers:
            if stop.is_set():
                break
            labeller.run()
            if labeller.status.state == "interrupted":  # its compiler was stopped by a
                stop.set()  # Ctrl-C (or a user's kill): the others are not begun

    previous = signal.signal(signal.SIGINT, interrupt)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    worker = threading.Thread(target=run_all, daemon=True)
    try:
        worker.start()
        shown: dict[int, tuple] = {}
        last: dict[int, float] = {}
        while True:
            alive = worker.is_alive()
            now = time.monotonic()
            for i, lab in enumerate(labellers):
                s = lab.status
                key = (s.phase, s.tests, s.labels, s.state)
                if s.state == "running" and s.phase == "starting":
                    continue
                repeat = s.state == "running" and now - last.get(i, now) >= PLAIN_EVERY_S
                if shown.get(i) != key or repeat:
                    shown[i], last[i] = key, now
                    click.echo(_line(s), err=True)
            if not alive:
                break
            time.sleep(0.5)
    finally:
        session.close(abort=stop.is_set())
    # Until the command ends a Ctrl-C stays the graceful stop's, so the tables are written
    # whenever it comes: run-campaign's budget stop may come just as the work ends.
    try:
        report_lost_workers(session)
        for lab in labellers:
            lab.rundir.close()
        _write_tables(labellers, labels_dir)
        failed = [lab for lab in labellers if lab.status.state == "failed"]
        for lab in failed:
            click.echo(f"{lab.status.task}: failed: {lab.status.error} ({lab.rundir.path})",
                       err=True)
        for lab in labellers:
            state = lab.status.state if lab.status.state != "running" else "not started"
            click.echo(f"{state:12} {lab.rundir.path}")
        unfinished = [lab.rundir.path for lab in labellers if lab.status.state != "finished"]
        if stop.is_set() and unfinished:  # a stop that came after the work stopped nothing
            again = " ".join(f"--resume {shlex.quote(str(p))}" for p in unfinished)
            conf = f"--config {shlex.quote(str(config_path))} " if config_path else ""
            click.echo(f"interrupted; to continue: measure-sites {conf}{again}", err=True)
            sys.exit(130)
        if failed:
            sys.exit(1)
    finally:
        signal.signal(signal.SIGINT, previous)


def _gain_first(job: tuple[SitesRundir, Benchmark]) -> float:
    """The order benchmarks are labelled in: the largest winner first, sweeps last (stable
    otherwise), so that a budget or a Ctrl-C stopping the stage leaves the labels that would
    teach least: a winner's decisions are where the measured gains are."""
    winner = job[0].experiment.winner
    return -(winner.speedup or 1.0) if winner is not None else 0.0


def _tree_option(value: str) -> tuple[Benchmark, Path]:
    """``BENCH=FILE``: the benchmark (a bundled name or a directory) and an overrides file,
    read now so a malformed one is refused before anything starts."""
    bench, sep, file = value.partition("=")
    if not sep or not bench or not file:
        raise click.ClickException(f"--tree {value}: expected BENCH=FILE (a benchmark and an "
                                   "overrides file)")
    path = Path(file)
    try:
        read_overrides(path)
    except OSError as exc:
        raise click.ClickException(f"{path}: cannot read ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise click.ClickException(" ".join(str(exc).split())) from None
    return resolve_benchmark(bench), path.resolve()


def _new_rundirs(config, session: Session, sources: list[Path], swept: list[Benchmark],
                 files: list[tuple[Benchmark, Path]], sweep: int | None, size: str | None,
                 runs: int | None, max_pairs: int | None, keep: float, max_tests: int,
                 retest: bool) -> list[tuple[SitesRundir, Benchmark]]:
    """A labels rundir per benchmark, made whole and listed in the batch log."""
    compiler = session.builds.toolchain.identity
    worker_class = session.worker_classes[0]
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    planned: list[tuple[Benchmark, list[Path], WinnerChoice | None, str]] = []
    for directory, group in _group(sources).items():
        for r in group:
            theirs = search_compiler(r)
            if theirs is not None and theirs != compiler:
                raise RundirError(f"{r}: searched with another compiler ({theirs[:12]}, this "
                                  f"one is {compiler[:12]}): its trees would not be rebuilt "
                                  "as they were")
        bench = load_benchmark(directory)
        first = read_experiment(group[0] / EXPERIMENT)
        planned.append((bench, group, confirmed_winner(group), size or first.size))
    for bench, file in files:
        planned.append((bench, [], WinnerChoice(overrides=str(file)), size or config.run.size))
    for bench in swept:
        if not any(b.directory.resolve() == bench.directory.resolve() for b, *_ in planned):
            planned.append((bench, [], None, size or config.run.size))
    out = []
    made: dict[Path, int] = {}
    for bench, group, winner, bench_size in planned:
        bench.size(bench_size)  # an unknown size: ManifestError, before any rundir exists
        k = sweep if sweep is not None else (0 if winner is not None else DEFAULT_SWEEP)
        if winner is None:
            click.echo(f"{bench.name}: no search confirmed a tree faster than the heuristic; "
                       f"sweeping its {k} hottest sites", err=True)
        elif not winner.confirmed and winner.ci95 is not None:
            click.echo(f"{bench.name}: its search stopped before confirming its best; that "
                       f"best ({winner.speedup:.3f}x [{winner.ci95[0]:.3f}, "
                       f"{winner.ci95[1]:.3f}] on the search's own pairs) is attributed if "
                       "fresh pairs confirm it", err=True)
        exp = SitesExperiment(
            task=bench.name, benchmark=str(bench.directory.resolve()), size=bench_size,
            runs=runs or config.run.runs, max_pairs=max(max_pairs or config.measure.max_pairs,
                                                        runs or config.run.runs),
            half_width=config.measure.half_width, timeout=config.run.timeout,
            perf=config.run.perf, aslr=config.run.aslr, worker_class=worker_class,
            compiler=compiler, sources=[str(r.resolve()) for r in group], winner=winner,
            sweep=k, keep=keep,
            max_tests=max_tests, retest=retest)
        k = made[bench.directory.resolve()] = made.get(bench.directory.resolve(), -1) + 1
        path = config.search.rundirs / rundir_name(bench, "sites", k, stamp)
        exp = exp.model_copy(update={"rundir": str(path.resolve())})
        rd = SitesRundir.create(path, exp, config.raw)
        try:
            append_batch_log(config.search.batch_log, BatchEntry(
                task=bench.name, rundir=str(path.resolve()), algorithm=SITES_KIND,
                version=SITES_FORMAT_VERSION))
        except OSError as exc:
            raise RundirError(f"{config.search.batch_log}: cannot write "
                              f"({exc.strerror or exc})") from None
        out.append((rd, bench))
    return out


def _write_tables(labellers: list[SiteLabeller], labels_dir: Path) -> None:
    """The labels table, report and plot of each benchmark measured."""
    from analysis.labels import LabelsError, label_rows, plot_effects, report, write_table
    for lab in labellers:
        name = lab.benchmark.name
        if lab.status.phase == "starting":
            continue  # not started: a later --resume writes its table
        try:
            table = label_rows(lab.rundir.path)
            directory = labels_dir / name
            written = write_table(table, directory)
            lines = report([lab.rundir.path], table)
            (directory / "report.txt").write_text("\n".join(lines) + "\n")
            plot = plot_effects(table, directory / "effects.png", f"{name}: labels")
        except (LabelsError, OSError, ValueError) as exc:  # a full disk, say: the rundir stays
            click.echo(f"{name}: no labels table ({' '.join(str(exc).split())})", err=True)
            continue
        click.echo(f"{name}:", err=True)
        for line in lines:
            click.echo(f"  {line}", err=True)
        files = [str(p) for p in written] + [str(directory / "report.txt")] + (
            [str(plot)] if plot else [])
        click.echo(f"{name}: labels in {', '.join(files)}", err=True)


def main() -> None:
    measure_sites(prog_name="measure-sites")
