"""``batch-log``: the state of every experiment in a batch log, and exports and plots of them.

    batch-log [BATCH_LOG] [--csv] [--plot] [--export OUT.csv|OUT.parquet] [--rundir RUNDIR ...]

The table, its statuses and speedups are ``analysis.batch_log``'s; exports
``analysis.export``'s; plots ``analysis.plots``'.  This command reads rundirs and never
modifies them, except for ``plot.png`` with ``--plot``.
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import click

from analysis.batch_log import STALE_AFTER_S, print_csv, print_table, summaries
from commands.common import fail
from dispatcher.core.records import BatchEntry
from dispatcher.core.rundir import RundirError, rundirs_of_batch_log

Listed = list[tuple[BatchEntry, Path]]  # the batch log's entries, each with its rundir


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("batch_log", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--csv", "as_csv", is_flag=True, help="Print the table as CSV.")
@click.option("--plot", is_flag=True, help="Write <rundir>/plot.png for each experiment.")
@click.option("--export", "export_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Export every run of the experiments to OUT.csv or OUT.parquet.")
@click.option("--rundir", "rundirs", multiple=True, type=click.Path(path_type=Path),
              help="Only this rundir (repeatable; default: every rundir in the batch log).")
@click.option("--stale-after", default=STALE_AFTER_S, show_default=True, type=float,
              help="Seconds without a journal event before a running experiment is 'stale'.")
def batch_log(batch_log, as_csv, plot, export_path, rundirs, stale_after):
    """Show the experiments of BATCH_LOG (default ./batch.log): progress, best speedup with its
    95% confidence interval, last update and status; optionally plot or export them."""
    explicit_log = batch_log is not None
    batch_log = batch_log if explicit_log else Path("batch.log")
    listed: Listed = []
    try:
        if explicit_log or not rundirs or batch_log.is_file():
            listed = rundirs_of_batch_log(batch_log)
    except RundirError as exc:
        fail(str(exc))
    selected = list(rundirs) if rundirs else None
    if export_path is not None:
        _export(listed, selected, export_path)
        return
    rows = summaries(listed, selected, stale_after=stale_after)
    if plot:
        _plot(listed, selected, rows)
        return
    if as_csv:
        print_csv(rows)
    else:
        print_table(rows)
    bad = [s for s in rows if s.error]
    for s in bad:
        click.echo(f"batch-log: {s.error}", err=True)
    if bad:
        sys.exit(1)


def _selected_paths(listed: Listed, selected: list[Path] | None) -> list[tuple[Path, bool]]:
    """(path, explicitly asked for) of every selected rundir."""
    if selected is not None:
        return [(p, True) for p in selected]
    return [(path, False) for _, path in listed]


def _plot(listed: Listed, selected: list[Path] | None, rows) -> None:
    from analysis.plots import plot_experiment

    failed = False
    for (path, explicit), s in zip(_selected_paths(listed, selected), rows):
        if s.status == "missing":
            click.echo(f"batch-log: {path}: rundir missing, not plotted", err=True)
            failed = failed or explicit
            continue
        try:
            click.echo(str(plot_experiment(path)))
        except RundirError as exc:
            click.echo(f"batch-log: {exc}", err=True)
            failed = True
    if failed:
        sys.exit(1)


def _export(listed: Listed, selected: list[Path] | None, out: Path) -> None:
    from analysis.export import (
        ExportError,
        MeasurementWarning,
        export_format,
        measurements_table,
        write_table,
    )

    try:
        export_format(out)  # before reading everything: e.g. pyarrow missing
    except ExportError as exc:
        fail(str(exc))
    paths = []
    for path, explicit in _selected_paths(listed, selected):
        if not path.is_dir():
            if explicit:
                fail(f"{path}: no such rundir")
            click.echo(f"batch-log: {path}: rundir missing, skipped", err=True)
            continue
        paths.append(path)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", MeasurementWarning)
            table = measurements_table(paths)
        for w in caught:
            if issubclass(w.category, MeasurementWarning):
                click.echo(f"batch-log: {w.message}", err=True)
            else:
                warnings.showwarning(w.message, w.category, w.filename, w.lineno)
        write_table(table, out)
    except (ExportError, RundirError) as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"{out}: cannot write: {exc.strerror or exc}")
    click.echo(f"{out}: {len(table)} runs from {len(paths)} rundirs", err=True)


def main() -> None:
    batch_log(prog_name="batch-log")
