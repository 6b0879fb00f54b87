"""``run_training_experiments``: a search chain per task, one rundir each, a live line per chain."""
from __future__ import annotations

import faulthandler
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import click
from rich.console import Console
from rich.live import Live
from rich.text import Text

from commands.common import backend_errors_in_one_line, report_lost_workers, show_warnings
from dispatcher.build.manifest import Benchmark, ManifestError, bundled_benchmarks
from dispatcher.build.toolchain import CompilerNotFound
from dispatcher.config import (
    MAX_CHAINS,
    MAX_RUNS,
    MAX_SEED,
    MAX_STEPS,
    ConfigError,
    load_config,
)
from dispatcher.core.rundir import RundirError
from dispatcher.cpu_split import split_config
from dispatcher.planning import (
    Overrides,
    PlanError,
    check_new_outputs,
    open_resumes,
    plan_chains,
    task_benchmarks,
)
from dispatcher.running.scheduler import Scheduler
from dispatcher.search.chain import Chain, ChainStatus
from dispatcher.session import Session
from dispatcher.storage.store import StoreError


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


def _progress_line(status: ChainStatus, slots_busy: float, width: int = 20) -> str:
    """The chain's line on a terminal."""
    done = int(width * status.step / max(status.steps, 1))
    bar = "#" * done + "-" * (width - done)
    unresolved = f"  {status.unresolved} unresolved" if status.unresolved else ""
    return (f"{status.task:14} [{bar}] step {status.step:>4}/{status.steps:<4} "
            f"best {best_figure(status):>7}  busy {100 * slots_busy:3.0f}%{unresolved}  "
            f"{status.state}")


PLAIN_EVERY_S = 60.0  # without a terminal: a line per chain at least this often


def _plain_key(status: ChainStatus) -> tuple:
    """What a plain progress line is printed for: a step done, a best changed, a phase."""
    phase = "searching" if status.state in ("compiling", "running") else status.state
    return (status.step, phase, status.best_energy, status.confirmed, status.none_better,
            status.unresolved)


def _plain_line(status: ChainStatus, slots_busy: float) -> str:
    """The chain's line without a terminal: timestamped, one line, never redrawn."""
    unresolved = f", {status.unresolved} unresolved" if status.unresolved else ""
    return (f"{datetime.now().strftime('%Y-%m-%d %H:%M:%S')} {status.task}: step "
            f"{status.step}/{status.steps}, best {best_figure(status)}, busy "
            f"{100 * slots_busy:.0f}%{unresolved}, {status.state} ({status.rundir})")


def _show_plain(chains: list[Chain], threads: list[threading.Thread],
                busy: Callable[[], float]) -> None:
    """Progress when stderr is not a terminal (a file, a pipe, a CI log): a timestamped line
    on stderr per chain whenever it finishes a step or changes phase, and at least every
    PLAIN_EVERY_S seconds."""
    shown: dict[int, tuple] = {}
    last: dict[int, float] = {}

    def report() -> None:
        now = time.monotonic()
        for i, c in enumerate(chains):
            key = _plain_key(c.status)
            if shown.get(i) != key or now - last.get(i, now) >= PLAIN_EVERY_S:
                shown[i], last[i] = key, now
                click.echo(_plain_line(c.status, busy()), err=True)

    while any(t.is_alive() for t in threads):
        report()
        time.sleep(0.5)
    report()


@click.command()
@click.option("--config", "config_path", type=click.Path(path_type=Path),
              help="Config file (default: configs/local.yaml).")
@click.option("--tasks", "tasks_file", type=click.Path(path_type=Path),
              help="File listing the benchmarks, one per line (default: the training split).")
@click.option("--algorithm", type=click.Choice(["sa", "random-walk"]))
@click.option("--steps", type=click.IntRange(1, MAX_STEPS))
@click.option("--chains", "chains_per_task", type=click.IntRange(1, MAX_CHAINS),
              help="Chains per benchmark.")
@click.option("--seed", type=click.IntRange(-MAX_SEED, MAX_SEED))
@click.option("--size", help="Benchmark size (default: config run.size).")
@click.option("--runs", type=click.IntRange(1, MAX_RUNS),
              help="The fewest pairs (candidate and baseline runs) per candidate.")
@click.option("--max-pairs", type=click.IntRange(1, MAX_RUNS),
              help="The most pairs per candidate (default: config measure.max_pairs).")
@click.option("--resume", "resume", multiple=True, type=click.Path(path_type=Path),
              help="Continue this rundir exactly where it stopped (repeatable).")
