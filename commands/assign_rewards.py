"""``assign-rewards [RUNDIR ...]``: per-decision rewards, optimal trees and fit reports from the
rundirs of a batch log (default ``./batch.log``) or those named (``analysis/rewards.py``)."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from analysis.models import DEFAULT_ALPHAS, DEFAULT_GAMMAS, MODELS, TARGETS, grid
from analysis.rewards import BOOTSTRAP_ROUNDS
from commands.common import fail
from pipeline.rewards import Fitted, RewardsInputError, candidates_of, fit_each, rundirs_to_fit


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
                fail(f"{option} {part!r}: expected numbers in ({low:g}, {high:g}]")
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
@click.option("--bootstrap", "rounds", default=BOOTSTRAP_ROUNDS, show_default=True,
              type=click.IntRange(0, 10000), help="Bootstrap refits per configuration for "
              "the rewards' 95% intervals (0: none).")
@click.option("--min-r2", default=0.0, show_default=True, type=float,
              help="Write an optimal.sexp only for a fit whose held-out R^2 is at least this "
                   "(0: it predicts unseen candidates better than their mean).")
@click.option("--min-supported", default=1, show_default=True, type=click.IntRange(0),
              help="Write an optimal.sexp only for a fit with at least this many calls whose "
                   "net reward's 95% bootstrap interval excludes 0.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--plots/--no-plots", default=True, show_default=True,
              help="Draw the figures (predicted.png, rewards.png: most of the command's CPU, "
                   "one per configuration); --no-plots removes those of an earlier run.")
def assign_rewards(rundirs, batch_log, out, benchmarks, models, gammas, alphas, targets,
                   rounds, min_r2, min_supported, seed, plots):
    """Assign a reward to every inlining decision of each benchmark's searches, and write
    the optimal tree (an overrides file) per model and hyperparameters under OUT: one line
    each, its predicted speedup with its held-out fit, or why none was written (a held-out
    R^2 below --min-r2, fewer supported calls than --min-supported)."""
    try:
        paths = rundirs_to_fit(rundirs, batch_log)
        hypers = grid(models or MODELS, _floats("--gamma", gammas, DEFAULT_GAMMAS, 0.0, 1.0),
                      _floats("--alpha", alphas, DEFAULT_ALPHAS, 0.0, 1e6), targets or TARGETS)
        by_bench = candidates_of(paths, benchmarks)
        if min_r2 != min_r2 or min_r2 > 1:  # NaN, or more than a perfect fit
            fail(f"--min-r2 {min_r2}: expected a number at most 1")
        errors = 0
        for fitted in fit_each(by_bench, hypers, rounds, seed, out, min_r2,
                               min_supported, plots):
            if fitted.error is not None:
                click.echo(f"assign-rewards: {fitted.error}", err=True)
                errors += 1
            else:
                _said(fitted, out)
    except RewardsInputError as exc:
        fail(str(exc))
    if errors:
        sys.exit(1)


def _said(fitted: Fitted, out: Path) -> None:
    """A benchmark's rewards in a line, its best measured candidate, a line per fit, and its
    unresolved candidates on stderr."""
    from analysis.rewards import best_measured
    bench, result = fitted.benchmark, fitted.result
    assert result is not None
    trees = sum(w.optimal is not None for w in fitted.written)
    counted = f" (speedups in {fitted.metric}: counted, exact)" if fitted.metric != "time" \
        else ""
    line = (f"{bench}: {len(result.measured)} candidates{counted}, "
            f"{len(result.expanded.nodes)} "
            f"nodes ({len(result.constant)} constant), {trees} optimal trees "
            f"in {out / bench}")
    if trees < len(fitted.written):
        line += f" ({len(fitted.written) - trees} withheld: weak fit, below)"
    if fitted.best is not None:
        b = fitted.best
        line += (f"; best held-out Spearman {b['spearman']:.3f} ({b['model']} "
                 f"{b['hyperparameters']}, {b['split']} split)")
    click.echo(line)
    click.echo(f"{bench}: {best_measured(result.measured)}")
    for w in fitted.written:
        click.echo(w.line(bench))
    if fitted.unresolved:
        click.echo(f"{bench}: {fitted.unresolved} candidate(s) unresolved (fewer undisturbed "
                   "pairs than the chain's minimum): left out, no speedup", err=True)


main = assign_rewards
