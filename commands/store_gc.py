"""``store-gc``: shrink the store to what the rundirs still need (dispatcher.storage.gc)."""
from __future__ import annotations

from pathlib import Path

import click

from commands.common import fail
from dispatcher.config import ConfigError, load_config
from dispatcher.core.rundir import JOURNAL, RundirError, rundirs_of_batch_log
from dispatcher.storage.gc import collect, needs_of
from dispatcher.storage.store import StoreError


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    raise AssertionError


@click.command()
@click.option("--config", "config_path", type=click.Path(path_type=Path),
              help="Config file naming the store and the batch log (default: "
                   "configs/local.yaml).")
@click.option("--batch-log", "batch_logs", multiple=True, type=click.Path(path_type=Path),
              help="Keep what the rundirs of this batch log need (repeatable; default: the "
                   "config's search.batch_log).")
@click.option("--rundir", "rundirs", multiple=True, type=click.Path(path_type=Path),
              help="Keep what this rundir needs too (repeatable).")
@click.option("--keep-units", is_flag=True,
              help="Keep the compiled units (the incremental compile cache).")
def store_gc(config_path: Path | None, batch_logs: tuple[Path, ...],
             rundirs: tuple[Path, ...], keep_units: bool) -> None:
    """Remove from the store what no rundir needs: compiled candidates no rundir names,
    binaries no unfinished rundir can run next, the compile cache of units, the local agents'
    copies and the remembered compile failures (compiled again when next asked for).
    Measurements are kept.  Prints the store's size before and after.
    Refuses while a command has the store open."""
    try:
        config = load_config(config_path)
        logs = list(batch_logs)
        if not logs and not rundirs:
            logs = [config.search.batch_log]
            if not logs[0].is_file():
                fail(f"{logs[0]}: no such batch log (search.batch_log, relative to the working "
                     "directory): give --batch-log or --rundir, so that what rundirs need is "
                     "kept")
        for rundir in rundirs:  # named by hand: a typo must not cost its candidates
            if not (rundir / JOURNAL).is_file():
                fail(f"{rundir}: not a rundir (no {JOURNAL})")
        listed = dict.fromkeys(p for log in logs for _, p in rundirs_of_batch_log(log))
        needs = needs_of([*listed, *rundirs])
        for note in needs.notes:
            click.echo(f"note: {note}", err=True)
        report = collect(config.store, needs, keep_units=keep_units)
    except (ConfigError, RundirError, StoreError) as exc:
        fail(str(exc))
    ratio = f", {report.before / report.after:.1f}x smaller" if report.after else ""
    click.echo(f"{config.store}: {_size(report.before)} before, {_size(report.after)} after"
               f"{ratio}")
    click.echo(f"kept {report.kept} compiled candidates named by {needs.rundirs} rundirs, "
               f"{report.kept_binaries} with their binary; removed {report.entries} candidates, "
               f"{report.binaries} binaries, {report.units} compiled units, "
               f"{report.worker_cache} agent copies, {report.failures} remembered compile "
               f"failures, {report.leftovers} leftovers of killed writers")


def main() -> None:
    store_gc(prog_name="store-gc")
