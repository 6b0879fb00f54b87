"""``run-benchmark BENCH [decision.sexp] [--policy P]``: compile once, run on every worker
slot."""
from __future__ import annotations

import statistics
import sys
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import click

from commands.common import backend_errors_in_one_line, closing_session, show_warnings
from dispatcher.build.manifest import ManifestError, resolve_benchmark
from dispatcher.build.policies import PolicyError, PolicySpec, parse_policy
from dispatcher.build.service import CompileError, CompileJob, OverridesMismatch
from dispatcher.build.toolchain import CompilerNotFound
from dispatcher.compare import Contender, compare_with_heuristic, pairing_policy, run_job
from dispatcher.config import MAX_RUNS, ConfigError, load_config
from dispatcher.core.decisions import (
    DecisionDump,
    DecisionFileError,
    override_reach,
    read_overrides,
)
from dispatcher.core.jobs import RunJob
from dispatcher.core.records import RunResult
from dispatcher.running.agent_client import AgentError
from dispatcher.running.measurement import ShareJudge, share_range
from dispatcher.session import Session
from dispatcher.storage.store import StoreError


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


def cached_results(session: Session, job: RunJob) -> list[RunResult]:
    """Per worker, the latest stored result of exactly ``job`` with at least ``job.runs`` runs,
    cut to its first ``job.runs`` runs: what a fresh job of that many runs would have measured
    there (the first runs of a job, after the binary arrived), so ``--runs N`` shows N."""
    latest = {r.worker: r for cls in session.worker_classes
              for r in session.store.job_measurements(job, cls)
              if len(r.records) >= job.runs}
    return [r.model_copy(update={"records": r.records[:job.runs]}) for r in latest.values()]


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
@backend_errors_in_one_line
def run_benchmark(benchmark: str, decisions: Path | None, runs: int | None,
                  config_path: Path | None, size: str | None, csv_only: bool, summary: bool,
                  remeasure: bool, compare: bool, policy_name: str | None) -> None:
    """Compile BENCHMARK (a bundled name, or a directory's path: ./mine) with DECISIONS (an
    overrides file; none: the compiler's heuristic), run it on every worker slot and print one
    CSV line per worker: worker, overrides file (or policy), run times in seconds.  With
    DECISIONS or --policy, the summary also gives its speedup over the heuristic, measured as
    the search measures candidates."""
    try:
        policy: PolicySpec | None = parse_policy(policy_name) if policy_name else None
        config = load_config(config_path)
        bench = resolve_benchmark(benchmark)
        overrides = tuple(read_overrides(decisions)) if decisions else ()
        bench_size = bench.size(size or config.run.size)
        session = Session(config, compile_jobs=1)
    except (ConfigError, ManifestError, DecisionFileError, CompilerNotFound, StoreError,
            PolicyError) as exc:
        raise click.ClickException(str(exc)) from None
    runs = runs or config.run.runs
    show_warnings()
    errors: list[str] = []
    results: list[RunResult] = []
    cached = False
    speedup = None
    with closing_session(session):
        try:
            build = CompileJob(bench, overrides, policy=policy)
            compiled = session.builds.compile(build)
        except OverridesMismatch as exc:
            raise click.ClickException(f"{decisions}: {exc}") from None
        except CompileError as exc:
            raise click.ClickException(f"{bench.name}: compile failed: {exc}") from None
        except StoreError as exc:
            raise click.ClickException(str(exc)) from None
        if decisions:
            unreached = override_reach(overrides, compiled.artifact.dumps()).line(decisions)
            if unreached:
                click.echo(unreached, err=True)
        job = run_job(config, bench_size, compiled, runs)
        if not remeasure:
            results = cached_results(session, job)
            if results:
                cached = True
        judge = ShareJudge(config.measure.min_cpu_share)
        if results:
            results = [judge(r) for r in results]
        else:
            scheduler = session.start_workers().scheduler
            futures = [scheduler.submit(job, slot=slot.name) for slot in scheduler.slots]
            for f in futures:
                try:
                    results.append(judge(f.result()))
                except AgentError as exc:
                    errors.append(str(exc))
            results = rerun_disturbed(scheduler, job, results, judge, errors)
            for r in results:  # what was measured is kept, whatever else failed
                try:
                    session.store.add_measurement(r, job)
                except StoreError as exc:
                    errors.append(str(exc))
        if ((decisions or policy) and compare and not csv_only and results
                and not any(r.failed for r in results)):
            speedup = speedup_line(session, Contender(None, bench, build, bench_size), runs,
                                   remeasure)
    if not results:
        raise click.ClickException(errors[0])
    for e in errors:
        click.echo(f"error: {e}", err=True)
    if cached:
        click.echo(f"cached: the first {runs} run{'s' if runs != 1 else ''} per worker of a "
                   "job measured before with the same binary, arguments, expected output and "
                   "settings (--remeasure to measure again)", err=True)

    label = " ".join(str(x) for x in (decisions, policy and f"policy:{policy}") if x) \
        or "heuristic"
    for r in results:
        click.echo(",".join([r.worker, label, *(f"{rec.wall_s:.6f}" if rec.usable
                                                 else "disturbed" if rec.failure is None
                                                 else "failed" for rec in r.records)]))
    warning = share_warning(results, runs, judge.floor)
    if warning:
        click.echo(warning, err=True)
    if not csv_only:
        for line in summary_lines(results, compiled.artifact.dumps()):
            click.echo(line, err=not summary)
        if speedup:
            click.echo(speedup, err=not summary)
    if errors or any(r.failed for r in results):
        sys.exit(1)


def rerun_disturbed(scheduler, job: RunJob, results: list[RunResult], judge: ShareJudge,
                    errors: list[str]) -> list[RunResult]:
    """Each worker's runs with those it lost to disturbance run again, once, on the same
    slot (as many as were lost, so a worker returns between N and 2N runs, as the agent does
    for runs that migrated); judged the same way.  Runs that failed are not run again."""
    out = []
    for r in results:
        missing = job.runs - len(r.times)
        if missing > 0 and not r.failed:
            try:
                extra = judge(scheduler.submit(replace(job, runs=missing),
                                               slot=r.worker).result())
                r = r.model_copy(update={"records": r.records + extra.records})
            except AgentError as exc:
                errors.append(str(exc))
        out.append(r)
    return out


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


def speedup_line(session: Session, contender: Contender[None], runs: int,
                 remeasure: bool) -> str:
    """The speedup of the contender's build over the heuristic build: paired, interleaved, on
    one slot, as the search measures a candidate (docs/measurement.md)."""
    pairing = pairing_policy(session.config, runs)
    try:
        with closing(compare_with_heuristic(session, [contender], runs, pairing,
                                            remeasure)) as outcomes:
            got = next(iter(outcomes))
    except StoreError as exc:  # said, not raised: the runs above stand
        return f"speedup over the heuristic: not measured ({exc})"
    compared = got.comparison
    if compared is None:
        return f"speedup over the heuristic: not measured ({got.error})"
    if not compared.resolved:
        return f"speedup over the heuristic: none, {compared.unresolved_line()}"
    speedup, low, high = compared.interval
    if speedup is None:
        return f"speedup over the heuristic: none ({compared.stopped}, no pairs)"
    interval = "" if low is None else f" [{low:.3f}, {high:.3f}]"
    return (f"speedup over the heuristic: {speedup:.3f}{interval} (95% interval, "
            f"{compared.pairs} pairs on {compared.worker}, stopped: {compared.stopped})")


def main() -> None:
    run_benchmark(prog_name="run-benchmark")
