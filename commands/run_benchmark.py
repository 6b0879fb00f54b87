"""``run-benchmark BENCH [decision.sexp] [--policy P]``: compile once, run on every worker
slot."""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

import click

from commands.common import (
    backend_errors_in_one_line,
    closing_session,
    fail,
    metric_option,
    show_warnings,
)
from dispatcher.build.manifest import ManifestError, resolve_benchmark
from dispatcher.build.policies import PolicyError, PolicySpec, parse_policy
from dispatcher.build.service import CompileJob
from dispatcher.build.toolchain import CompilerNotFound
from dispatcher.compare import Compared, Contender, run_job
from dispatcher.config import MAX_RUNS, ConfigError, load_config, with_metric
from dispatcher.core.comparison import share_range
from dispatcher.core.decisions import (
    DecisionDump,
    DecisionFileError,
    override_reach,
    read_overrides,
)
from dispatcher.core.figures import format_speedup
from dispatcher.core.records import RunResult
from dispatcher.running.measurement import ShareJudge
from dispatcher.session import Session
from dispatcher.storage.store import StoreError
from pipeline.evaluation import (
    EvaluationError,
    SlotRuns,
    compare_one,
    compile_build,
    run_on_every_slot,
)


def summary_lines(results: list[RunResult], dumps: list[DecisionDump]) -> list[str]:
    times = [t for r in results for t in r.times]
    failed = sum(r.failed for r in results)
    disturbed = sum(r.disturbed for r in results)
    not_used = f"{disturbed} disturbed (not used), " if disturbed else ""
    lines = []
    if times:
        median = statistics.median(times)
        cv = statistics.stdev(times) / statistics.mean(times) if len(times) > 1 else 0.0
        lines.append(f"runs: {len(times)} ok, {not_used}{failed} failed; median "
                     f"{median:.6f} s; coefficient of variation {100 * cv:.2f}%")
    else:
        none = "none undisturbed" if disturbed else "none succeeded"
        lines.append(f"runs: {none}, {not_used}{failed} failed")
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
@click.option("--runs", type=click.IntRange(1, MAX_RUNS),
              help="Runs per worker (default: config).")
@click.option("--config", "config_path", type=click.Path(path_type=Path),
              help="Config file (default: configs/local.yaml).")
@click.option("--size", help="Benchmark size from its manifest (default: config).")
@click.option("--csv", "csv_only", is_flag=True, help="Print only the CSV lines on stdout.")
@click.option("--summary", is_flag=True, help="Print the summary on stdout (default: stderr).")
@click.option("--remeasure", is_flag=True,
              help="Measure even if this binary was measured before on this worker class.")
@click.option("--compare/--no-compare", default=True, show_default=True,
              help="With DECISIONS or --policy: also compare it with the heuristic build in "
                   "pairs on one worker CPU, and print the speedup with its 95% interval.")
@click.option("--policy", "policy_name", metavar="POLICY",
              help="Answer each of the compiler's decisions with a policy: "
                   "heuristic, never-inline, or an overrides file such as an optimal.sexp "
                   "(its decisions; the heuristic's elsewhere), or a .policy file train-policy "
                   "wrote (plain data: the compiler evaluates it itself).  Overrides in "
                   "DECISIONS win.")
