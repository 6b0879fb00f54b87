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
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import click

from analysis.result_files import csv_rows, outcome, write_csv
from analysis.results import WITHHELD, Outcome, format_speedup, print_tables
from analysis.sources import SourcesError, benchmark_of
from commands.common import (
    backend_errors_in_one_line,
    closing_session,
    show_warnings,
)
from dispatcher.build.manifest import Benchmark, ManifestError
from dispatcher.build.service import CompileJob, OverridesMismatch
from dispatcher.build.toolchain import CompilerNotFound
from dispatcher.compare import Contender, Failure, compare_with_heuristic, pairing_policy
from dispatcher.config import MAX_RUNS, ConfigError, load_config
from dispatcher.core.decisions import DecisionFileError, Override, read_overrides
from dispatcher.running.measurement import Comparison
from dispatcher.session import Session
from pipeline.longrun import progress

PROG = "run-all-benchmarks"


def _fail(message: str) -> NoReturn:
    click.echo(f"{PROG}: {message}", err=True)
    sys.exit(2)


@dataclass(frozen=True)
class OptimalTree:
    """One optimal tree to measure."""

    hyper: str
    path: Path
    overrides: tuple[Override, ...]


@dataclass(frozen=True)
class Target:
    """One benchmark's optimal trees, and where they came from."""

    name: str
    bench: Benchmark
    rundirs: tuple[str, ...]
    trees: tuple[OptimalTree, ...]


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.is_dir()) if directory.is_dir() \
        else []


def _optimal_files(rewards: Path, bench: str, model: str) -> dict[str, Path]:
    model_dir = rewards / bench / model
    return {h: model_dir / h / "optimal.sexp" for h in _names(model_dir)
            if (model_dir / h / "optimal.sexp").is_file()}


def _withheld(rewards: Path, bench: str, model: str) -> dict[str, str]:
    """hyper -> why it has no optimal.sexp (assign-rewards' no-optimal.txt), for each
    hyperparameter directory of ``model`` without one."""
    model_dir = rewards / bench / model
    out = {}
    for h in _names(model_dir):
        d = model_dir / h
        if (d / "optimal.sexp").is_file():
            continue
        try:
            lines = (d / WITHHELD).read_text().splitlines()
        except (OSError, UnicodeDecodeError):
            lines = []
        out[h] = lines[0].strip() if lines and lines[0].strip() else f"no optimal.sexp in {d}"
    return out


def _locate(rewards: Path, name: str) -> tuple[Benchmark, tuple[str, ...]]:
    try:
        return benchmark_of(rewards, name)
    except (SourcesError, ManifestError) as exc:
        _fail(str(exc))


def collect(rewards: Path, model: str, benchmarks: tuple[str, ...],
            hypers: tuple[str, ...]) -> tuple[list[Target], list[Outcome]]:
    """Every optimal tree to measure, read and checked before anything is compiled; and every
    setting skipped for want of one (an outcome without a speedup, its reason as ``stopped``)."""
    if not rewards.is_dir():
        _fail(f"{rewards}: no such rewards directory (assign-rewards --out writes one)")
    known = _names(rewards)
    for b in benchmarks:
        if b not in known:
            _fail(f"unknown benchmark {b}: no {rewards / b} (benchmarks there: "
                  f"{', '.join(known) or 'none'})")
    files = {b: _optimal_files(rewards, b, model) for b in benchmarks or known}
    withheld = {b: _withheld(rewards, b, model) for b in files}
    if not any(files.values()) and not any(withheld.values()):
        models = sorted({m for b in files for m in _names(rewards / b)})
        where = rewards / benchmarks[0] if len(benchmarks) == 1 else rewards
        _fail(f"no optimal.sexp for model {model} under {where} (models there: "
              f"{', '.join(models) or 'none'})")
    found = {h for per in files.values() for h in per}
    for h in hypers:
        if h not in found and not any(h in per for per in withheld.values()):
            _fail(f"no optimal.sexp for model {model} with hyperparameters {h} under {rewards} "
                  f"(found: {', '.join(sorted(found))})")
    skipped = [Outcome(name, h, None, stopped=reason)
               for name, per in withheld.items() for h, reason in sorted(per.items())
               if not hypers or h in hypers]
    targets = []
    for name, per in files.items():
        chosen = {h: p for h, p in per.items() if not hypers or h in hypers}
        if not chosen:
            if name in benchmarks and not any(o.benchmark == name for o in skipped):
                _fail(f"no optimal.sexp for model {model} under {rewards / name} "
                      f"with hyperparameters {', '.join(hypers) if hypers else 'any'}")
            continue
        bench, rundirs = _locate(rewards, name)
        trees = []
        for h, path in sorted(chosen.items()):
            try:
                trees.append(OptimalTree(h, path, tuple(read_overrides(path))))
            except DecisionFileError as exc:
                _fail(str(exc))
        targets.append(Target(name, bench, rundirs, tuple(trees)))
    return targets, skipped


