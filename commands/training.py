"""``run_training_experiments``: a search chain per task, one rundir each, a live line per
chain.  The procedure is ``pipeline.searches``; this command parses, calls it and words what
the chains did."""
from __future__ import annotations

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
from dispatcher.config import MAX_CHAINS, MAX_RUNS, MAX_SEED, MAX_STEPS
from dispatcher.planning import Overrides
from pipeline.longrun import INTERRUPTED, GracefulStop
from pipeline.searches import (
    INPUT_ERRORS,
    STOPPING,
    SearchReport,
    SearchRequest,
    best_figure,
    run_searches,
)

PROG = "run_training_experiments"


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
@metric_option
@backend_errors_in_one_line
def run_training_experiments(config_path, tasks_file, algorithm, steps, chains_per_task, seed,
                             size, runs, max_pairs, resume, metric) -> None:
    """Generate training data: search over inlining decisions for every task (candidates
    compared in --metric; a chain's best is confirmed in wall time)."""
    overrides = Overrides(algorithm=algorithm, steps=steps, seed=seed, size=size, runs=runs,
                          max_pairs=max_pairs, chains=chains_per_task, metric=metric)
    if resume:
        refuse_with_resume((["--tasks"] if tasks_file else []) + overrides.given(),
                           "a rundir continues with the settings it recorded")
    show_warnings()
    # The graceful stop stays until the command ends, so the report is written whenever a
    # stop comes: run-campaign's budget stop may come just as the search ends.
    with GracefulStop(STOPPING) as stop:
        try:
            report = run_searches(SearchRequest(config_path, tasks_file, overrides, resume), stop)
        except INPUT_ERRORS as exc:
            fail(str(exc))
        except KeyboardInterrupt:  # a second Ctrl-C (the hard stop), or one before the work
            click.echo(f"\n{stop.hard_stop().resume_line(PROG, config_path)}", err=True)
            sys.exit(INTERRUPTED)
        if report is not None:
            _word(report, config_path)


def _word(report: SearchReport, config_path: Path | None) -> None:
    """What the chains did, one line each, and the exit status: 130 with the --resume line if
    a stop left chains unfinished, 1 if one failed."""
    for line in report.lost_workers:
        click.echo(line, err=True)
    # What the workers did: the share of slot time spent running jobs (a step that waits for
    # its slowest candidate leaves the others idle; search.mode: async does not).
    click.echo(f"worker slots busy {100 * report.busy:.1f}% of {report.wall:.1f} s "
               f"({report.slots} slot{'s' if report.slots != 1 else ''})", err=True)
    for note in report.plot_notes:
        click.echo(note, err=True)
    for c in report.chains:
        if c.status.state == "failed":
            click.echo(f"{c.status.task}: failed: {c.status.error} ({c.rundir})", err=True)
    for c in report.chains:
        if c.status.state == "finished":
            unresolved = (f"; {c.status.unresolved} comparison(s) unresolved (too few "
                          "undisturbed pairs, no speedup)" if c.status.unresolved else "")
            click.echo(f"{c.status.task}: best {best_figure(c.status)}{unresolved} "
                       f"({c.rundir})", err=True)
    for c in report.chains:
        click.echo(f"{c.status.state:12} {c.rundir}")
    if report.ending.interrupted:
        click.echo(report.ending.resume_line(PROG, config_path), err=True)
    if report.ending.exit_status:
        sys.exit(report.ending.exit_status)


def main() -> None:
    run_training_experiments(prog_name=PROG)
