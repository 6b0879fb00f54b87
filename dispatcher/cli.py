"""User commands.  Thin: parsing, wiring and printing; the logic lives in the modules."""
from __future__ import annotations

import faulthandler
import logging
import signal
import statistics
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import click
from rich.live import Live
from rich.text import Text

from dispatcher.benchmark import (ManifestError, bundled_benchmarks, load_benchmark,
                                  resolve_benchmark)
from dispatcher.compile import CompileError, CompileJob, CompileService
from dispatcher.compiler import CompilerNotFound, locate_compiler
from dispatcher.config import Config, ConfigError, load_config, master_cpus
from dispatcher.decisions import DecisionFileError, read_dumps, read_overrides
from dispatcher.experiment import Chain, new_experiment, params_of
from dispatcher.local import LocalBackend, keep_master_off
from dispatcher.rundir import Rundir, RundirError, append_batch_log
from dispatcher.scheduler import Scheduler
from dispatcher.store import Store
from dispatcher.worker import AgentError, RunJob, RunResult


def make_backend(config: Config, store: Store):
    if config.backend == "local":
        keep_master_off(config.local.cpus)  # before the scheduler starts its threads
        return LocalBackend(config.local.cpus, store.worker_cache, config.local.worker_class)
    if config.backend == "ssh":
        from dispatcher.ssh import SshBackend  # paramiko takes half a second to import
        return SshBackend(config.ssh)
    raise click.ClickException(f"{config.path}: backend: {config.backend} is not available yet "
                               "(local and ssh are)")


def worker_classes(config: Config) -> set[str]:
    if config.backend == "ssh":
        return {h.worker_class for h in config.ssh.hosts}
    return {config.local.worker_class}