def _candidate_failure(c: Comparison) -> str:
    for r in c.results:
        for rec in r.records:
            if rec.failure:
                return f"{r.worker}: {rec.failure}"
    return "a run failed"


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
@backend_errors_in_one_line
def run_all_benchmarks(model: str, benchmarks: tuple[str, ...], rewards: Path, results: Path,
                       config_path: Path | None, size: str | None, runs: int | None,
                       max_pairs: int | None, hypers: tuple[str, ...]) -> None:
    """Measure each benchmark's optimal tree for MODEL (one per hyperparameters, under
    REWARDS/<bench>/MODEL/) against the heuristic build, in pairs on one worker CPU; write
    RESULTS/<bench>/MODEL/<hyperparameters>.csv and print the speedups, the best and median
    per benchmark, and the hyperparameters to use in general: of least total regret across
    benchmarks among those measured significantly faster than the heuristic somewhere and
    slower nowhere, with the measurements that support them, or why there are none.  A
    setting without an optimal.sexp (assign-rewards withheld it: a weak fit) is skipped."""
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        _fail(str(exc))
    targets, skipped = collect(rewards, model, benchmarks, hypers)
    for o in skipped:
        click.echo(f"{PROG}: {o.benchmark}/{model}/{o.hyper}: skipped: {o.stopped}", err=True)
    if not targets:
        print_tables(skipped)
        return
    sizes = {}
    for t in targets:
        try:
            sizes[t.name] = t.bench.size(size or config.run.size)
        except ManifestError as exc:
            _fail(str(exc))
    runs = runs or config.run.runs
    pairing = pairing_policy(config, runs, max_pairs)
    try:
        session = Session(config)
    except CompilerNotFound as exc:
        _fail(str(exc))
    show_warnings()
    outcomes: list[Outcome] = list(skipped)
    errors = 0

    def error(message: str) -> None:
        nonlocal errors
        errors += 1
        click.echo(f"{PROG}: {message}", err=True)

    # Every build is asked for at once (each benchmark's heuristic first); a comparison starts
    # as soon as its build is done, and its CSV is written as soon as it ends.
    contenders = [Contender((target, tree), target.bench, CompileJob(target.bench, tree.overrides),
                            sizes[target.name])
                  for target in targets for tree in target.trees]
    with closing_session(session):
        with closing(compare_with_heuristic(session, contenders, runs, pairing)) as compared_all:
            for got in compared_all:
                target, tree = got.contender.tag
                label = f"{target.name}/{model}/{tree.hyper}"
                reach = got.override_reach()
                unreached = reach.line(tree.path) if reach is not None else None
                if unreached:
                    click.echo(unreached, err=True)
                if got.failure is Failure.HEURISTIC:
                    error(f"{target.name}: the heuristic build failed: {got.error}")
                elif isinstance(got.error, OverridesMismatch):
                    error(f"{tree.path}: {got.error}")
                elif got.failure is Failure.COMPILE:
                    error(f"{tree.path}: compile failed: {got.error}")
                elif got.failure is Failure.MEASURE:
                    error(f"{label}: not measured: {got.error}")
                else:
                    compared = got.comparison
                    assert compared is not None
                    try:
                        path = write_csv(results / target.name / model / f"{tree.hyper}.csv",
                                         csv_rows(compared, str(tree.path), target.rundirs))
                    except OSError as exc:  # the comparison is in the store: a rerun writes it
                        _fail(f"{results}: cannot write the results: {exc.strerror or exc}")
                    outcome_ = outcome(target.name, tree.hyper, compared)
                    outcomes.append(outcome_)
                    figure = (f"speedup {format_speedup(outcome_)} ({compared.pairs} pairs "
                              f"on {compared.worker}, stopped: {compared.stopped})"
                              if compared.resolved
                              else f"no speedup, {compared.unresolved_line()}")
                    progress(f"{label}: {figure} -> {path}")
                    if compared.failed:
                        error(f"{label}: the optimal tree's build failed a run "
                              f"({_candidate_failure(compared)})")
    if outcomes:
        print_tables(outcomes)
    if errors:
        sys.exit(1)


main = run_all_benchmarks
