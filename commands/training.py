"""``run_training_experiments``: a search chain per task, one rundir each, a live line per chain."""
from __future__ import annotations

import faulthandler
import hashlib
import shlex
import signal
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import click
from rich.live import Live
from rich.text import Text

from commands.common import backend_errors_in_one_line, report_lost_workers, show_warnings
from dispatcher.build.manifest import (
    BUNDLED_DIR,
    Benchmark,
    ManifestError,
    bundled_benchmarks,
    load_benchmark,
    resolve_benchmark,
)
from dispatcher.build.toolchain import PREFIX_ENV, CompilerNotFound
from dispatcher.config import (
    MAX_CHAINS,
    MAX_RUNS,
    MAX_SEED,
    MAX_STEPS,
    ConfigError,
    load_config,
)
from dispatcher.core.records import FORMAT_VERSION, BatchEntry
from dispatcher.core.rundir import (
    Rundir,
    RundirError,
    append_batch_log,
    batch_log_lists,
    check_batch_log,
    check_rundirs_dir,
)
from dispatcher.cpu_split import split_config
from dispatcher.search.chain import Chain, ChainStatus, new_experiment
from dispatcher.session import Session
from dispatcher.storage.store import StoreError


def read_tasks(path: Path) -> list[str]:
    """One benchmark per line (a bundled name, or a directory's path: ./mine); # starts a
    comment."""
    try:
        lines = path.read_bytes().decode("utf-8").splitlines()
    except OSError as exc:
        raise click.ClickException(f"{path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise click.ClickException(f"{path}: expected UTF-8 text ({exc.reason} at byte "
                                   f"{exc.start})") from None
    tasks = [line.split("#", 1)[0].strip() for line in lines]
    return [t for t in tasks if t]


def task_benchmarks(path: Path) -> list[Benchmark]:
    """The tasks file's benchmarks, each once: one listed twice (by name, or by two paths to
    one directory) would run the same chain twice, and its second rundir would collide with
    the first after the first had started."""
    tasks = read_tasks(path)
    benches = [resolve_benchmark(t) for t in tasks]
    first: dict[Path, int] = {}
    for i, bench in enumerate(benches):
        j = first.setdefault(bench.directory.resolve(), i)
        if j != i:
            raise click.ClickException(
                f"{path}: {tasks[i]}: the same benchmark as {tasks[j]} ({bench.directory}): "
                "list it once (--chains N runs several chains of it)")
    return benches


def rundir_name(bench: Benchmark, algorithm: str, seed: int, stamp: str) -> str:
    """``<benchmark>-<algorithm>-s<seed>-<stamp>``.  A user's benchmark directory has a digest
    of its path after its name, so that it never takes the rundir name of the bundled
    benchmark it is named after (nor of another directory of the same name)."""
    name = bench.name
    if bench.directory.resolve() != (BUNDLED_DIR / bench.name).resolve():
        name += "-" + hashlib.sha256(str(bench.directory.resolve()).encode()).hexdigest()[:8]
    return f"{name}-{algorithm}-s{seed}-{stamp}"


def _progress_line(status: ChainStatus, slots_busy: float, width: int = 20) -> str:
    """The chain's line; its best speedup is the journal's (paired, with its interval)."""
    best = "-" if status.best_energy is None else f"{1 / status.best_energy:.3f}x"
    if status.best_ci is not None:
        best += f" [{status.best_ci[0]:.3f}, {status.best_ci[1]:.3f}]"
    if status.confirmed:
        best += " confirmed"
    done = int(width * status.step / max(status.steps, 1))
    bar = "#" * done + "-" * (width - done)
    return (f"{status.task:14} [{bar}] step {status.step:>4}/{status.steps:<4} "
            f"best {best:>7}  busy {100 * slots_busy:3.0f}%  {status.state}")


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
    try:
        config = load_config(config_path)
        s = config.search
        if resume:
            # A resumed chain continues with what its rundir recorded: options that would
            # change it are refused, not ignored.
            given = [name for name, value in (
                ("--tasks", tasks_file), ("--algorithm", algorithm), ("--steps", steps),
                ("--chains", chains_per_task), ("--seed", seed), ("--size", size),
                ("--runs", runs), ("--max-pairs", max_pairs)) if value is not None]
            if given:
                raise click.ClickException(f"{', '.join(given)} cannot be used with --resume: a "
                                       "rundir continues with the settings it recorded")
            seen: set[Path] = set()
            for p in resume:
                if p.resolve() in seen:
                    raise click.ClickException(f"{p}: given to --resume twice")
                seen.add(p.resolve())
            rundirs = [Rundir.open(p, lock=False) for p in resume]
            finished = [r for r in rundirs if r.finished_completed()]
            for done in finished:
                click.echo(f"{done.path}: already finished; nothing to resume", err=True)
            rundirs = [r for r in rundirs if r not in finished]
            if not rundirs:
                return
            for r in rundirs:
                r.take()  # locked for this master's life; a second master is refused here
            plans: list[tuple[Benchmark, Rundir | None]] = [
                (load_benchmark(rd.experiment.benchmark), rd) for rd in rundirs]
        else:
            benches = (task_benchmarks(tasks_file) if tasks_file
                       else bundled_benchmarks("training"))
            if not benches:
                raise click.ClickException(f"{tasks_file}: no benchmark listed (one name or "
                                       "directory per line; # starts a comment)")
            plans = [(b, None) for b in benches]
            # Both writable before any rundir is made: none is left made but never listed.
            check_batch_log(s.batch_log)
            check_rundirs_dir(s.rundirs)
        if resume:
            first = plans[0][1]
            assert first is not None
            split_size, split_runs = first.experiment.size, first.experiment.runs
        else:
            split_size, split_runs = size or config.run.size, runs or config.run.runs
        config, split_line = split_config(config, [b for b, _ in plans], split_size,
                                          split_runs)
        if split_line:
            click.echo(split_line, err=True)
        session = Session(config)
    except (ConfigError, ManifestError, CompilerNotFound, RundirError, StoreError) as exc:
        raise click.ClickException(str(exc)) from None
    show_warnings()
    classes = session.worker_classes
    stop = threading.Event()
    try:
        measurements = session.start_workers()
    except BaseException:
        session.close()
        raise
    scheduler = session.scheduler
    chains: list[Chain] = []
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    # How many chains each worker class serves: an asynchronous chain keeps its share of
    # its class's slots in flight.  New chains spread over the classes in turn.
    per_plan = [1 if rd else (chains_per_task or s.chains) for _, rd in plans]
    sharing: dict[str, int] = {}
    for i in range(sum(per_plan)):
        sharing[classes[i % len(classes)]] = sharing.get(classes[i % len(classes)], 0) + 1
    try:
        for (bench, rd), count in zip(plans, per_plan):
            for k in range(count):
                if rd is None:
                    # Chains spread over the worker classes; each stays on its own.
                    worker_class = classes[len(chains) % len(classes)]
                    slots = sum(x.worker_class == worker_class for x in scheduler.slots)
                    exp = new_experiment(bench, k, config, slots, worker_class,
                                         algorithm=algorithm, steps=steps, seed=seed, size=size,
                                         runs=runs, max_pairs=max_pairs,
                                         chains=sharing.get(worker_class, 1),
                                         compiler=session.compiler.compiler.identity)
                    path = s.rundirs / rundir_name(bench, exp.algorithm, exp.seed, stamp)
                    exp = exp.model_copy(update={"rundir": str(path.resolve())})
                    bench.size(exp.size)  # an unknown size fails before anything starts
                    # Made whole, then listed: a kill in between leaves a complete rundir
                    # that its --resume lists (below).
                    rd = Rundir.create(path, exp, config.raw)
                    log_experiment(s.batch_log, rd)
                experiment = rd.experiment
                identity = session.compiler.compiler.identity
                if experiment.compiler is not None and experiment.compiler != identity:
                    raise RundirError(
                        f"{rd.path}: its candidates were compiled by compiler "
                        f"{experiment.compiler[:16]}, not by this one ({identity[:16]}, "
                        f"{session.compiler.compiler.prefix}): resume it with that compiler "
                        f"(${PREFIX_ENV}=<its prefix>)")
                # Version 1 rundirs did not record their class: the first one, as then.
                worker_class = experiment.worker_class or classes[0]
                if worker_class not in classes:
                    raise RundirError(f"{rd.path}: its runs were timed on worker class "
                                      f"{worker_class!r}, which this config does not have "
                                      f"({', '.join(classes)})")
                if (rd.path.resolve().parent == s.rundirs.resolve()
                        and not batch_log_lists(s.batch_log, rd.path)):
                    # One of this config's rundirs whose master was killed between making
                    # it and listing it.
                    click.echo(f"{rd.path}: not in the batch log {s.batch_log} (its master "
                               "stopped before listing it): listed now", err=True)
                    log_experiment(s.batch_log, rd)
                chains.append(Chain.of_rundir(rd, bench, config, session.compiler,
                                              measurements, worker_class, stop))
                rd = None
    except (ManifestError, RundirError) as exc:
        session.close()
        raise click.ClickException(str(exc)) from None

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

    def render() -> Text:
        elapsed = max(time.monotonic() - t0, 1e-9)
        busy = sum(scheduler.busy_s.values()) / (elapsed * len(scheduler.slots))
        return Text("\n".join(_progress_line(c.status, min(busy, 1.0)) for c in chains))

    try:
        for t in threads:
            t.start()
        with Live(render(), refresh_per_second=2, transient=False,
                  redirect_stderr=False) as live:
            while any(t.is_alive() for t in threads):
                time.sleep(0.5)
                live.update(render())
            live.update(render())
        click.echo()
    finally:
        signal.signal(signal.SIGINT, previous)
        # Stopped: the agents are closed at once, killing their runs (a resume runs them
        # again), and no compile is waited for.
        session.close(abort=stop.is_set())
    report_lost_workers(session)
    # What the workers did: the share of slot time spent running jobs (a step that waits for
    # its slowest candidate leaves the others idle; search.mode: async does not).
    wall = time.monotonic() - t0
    busy = sum(scheduler.busy_s.values()) / max(wall * len(scheduler.slots), 1e-9)
    click.echo(f"worker slots busy {100 * min(busy, 1.0):.1f}% of {wall:.1f} s "
               f"({len(scheduler.slots)} slot{'s' if len(scheduler.slots) != 1 else ''})",
               err=True)
    if not stop.is_set():  # matplotlib takes seconds to import: not while the user waits
        from analysis.plots import plot_experiment
        for c in chains:
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
        click.echo(f"{c.status.state:12} {c.rundir.path}")
    if stop.is_set():
        unfinished = [c.rundir.path for c in chains if c.status.state != "finished"]
        if unfinished:
            again = " ".join(f"--resume {shlex.quote(str(p))}" for p in unfinished)
            conf = f"--config {shlex.quote(str(config_path))} " if config_path else ""
            click.echo(f"interrupted; to continue: run_training_experiments {conf}{again}",
                       err=True)
        sys.exit(130)
    if failed:
        sys.exit(1)


def log_experiment(batch_log: Path, rundir: Rundir) -> None:
    """List a rundir in the batch log; RundirError (one line) if the log cannot be written."""
    exp = rundir.experiment
    try:
        append_batch_log(batch_log, BatchEntry(
            task=exp.task, rundir=str(exp.rundir or rundir.path.resolve()),
            algorithm=exp.algorithm, steps=exp.steps, version=FORMAT_VERSION))
    except OSError as exc:
        raise RundirError(f"{batch_log}: cannot write ({exc.strerror or exc}); {rundir.path} "
                          "is made but not listed (its --resume lists it)") from None


def main() -> None:
    run_training_experiments(prog_name="run_training_experiments")