def show_warnings() -> None:
    """Lost workers, retried jobs and quarantined hosts are reported on stderr as they happen."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")


def report_lost_workers(scheduler: Scheduler) -> None:
    """Slots taken out of service, and slots still lost when the command ended."""
    for name, why in scheduler.quarantined.items():
        click.echo(f"{name}: out of service: {why}", err=True)
    for name, why in scheduler.down.items():
        click.echo(f"{name}: unavailable at the end: {why}", err=True)


def compile_cpus(config: Config) -> frozenset[int] | None:
    """Local workers time benchmarks on their CPUs: the master compiles on the others."""
    return master_cpus(config.local.cpus) if config.backend == "local" else None


def summary_lines(results: list[RunResult], dumps) -> list[str]:
    times = [t for r in results for t in r.times]
    failed = sum(r.failed for r in results)
    lines = []
    if times:
        median = statistics.median(times)
        cv = statistics.stdev(times) / statistics.mean(times) if len(times) > 1 else 0.0
        lines.append(f"runs: {len(times)} ok, {failed} failed; median {median:.6f} s; "
                     f"coefficient of variation {100 * cv:.2f}%")
    else:
        lines.append(f"runs: none succeeded, {failed} failed")
    decisions = [d for dump in dumps for d in dump.decisions]
    inlined = sum(d.action == "inline" for d in decisions)
    lines.append(f"decisions: {len(decisions)} in {len(dumps)} dumps: {inlined} inlined, "
                 f"{len(decisions) - inlined} not inlined "
                 f"({sum(d.prevented for d in decisions)} prevented)")
    for r in results:
        for rec in r.records:
            if rec.failure:
                lines.append(f"{r.worker}: failed run: {rec.failure}")
                break
    return lines


@click.command()
@click.argument("benchmark")
@click.argument("decisions", required=False, type=click.Path(path_type=Path))
@click.option("--runs", type=click.IntRange(min=1), help="Runs per worker (default: config).")
@click.option("--config", "config_path", type=click.Path(path_type=Path),
              help="Config file (default: configs/local.yaml).")
@click.option("--size", help="Benchmark size from its manifest (default: config).")
@click.option("--csv", "csv_only", is_flag=True, help="Print only the CSV lines on stdout.")
@click.option("--summary", is_flag=True, help="Print the summary on stdout (default: stderr).")
@click.option("--remeasure", is_flag=True,
              help="Measure even if this binary was measured before on this worker class.")
def run_benchmark(benchmark: str, decisions: Path | None, runs: int | None,
                  config_path: Path | None, size: str | None, csv_only: bool, summary: bool,
                  remeasure: bool) -> None:
    """Compile BENCHMARK (a bundled name or a directory) with DECISIONS (an overrides file;
    none: the compiler's heuristic), run it on every worker slot and print one CSV line per
    worker: worker, overrides file, run times in seconds."""
    try:
        config = load_config(config_path)
        bench = resolve_benchmark(benchmark)
        overrides = tuple(read_overrides(decisions)) if decisions else ()
        size_name = size or config.run.size
        bench_size = bench.size(size_name)
        compiler = locate_compiler()
    except (ConfigError, ManifestError, DecisionFileError, CompilerNotFound) as exc:
        raise click.ClickException(str(exc)) from None
    runs = runs or config.run.runs
    show_warnings()
    store = Store(config.store)
    compiler_service = CompileService(store, compiler, jobs=1, cpus=compile_cpus(config))
    try:
        compiled = compiler_service.compile(CompileJob(bench, overrides))
    except CompileError as exc:
        raise click.ClickException(f"{bench.name}: compile failed: {exc}") from None
    finally:
        compiler_service.close()

    args = bench_size.args
    errors: list[str] = []
    results = [] if remeasure else list({  # the latest result of each worker
        r.worker: r for cls in sorted(worker_classes(config))
        for r in store.measurements_for(compiled.sha256, args, cls)
        if len(r.records) >= runs}.values())
    if not results:
        job = RunJob(sha256=compiled.sha256, binary=compiled.binary, args=args, runs=runs,
                     timeout=config.run.timeout, expected_output=bench_size.expected.to_json(),
                     perf=config.run.perf)
        backend = make_backend(config, store)
        with Scheduler(backend.slots, config.scheduler) as scheduler:
            futures = [scheduler.submit(job, slot=slot.name) for slot in backend.slots]
            for f in futures:
                try:
                    results.append(f.result())
                except AgentError as exc:
                    errors.append(str(exc))
        backend.close()
        for r in results:  # what was measured is kept, whatever else failed
            store.add_measurement(r)
        report_lost_workers(scheduler)
        if not results:
            raise click.ClickException(errors[0])
        for e in errors:
            click.echo(f"error: {e}", err=True)

    label = str(decisions) if decisions else "heuristic"
    for r in results:
        click.echo(",".join([r.worker, label, *(f"{rec.wall_s:.6f}" if rec.failure is None
                                                 else "failed" for rec in r.records)]))
    if not csv_only:
        for line in summary_lines(results, read_dumps(compiled.artifact.decision_files)):
            click.echo(line, err=not summary)
    if errors or any(r.failed for r in results):
        sys.exit(1)


def run_benchmark_main() -> None:
    run_benchmark(prog_name="run-benchmark")


def read_tasks(path: Path) -> list[str]:
    """One benchmark (bundled name or directory) per line; # starts a comment."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise click.ClickException(f"{path}: cannot read ({exc.strerror})") from None
    tasks = [line.split("#", 1)[0].strip() for line in lines]
    return [t for t in tasks if t]


def _progress_line(status, slots_busy: float, width: int = 20) -> str:
    best = "-" if status.best_energy is None else f"{1 / status.best_energy:.3f}x"
    done = int(width * status.step / max(status.steps, 1))
    bar = "#" * done + "-" * (width - done)
    return (f"{status.task:14} [{bar}] step {status.step:>4}/{status.steps:<4} "
            f"best speedup {best:>7}  workers busy {100 * slots_busy:5.1f}%  {status.state}")


@click.command()
@click.option("--config", "config_path", type=click.Path(path_type=Path),
              help="Config file (default: configs/local.yaml).")
@click.option("--tasks", "tasks_file", type=click.Path(path_type=Path),
              help="File listing the benchmarks, one per line (default: the training split).")
@click.option("--algorithm", type=click.Choice(["sa", "random-walk"]))
@click.option("--steps", type=click.IntRange(min=1))
@click.option("--chains", "chains_per_task", type=click.IntRange(min=1),
              help="Chains per benchmark.")
@click.option("--seed", type=int)
@click.option("--size", help="Benchmark size (default: config run.size).")
@click.option("--runs", type=click.IntRange(min=1), help="Runs per candidate.")
@click.option("--resume", "resume", multiple=True, type=click.Path(path_type=Path),
              help="Continue this rundir exactly where it stopped (repeatable).")
def run_training_experiments(config_path, tasks_file, algorithm, steps, chains_per_task, seed,
                             size, runs, resume) -> None:
    """Generate training data: search over inlining decisions for every task."""
    try:
        config = load_config(config_path)
        compiler = locate_compiler()
        s = config.search
        if resume:
            rundirs = [Rundir.open(p) for p in resume]
            plans = [(load_benchmark(rd.experiment["benchmark"]), rd) for rd in rundirs]
        else:
            benches = ([resolve_benchmark(t) for t in read_tasks(tasks_file)] if tasks_file
                       else bundled_benchmarks("training"))
            plans = [(b, None) for b in benches]
    except (ConfigError, ManifestError, CompilerNotFound, RundirError) as exc:
        raise click.ClickException(str(exc)) from None
    show_warnings()
    store = Store(config.store)
    backend = make_backend(config, store)
    slots = len(backend.slots)
    stop = threading.Event()
    scheduler = Scheduler(backend.slots, config.scheduler)
    compile_service = CompileService(store, compiler, jobs=config.compile_jobs,
                                     cpus=compile_cpus(config))
    chains = []
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    try:
        for bench, rd in plans:
            for k in range(1 if rd else (chains_per_task or s.chains)):
                if rd is None:
                    exp = new_experiment(bench, k, config, slots, algorithm=algorithm,
                                         steps=steps, seed=seed, size=size, runs=runs)
                    path = s.rundirs / f"{bench.name}-{exp['algorithm']}-s{exp['seed']}-{stamp}"
                    exp["rundir"] = str(path.resolve())
                    bench.size(exp["size"])  # an unknown size fails before anything starts
                    rd = Rundir.create(path, exp, config.raw)
                    append_batch_log(s.batch_log, {"task": bench.name, "rundir": exp["rundir"],
                                                   "algorithm": exp["algorithm"],
                                                   "steps": exp["steps"]})
                params = params_of(rd.experiment, config)
                chains.append(Chain(rd, bench, params, compile_service, scheduler, store,
                                    backend.slots[0].worker_class, stop))
                rd = None
    except (ManifestError, RundirError) as exc:
        scheduler.close()
        raise click.ClickException(str(exc)) from None

    def interrupt(signum, frame):
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        click.echo("\nstopping: finishing the journal of every chain (Ctrl-C again to abort)",
                   err=True)

    previous = signal.signal(signal.SIGINT, interrupt)
    # `kill -USR1 <pid>` prints every thread's stack: a stuck experiment can be inspected.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    threads = [threading.Thread(target=c.run, daemon=True) for c in chains]
    t0 = time.monotonic()

    def render() -> Text:
        elapsed = max(time.monotonic() - t0, 1e-9)
        busy = sum(scheduler.busy_s.values()) / (elapsed * slots)
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
        scheduler.close()
        backend.close()
        compile_service.close()
    report_lost_workers(scheduler)
    from analysis.plots import plot_experiment  # matplotlib: seconds to import, needed here only
    for c in chains:
        try:
            plot_experiment(c.rundir.path)
        except Exception as exc:  # a plot is a convenience: never lose the run over it
            click.echo(f"{c.rundir.path}: no plot ({exc})", err=True)
    failed = [c for c in chains if c.status.state == "failed"]
    for c in failed:
        click.echo(f"{c.status.task}: failed: {c.status.error} ({c.rundir.path})", err=True)
    for c in chains:
        click.echo(f"{c.status.state:12} {c.rundir.path}")
    if stop.is_set():
        sys.exit(130)
    if failed:
        sys.exit(1)


def run_training_experiments_main() -> None:
    run_training_experiments(prog_name="run_training_experiments")
