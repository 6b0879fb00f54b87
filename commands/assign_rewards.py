"""``assign-rewards [RUNDIR ...]``: per-decision rewards, optimal trees and fit reports from the
rundirs of a batch log (default ``./batch.log``) or those named (``analysis/rewards.py``)."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from analysis.batch_log import AnalysisError, load_batch_log, resolve_rundir
from analysis.models import DEFAULT_ALPHAS, DEFAULT_GAMMAS, MODELS, TARGETS, grid


def _fail(message: str) -> None:
    click.echo(f"assign-rewards: {message}", err=True)
    sys.exit(2)


def _floats(option: str, values: tuple[str, ...], default: tuple[float, ...],
            low: float, high: float) -> list[float]:
    out = []
    for text in values or ():
        for part in text.split(","):
            try:
                v = float(part)
            except ValueError:
                v = float("nan")
            if not low < v <= high:
                _fail(f"{option} {part!r}: expected numbers in ({low:g}, {high:g}]")
            out.append(v)
    return out or list(default)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("rundirs", nargs=-1, type=click.Path(path_type=Path))
@click.option("--batch-log", type=click.Path(dir_okay=False, path_type=Path),
              help="Take every rundir of this batch log (default ./batch.log when no RUNDIR).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              default=Path("rewards"), show_default=True, help="Output directory.")
@click.option("--benchmark", "benchmarks", multiple=True,
              help="Only this benchmark (repeatable).")
@click.option("--model", "models", multiple=True, type=click.Choice(MODELS),
              help="Models to fit (repeatable; default: all).")
@click.option("--gamma", "gammas", multiple=True,
              help=f"Depth weights (comma-separated; default {DEFAULT_GAMMAS}).")
@click.option("--alpha", "alphas", multiple=True,
              help=f"Regularisation strengths (default {DEFAULT_ALPHAS}).")
@click.option("--target", "targets", multiple=True, type=click.Choice(TARGETS),
              help="Regression targets: speedup - 1 (linear) or log speedup (default: both).")
@click.option("--bootstrap", "rounds", default=100, show_default=True,
              type=click.IntRange(0, 10000), help="Bootstrap refits per configuration for "
              "the rewards' 95% intervals (0: none).")
@click.option("--min-r2", default=0.0, show_default=True, type=float,
              help="Write an optimal.sexp only for a fit whose held-out R^2 is at least this "
                   "(0: it predicts unseen candidates better than their mean).")
@click.option("--min-supported", default=1, show_default=True, type=click.IntRange(0),
              help="Write an optimal.sexp only for a fit with at least this many calls whose "
                   "net reward's 95% bootstrap interval excludes 0.")
@click.option("--seed", default=0, show_default=True, type=int)
def assign_rewards(rundirs, batch_log, out, benchmarks, models, gammas, alphas, targets,
                   rounds, min_r2, min_supported, seed):
    """Assign a reward to every inlining decision of each benchmark's searches, and write
    the optimal tree (an overrides file) per model and hyperparameters under OUT: one line
    each, its predicted speedup with its held-out fit, or why none was written (a held-out
    R^2 below --min-r2, fewer supported calls than --min-supported)."""
    # scipy and scikit-learn load here, when the command runs, not when it is imported
    from analysis.extract import ExtractError, extract
    from analysis.rewards import RewardError, assign, best_measured, write
    paths = list(rundirs)
    if batch_log is not None or not paths:
        log = batch_log or Path("batch.log")
        try:
            entries = load_batch_log(log)
        except AnalysisError as exc:
            _fail(str(exc))
        if not entries:
            _fail(f"{log}: the batch log lists no experiment")
        paths += [resolve_rundir(log, e.rundir) for e in entries]
    hypers = grid(models or MODELS, _floats("--gamma", gammas, DEFAULT_GAMMAS, 0.0, 1.0),
                  _floats("--alpha", alphas, DEFAULT_ALPHAS, 0.0, 1e6), targets or TARGETS)
    try:
        by_bench = extract(paths)
    except ExtractError as exc:
        _fail(str(exc))
    if benchmarks:
        unknown = sorted(set(benchmarks) - set(by_bench))
        if unknown:
            _fail(f"no rundir of benchmark {', '.join(unknown)} "
                  f"(found: {', '.join(sorted(by_bench)) or 'none'})")
        by_bench = {b: by_bench[b] for b in benchmarks}
    if min_r2 != min_r2 or min_r2 > 1:  # NaN, or more than a perfect fit
        _fail(f"--min-r2 {min_r2}: expected a number at most 1")
    errors = 0
    for bench, candidates in sorted(by_bench.items()):
        try:
            result = assign(candidates, hypers, rounds, seed)
        except RewardError as exc:
            click.echo(f"assign-rewards: {exc}", err=True)
            errors += 1
            continue
        try:
            written = write(result, out, min_r2, min_supported)
        except OSError as exc:
            _fail(f"{out}: cannot write the results: {exc.strerror or exc}")
        table = result.scores_table()
        best = table[table["spearman"].notna()].sort_values("spearman", ascending=False).head(1)
        trees = sum(w.optimal is not None for w in written)
        line = (f"{bench}: {len(result.measured)} candidates, {len(result.expanded.nodes)} "
                f"nodes ({len(result.constant)} constant), {trees} optimal trees "
                f"in {out / bench}")
        if trees < len(written):
            line += f" ({len(written) - trees} withheld: weak fit, below)"
        if len(best):
            b = best.iloc[0]
            line += (f"; best held-out Spearman {b['spearman']:.3f} ({b['model']} "
                     f"{b['hyperparameters']}, {b['split']} split)")
        click.echo(line)
        click.echo(f"{bench}: {best_measured(result.measured)}")
        for w in written:
            click.echo(w.line(bench))
        unresolved = int(candidates.table["unresolved"].fillna(False).astype(bool).sum())
        if unresolved:
            click.echo(f"{bench}: {unresolved} candidate(s) unresolved (fewer undisturbed "
                       "pairs than the chain's minimum): left out, no speedup", err=True)
    if errors:
        sys.exit(1)


main = assign_rewards
