"""``run-all-benchmarks MODEL [BENCH ...]``: measure every optimal tree ``assign-rewards`` wrote
for MODEL against the heuristic, and say which hyperparameters to use.

For each benchmark under the rewards directory (or each one named) and each
``<rewards>/<bench>/<MODEL>/<hyper>/optimal.sexp``, the benchmark (the directory its rundirs
recorded, in ``sources.json``; the bundled benchmark of that name when none was recorded) is
compiled with those overrides and compared with its heuristic build in pairs on one worker CPU,
as ``run-benchmark BENCH optimal.sexp`` compares it (``dispatcher.compare``).
Each comparison is written to ``<results>/<bench>/<MODEL>/<hyper>.csv`` as soon as it ends
(README.md, "results/"); comparisons measured before come from the store.  The table at the
end is ``analysis.results``'s, and so is its last line: the hyperparameters to use in general
with the measurements that support them, or why none are recommended.

A hyperparameter directory without an ``optimal.sexp`` (``assign-rewards`` withheld it: a weak
fit, its reason in ``no-optimal.txt``) is skipped, said in one line, and listed in the table;
it is no error.
"""
from __future__ import annotations

import sys
from pathlib import Path

import click

from analysis.results import Outcome, print_tables
from commands.common import (
    backend_errors_in_one_line,
    closing_session,
    fail,
    metric_option,
    show_warnings,
)
from dispatcher.build.toolchain import CompilerNotFound
from dispatcher.compare import pairing_policy
from dispatcher.config import MAX_RUNS, ConfigError, load_config, with_metric
from dispatcher.core.figures import metric_caption
from dispatcher.session import Session
from pipeline.evaluation import Evaluated, EvaluationError, collect, measure_trees, sizes_of
from pipeline.longrun import progress

PROG = "run-all-benchmarks"


def _said(step: Evaluated) -> int:
    """One comparison's lines on stderr; the errors among them."""
    if step.note:
        click.echo(step.note, err=True)
    c = step.comparison
    if c is not None and step.outcome is not None:
        figure = (f"speedup {step.outcome.text()} ({c.pairs} pairs on {c.worker}, stopped: "
                  f"{c.stopped})" if c.resolved else f"no speedup, {c.unresolved_line()}")
        if c.metric != "time":
            figure = f"speedup in {c.metric} {step.outcome.text()} (exact, on {c.worker})"
        progress(f"{step.label}: {figure} -> {step.csv}")
    for line in step.errors:
        click.echo(f"{PROG}: {line}", err=True)
    return len(step.errors)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("model")
@click.argument("benchmarks", nargs=-1)
@click.option("--rewards", type=click.Path(path_type=Path), default=Path("rewards"),
              show_default=True, help="The output directory of assign-rewards.")
@click.option("--results", type=click.Path(file_okay=False, path_type=Path),
              default=Path("results"), show_default=True,
              help="Where <bench>/<model>/<hyperparameters>.csv are written.")
@click.option("--config", "config_path", type=click.Path(path_type=Path),
              help="Config file (default: configs/local.yaml).")
@click.option("--size", help="Benchmark size from its manifest (default: config).")
@click.option("--runs", type=click.IntRange(1, MAX_RUNS),
              help="Fewest pairs per comparison (default: config run.runs).")
@click.option("--max-pairs", type=click.IntRange(1, MAX_RUNS),
              help="Most pairs per comparison (default: config measure.max_pairs).")
@click.option("--hyper", "hypers", multiple=True,
              help="Only these hyperparameters, as named by their directory "
                   "(gamma0.8-alpha0.01-log; repeatable; default: every one found).")
@metric_option
@backend_errors_in_one_line
def run_all_benchmarks(model: str, benchmarks: tuple[str, ...], rewards: Path, results: Path,
                       config_path: Path | None, size: str | None, runs: int | None,
                       max_pairs: int | None, hypers: tuple[str, ...],
                       metric: str | None) -> None:
    """Measure each benchmark's optimal tree for MODEL (one per hyperparameters, under
    REWARDS/<bench>/MODEL/) against the heuristic build, in pairs on one worker CPU; write
    RESULTS/<bench>/MODEL/<hyperparameters>.csv and print the speedups, the best and median
    per benchmark, and the hyperparameters to use in general: of least total regret across
    benchmarks among those measured significantly faster than the heuristic somewhere and
    slower nowhere, with the measurements that support them, or why there are none.  A
    setting without an optimal.sexp (assign-rewards withheld it: a weak fit) is skipped."""
    try:
        config = with_metric(load_config(config_path), metric)
        targets, skipped = collect(rewards, model, benchmarks, hypers)
        for o in skipped:
            click.echo(f"{PROG}: {o.benchmark}/{model}/{o.hyper}: skipped: {o.stopped}",
                       err=True)
        if not targets:
            print_tables(skipped)
            return
        sizes = sizes_of([t.bench for t in targets], size or config.run.size)
        runs = runs or config.run.runs
        session = Session(config)
        show_warnings()
        outcomes: list[Outcome] = list(skipped)
        errors = 0
        with closing_session(session):
            for step in measure_trees(session, targets, model, results, sizes, runs,
                                      pairing_policy(config, runs, max_pairs)):
                errors += _said(step)
                if step.outcome is not None:
                    outcomes.append(step.outcome)
    except (ConfigError, CompilerNotFound, EvaluationError) as exc:
        fail(str(exc))
    if outcomes:
        click.echo(metric_caption(config.measure.metric))
        print_tables(outcomes)
    if errors:
        sys.exit(1)


main = run_all_benchmarks