@backend_errors_in_one_line
def run_training_experiments(config_path, tasks_file, algorithm, steps, chains_per_task, seed,
                             size, runs, max_pairs, resume) -> None:
    """Generate training data: search over inlining decisions for every task."""
    overrides = Overrides(algorithm=algorithm, steps=steps, seed=seed, size=size, runs=runs,
                          max_pairs=max_pairs, chains=chains_per_task)
    try:
        config = load_config(config_path)
        if resume:
            # A resumed chain continues with what its rundir recorded: options that would
            # change it are refused, not ignored.
            given = (["--tasks"] if tasks_file else []) + overrides.given()
            if given:
                raise click.ClickException(f"{', '.join(given)} cannot be used with --resume: a "
                                           "rundir continues with the settings it recorded")
            resumes = open_resumes(resume)
            for done in resumes.finished:
                click.echo(f"{done.path}: already finished; nothing to resume", err=True)
            if not resumes.rundirs:
                return
            benches: list[Benchmark] = []
            first = resumes.rundirs[0][0].experiment
            split_size, split_runs = first.size, first.runs
            to_split = [b for _, b in resumes.rundirs]
        else:
            benches = (task_benchmarks(tasks_file) if tasks_file
                       else bundled_benchmarks("training"))
            check_new_outputs(config)
            split_size, split_runs = size or config.run.size, runs or config.run.runs
            to_split = benches
        config, split_line = split_config(config, to_split, split_size, split_runs)
        if split_line:
            click.echo(split_line, err=True)
        session = Session(config)
    except (ConfigError, ManifestError, CompilerNotFound, RundirError, StoreError,
            PlanError) as exc:
        raise click.ClickException(str(exc)) from None
    show_warnings()
    stop = threading.Event()
    try:
        measurements = session.start_workers()
        scheduler = session.scheduler
        slots = {c: sum(x.worker_class == c for x in scheduler.slots)
                 for c in session.worker_classes}
        plan = plan_chains(config, benches, resumes.rundirs if resume else [], overrides,
                           slots, session.builds.toolchain,
                           datetime.now().strftime("%Y%m%d-%H%M%S"))
    except (ManifestError, RundirError) as exc:
        session.close()
        raise click.ClickException(str(exc)) from None
    except BaseException:
        session.close()
        raise
    for note in plan.notes:
        click.echo(note, err=True)
    chains = [Chain.of_rundir(c.rundir, c.bench, config, session.builds, measurements,
                              c.worker_class, stop) for c in plan.chains]

    def interrupt(signum, frame):
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        click.echo("\nstopping: runs in flight are dropped and done again on --resume",
                   err=True)

    previous = signal.signal(signal.SIGINT, interrupt)
    # `kill -USR1 <pid>` prints every thread's stack: a stuck experiment can be inspected.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    threads = [threading.Thread(target=c.run, daemon=True) for c in chains]
    t0 = time.monotonic()

    def busy_now() -> float:
        elapsed = max(time.monotonic() - t0, 1e-9)
        return min(sum(scheduler.busy_s.values()) / (elapsed * len(scheduler.slots)), 1.0)

    def render() -> Text:
        return Text("\n".join(_progress_line(c.status, busy_now()) for c in chains))

    try:
        for t in threads:
            t.start()
        if sys.stderr.isatty():
            with Live(render(), refresh_per_second=2, transient=False,
                      redirect_stderr=False, console=Console(file=sys.stderr)) as live:
                while any(t.is_alive() for t in threads):
                    time.sleep(0.5)
                    live.update(render())
                live.update(render())
            click.echo()
        else:
            _show_plain(chains, threads, busy_now)
    finally:
        # Stopped: the agents are closed at once, killing their runs (a resume runs them
        # again), and no compile is waited for.
        session.close(abort=stop.is_set())
    # Until the command ends a Ctrl-C stays the graceful stop's, so the report is written
    # whenever it comes: run-campaign's budget stop may come just as the search ends.
    try:
        _report(chains, session, scheduler, stop, time.monotonic() - t0, config_path)
    finally:
        signal.signal(signal.SIGINT, previous)


def _report(chains: list[Chain], session: Session, scheduler: Scheduler, stop: threading.Event,
            wall: float, config_path: Path | None) -> None:
    """What the chains did, one line each, the plots, and the exit status: 130 with the
    --resume line if a stop left chains unfinished, 1 if one failed."""
    report_lost_workers(session)
    # What the workers did: the share of slot time spent running jobs (a step that waits for
    # its slowest candidate leaves the others idle; search.mode: async does not).
    busy = sum(scheduler.busy_s.values()) / max(wall * len(scheduler.slots), 1e-9)
    click.echo(f"worker slots busy {100 * min(busy, 1.0):.1f}% of {wall:.1f} s "
               f"({len(scheduler.slots)} slot{'s' if len(scheduler.slots) != 1 else ''})",
               err=True)
    if not stop.is_set():  # matplotlib takes seconds to import: not while the user waits
        from analysis.plots import plot_experiment
        for c in chains:
            if stop.is_set():
                break
            try:
                plot_experiment(c.rundir.path)
            except Exception as exc:  # a plot is a convenience: never lose the run over it
                click.echo(f"{c.rundir.path}: no plot ({exc})", err=True)
    for c in chains:
        c.rundir.close()  # the lock: a --resume may start now
    failed = [c for c in chains if c.status.state == "failed"]
    for c in failed:
        click.echo(f"{c.status.task}: failed: {c.status.error} ({c.rundir.path})", err=True)
    for c in chains:
        if c.status.state == "finished":
            unresolved = (f"; {c.status.unresolved} comparison(s) unresolved (too few "
                          "undisturbed pairs, no speedup)" if c.status.unresolved else "")
            click.echo(f"{c.status.task}: best {best_figure(c.status)}{unresolved} "
                       f"({c.rundir.path})", err=True)
    for c in chains:
        click.echo(f"{c.status.state:12} {c.rundir.path}")
    unfinished = [c.rundir.path for c in chains if c.status.state != "finished"]
    # A chain whose compiler a Ctrl-C (or a user's kill) stopped is interrupted too; a stop
    # that came after every chain had ended stopped nothing.
    if unfinished and (stop.is_set() or any(c.status.state == "interrupted" for c in chains)):
        again = " ".join(f"--resume {shlex.quote(str(p))}" for p in unfinished)
        conf = f"--config {shlex.quote(str(config_path))} " if config_path else ""
        click.echo(f"interrupted; to continue: run_training_experiments {conf}{again}",
                   err=True)
        sys.exit(130)
    if failed:
        sys.exit(1)


def main() -> None:
    run_training_experiments(prog_name="run_training_experiments")