@metric_option
@backend_errors_in_one_line
def run_benchmark(benchmark: str, decisions: Path | None, runs: int | None,
                  config_path: Path | None, size: str | None, csv_only: bool, summary: bool,
                  remeasure: bool, compare: bool, policy_name: str | None,
                  metric: str | None) -> None:
    """Compile BENCHMARK (a bundled name, or a directory's path: ./mine) with DECISIONS (an
    overrides file; none: the compiler's heuristic), run it on every worker slot and print one
    CSV line per worker: worker, overrides file (or policy), run times in seconds.  With
    DECISIONS or --policy, the summary also gives its speedup over the heuristic, measured as
    the search measures candidates."""
    try:
        policy: PolicySpec | None = parse_policy(policy_name) if policy_name else None
        config = with_metric(load_config(config_path), metric)
        bench = resolve_benchmark(benchmark)
        overrides = tuple(read_overrides(decisions)) if decisions else ()
        bench_size = bench.size(size or config.run.size)
        session = Session(config, compile_jobs=1)
    except (ConfigError, ManifestError, DecisionFileError, CompilerNotFound, StoreError,
            PolicyError) as exc:
        fail(str(exc))
    runs = runs or config.run.runs
    show_warnings()
    speedup = None
    judge = ShareJudge(config.measure.min_cpu_share, config.measure.share_margin)
    build = CompileJob(bench, overrides, policy=policy)
    with closing_session(session):
        try:
            compiled = compile_build(session, build, decisions)
        except EvaluationError as exc:
            fail(str(exc))
        if decisions:
            unreached = override_reach(overrides, compiled.artifact.dumps()).line(decisions)
            if unreached:
                click.echo(unreached, err=True)
        got = run_on_every_slot(session, run_job(config, bench_size, compiled, runs), judge,
                                remeasure)
        if ((decisions or policy) and compare and not csv_only and got.results
                and not any(r.failed for r in got.results)):
            speedup = speedup_line(compare_one(
                session, Contender(None, bench, build, bench_size), runs, remeasure))
    if not got.results:
        fail(got.errors[0])
    _report(got, runs, judge.floor, " ".join(str(x) for x in (
        decisions, policy and f"policy:{policy}") if x) or "heuristic")
    if not csv_only:
        for line in [*summary_lines(got.results, compiled.artifact.dumps()),
                     *([speedup] if speedup else [])]:
            click.echo(line, err=not summary)
    if got.errors or any(r.failed for r in got.results):
        sys.exit(1)


def _report(got: SlotRuns, runs: int, floor: float, label: str) -> None:
    """The errors and the cached note on stderr, a CSV line per worker, the disturbance
    warning."""
    for e in got.errors:
        click.echo(f"error: {e}", err=True)
    if got.cached:
        click.echo(f"cached: the first {runs} run{'s' if runs != 1 else ''} per worker of a "
                   "job measured before with the same binary, arguments, expected output and "
                   "settings (--remeasure to measure again)", err=True)
    for r in got.results:
        click.echo(",".join([r.worker, label, *(f"{rec.wall_s:.6f}" if rec.usable
                                                 else "disturbed" if rec.failure is None
                                                 else "failed" for rec in r.records)]))
    warning = share_warning(got.results, runs, floor)
    if warning:
        click.echo(warning, err=True)


def share_warning(results: list[RunResult], runs: int, floor: float) -> str | None:
    """One line when runs were disturbed (their CPU share below the floor or below their
    binary's own, or they migrated), with the shares seen; it says when fewer than the runs
    asked for are left: the run set is unresolved and its median is no figure."""
    disturbed = sum(r.disturbed for r in results)
    if not disturbed:
        return None
    total = sum(len(r.records) for r in results)
    short = [r.worker for r in results if len(r.times) < runs and not r.failed]
    line = (f"warning: {disturbed} of {total} runs disturbed (CPU shares seen "
            f"{share_range(results)}, floor {floor:.2f}): another process had the worker "
            "CPU; their times are not used")
    if short:
        line += (f"; unresolved on {', '.join(short)}: fewer than {runs} undisturbed runs, "
                 "the times there are no figure (measure on a quiet machine)")
    return line


def speedup_line(got: Compared[None] | StoreError) -> str:
    """The speedup of the build over the heuristic build, or why there is none."""
    if isinstance(got, StoreError):  # said, not raised: the runs above stand
        return f"speedup over the heuristic: not measured ({got})"
    compared = got.comparison
    if compared is None:
        return f"speedup over the heuristic: not measured ({got.error})"
    if not compared.resolved:
        return f"speedup over the heuristic: none, {compared.unresolved_line()}"
    speedup, low, high = compared.interval
    if speedup is None:
        return f"speedup over the heuristic: none ({compared.stopped}, no pairs)"
    if compared.metric != "time":
        cached = "; from the store" if compared.reused else ""
        return (f"speedup over the heuristic in {compared.metric}: "
                f"{format_speedup(speedup, low, high)} (exact: one cachegrind run of each, "
                f"the last on {compared.worker}{cached})")
    return (f"speedup over the heuristic: {format_speedup(speedup, low, high)} (95% interval, "
            f"{compared.pairs} pairs on {compared.worker}, stopped: {compared.stopped})")


def main() -> None:
    run_benchmark(prog_name="run-benchmark")
