"""``measure-sites``: each inlining decision's effect measured directly (docs/labels.md).

For each benchmark of the given search rundirs (or of a batch log's), the best tree its
searches confirmed is attributed decision by decision; a benchmark without one, or every one
with ``--sweep K``, gets its K hottest flippable sites flipped alone.  One labels rundir per
benchmark (listed in the batch log, resumable with ``--resume``), then the labels table
``<labels>/<bench>/sites.parquet`` and ``.csv``, a report and a plot.  The procedure is
``pipeline.sites``; this command parses, calls it and words what it did.
"""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

from commands.common import (
    backend_errors_in_one_line,
    fail,
    metric_option,
    refuse_with_resume,
    show_warnings,
)
from dispatcher.config import MAX_RUNS
from dispatcher.labels.planning import CONFIRM_SIZE, DEFAULT_CONFIRM_ABOVE, DEFAULT_SWEEP
from pipeline.longrun import FAILED, INTERRUPTED, GracefulStop
from pipeline.sites import INPUT_ERRORS, STOPPING, SitesReport, SitesRequest
from pipeline.sites import measure_sites as measure

PROG = "measure-sites"


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
              help="Measure every label again, independently (fresh pairs); under an exact "
                   "metric always, as the confirmation (--confirm-size, --confirm-above).")
@click.option("--labels", "labels_dir", type=click.Path(path_type=Path), default=Path("labels"),
              show_default=True, help="Where the labels tables are written.")
@click.option("--resume", "resume", multiple=True, type=click.Path(path_type=Path),
              help="Continue this labels rundir where it stopped (repeatable).")
@click.option("--no-cycles", "no_cycles", is_flag=True,
              help="Labels measured in time without their cycles effect (by default each "
                   "label's binaries are also counted under cachegrind at the tiny size, "
                   "where the workers can count).")
@click.option("--confirm-size", metavar="SIZE",
              help=f"Under an exact metric: the size the labels are confirmed at in wall time "
                   f"(default: {CONFIRM_SIZE}, else the labels' size).")
@click.option("--confirm-above", "confirm_above", metavar="X",
              help="Under an exact metric: confirm in wall time only the labels whose exact "
                   "effect |log ratio| is at least X (default: train-policy's label threshold, "
                   f"{DEFAULT_CONFIRM_ABOVE}; 0: every measured label).")
@click.option("--reference", metavar="heuristic|always-inline|PATH.sexp",
              help="The build labels are measured against (default: heuristic). Another "
                   "(with --tasks): the K hottest sites it inlined, each set back to "
                   "dont_inline alone, against its build: where inlining hurts.")
@metric_option
@backend_errors_in_one_line
def measure_sites(rundirs, batch_log, tasks_file, trees, sweep, config_path, size, runs,
                  max_pairs, keep, max_tests, retest, labels_dir, resume, confirm_size,
                  confirm_above, metric, no_cycles, reference) -> None:
    """Measure each inlining decision's effect: attribute search winners, sweep hot sites
    (in --metric; under an exact metric the labels that matter confirmed in wall time)."""
    if resume:
        refuse_with_resume([o for o, v in (
            ("RUNDIR", rundirs), ("--batch-log", batch_log), ("--tasks", tasks_file),
            ("--tree", trees), ("--sweep", sweep is not None), ("--size", size),
            ("--runs", runs), ("--max-pairs", max_pairs), ("--retest", retest),
            ("--metric", metric), ("--no-cycles", no_cycles),
            ("--confirm-size", confirm_size is not None),
            ("--confirm-above", confirm_above is not None),
            ("--reference", reference is not None)) if v],
            "a labels rundir continues with what it recorded")
    request = SitesRequest(config_path, rundirs, batch_log, tasks_file, trees, sweep, size,
                           runs, max_pairs, keep, max_tests, retest, labels_dir, resume,
                           metric, cycles=not no_cycles, confirm_size=confirm_size,
                           confirm_above=_log_effect("--confirm-above", confirm_above),
                           reference=reference)
    show_warnings()
    # The graceful stop stays until the command ends, so the tables are written whenever a
    # stop comes: run-campaign's budget stop may come just as the work ends.
    with GracefulStop(STOPPING) as stop:
        try:
            report = measure(request, stop)
        except INPUT_ERRORS as exc:
            fail(str(exc))
        except KeyboardInterrupt:  # a second Ctrl-C (the hard stop), or one before the work
            click.echo(f"\n{stop.hard_stop().resume_line(PROG, config_path)}", err=True)
            sys.exit(INTERRUPTED)
        _word(report, config_path, labels_dir)


def _log_effect(option: str, value: str | None) -> float | None:
    """A threshold option's number (its range is checked with the other settings); one line
    for what is not a number."""
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        fail(f"{option} {value}: expected a log effect of 0 or more (0: confirm every "
             "measured label)")


def _word(report: SitesReport, config_path: Path | None, labels_dir: Path) -> None:
    """The tables written, the failures, each rundir's state (stdout) and the exit status."""
    for line in report.lost_workers:
        click.echo(line, err=True)
    for table in report.tables:
        if table.error is not None:
            click.echo(f"{table.name}: no labels table ({table.error})", err=True)
            continue
        click.echo(f"{table.name}:", err=True)
        for line in table.lines:
            click.echo(f"  {line}", err=True)
        click.echo(f"{table.name}: labels in {', '.join(map(str, table.files))}", err=True)
    for lab in report.labelled:
        if lab.state == "failed":
            click.echo(f"{lab.task}: failed: {lab.error} ({lab.rundir})", err=True)
    for lab in report.labelled:
        state = lab.state if lab.state != "running" else "not started"
        click.echo(f"{state:12} {lab.rundir}")
    if report.ending.interrupted:
        click.echo(report.ending.resume_line(PROG, config_path), err=True)
    unwritten = [t for t in report.tables if t.error is not None]
    if unwritten and not report.ending.interrupted:  # the rundirs stay: a --resume writes them
        conf = f" --config {shlex.quote(str(config_path))}" if config_path else ""
        again = f" --labels {shlex.quote(str(labels_dir))}" + "".join(
            f" --resume {shlex.quote(str(t.rundir))}" for t in unwritten)
        click.echo(f"labels tables not written ({', '.join(t.name for t in unwritten)}); once "
                   f"fixed, to write them: {PROG}{conf}{again}", err=True)
    status = report.ending.exit_status or (FAILED if unwritten else 0)
    if status:
        sys.exit(status)


def main() -> None:
    measure_sites(prog_name=PROG)
