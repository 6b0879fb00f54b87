"""``run-all-benchmarks MODEL [BENCH ...]``: measure every optimal tree ``assign-rewards`` wrote
for MODEL against the heuristic, and say which hyperparameters to use.

For each benchmark under the rewards directory (or each one named) and each
``<rewards>/<bench>/<MODEL>/<hyper>/optimal.sexp``, the benchmark (the directory its rundirs
recorded, in ``sources.json``; the bundled benchmark of that name when none was recorded) is
compiled with those overrides and compared with its heuristic build in pairs on one worker CPU,
as ``run-benchmark BENCH optimal.sexp`` compares it (``commands.common.heuristic_comparison``).
Each comparison is written to ``<results>/<bench>/<MODEL>/<hyper>.csv`` as soon as it ends
(README.md, "results/"); comparisons measured before come from the store.  The table at the
end is ``analysis.results``'s.
"""
from __future__ import annotations

import csv
import sys
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import click

from analysis.results import Outcome, format_speedup, print_tables
from analysis.sources import SourcesError, benchmark_of
from commands.common import (
    backend_errors_in_one_line,
    heuristic_comparison,
    pairing_policy,
    report_lost_workers,
    run_job,
    show_warnings,
)
from dispatcher.build.manifest import Benchmark, ManifestError
from dispatcher.build.service import CompileError, CompileJob, CompileResult, OverridesMismatch
from dispatcher.build.toolchain import CompilerNotFound
from dispatcher.config import MAX_RUNS, ConfigError, load_config
from dispatcher.core.decisions import DecisionFileError, Override, read_overrides
from dispatcher.core.files import atomic_output
from dispatcher.running.agent_client import AgentError
from dispatcher.running.measurement import Comparison, ReferenceFailed
from dispatcher.session import Session

PROG = "run-all-benchmarks"
HEURISTIC = "heuristic"  # the overrides column of the heuristic's paired runs


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


def _locate(rewards: Path, name: str) -> tuple[Benchmark, tuple[str, ...]]:
    try:
        return benchmark_of(rewards, name)
    except (SourcesError, ManifestError) as exc:
        _fail(str(exc))


def collect(rewards: Path, model: str, benchmarks: tuple[str, ...],
            hypers: tuple[str, ...]) -> list[Target]:
    """Every optimal tree to measure, read and checked before anything is compiled."""
    if not rewards.is_dir():
        _fail(f"{rewards}: no such rewards directory (assign-rewards --out writes one)")
    known = _names(rewards)
    for b in benchmarks:
        if b not in known:
            _fail(f"unknown benchmark {b}: no {rewards / b} (benchmarks there: "
                  f"{', '.join(known) or 'none'})")
    files = {b: _optimal_files(rewards, b, model) for b in benchmarks or known}
    if not any(files.values()):
        models = sorted({m for b in files for m in _names(rewards / b)})
        where = rewards / benchmarks[0] if len(benchmarks) == 1 else rewards
        _fail(f"no optimal.sexp for model {model} under {where} (models there: "
              f"{', '.join(models) or 'none'})")
    found = {h for per in files.values() for h in per}
    for h in hypers:
        if h not in found:
            _fail(f"no optimal.sexp for model {model} with hyperparameters {h} under {rewards} "
                  f"(found: {', '.join(sorted(found))})")
    targets = []
    for name, per in files.items():
        chosen = {h: p for h, p in per.items() if not hypers or h in hypers}
        if not chosen:
            if name in benchmarks:
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
    return targets


def pairs_by_worker(c: Comparison) -> dict[str, tuple[list[float], list[float]]]:
    """The comparison's pairs by the slot they ran on: worker -> (reference times, candidate
    times), in the order they ran.  The pairs are matched to the rounds of ``c.results``
    (reference, candidate, candidate, reference, every run of a round on one slot); any pair no
    round accounts for is put on ``c.worker``, the slot of the last pairs."""
    expected = list(zip(c.reference_times, c.candidate_times))
    out: dict[str, tuple[list[float], list[float]]] = {}
    i = 0
    rs = c.results
    for k in range(0, len(rs) - len(rs) % 4, 4):
        r1, c1, c2, r2 = rs[k:k + 4]
        if len({r.worker for r in (r1, c1, c2, r2)}) != 1:
            continue
        for ref, cand in ((r1, c1), (r2, c2)):
            if i < len(expected) and ref.times and cand.times \
                    and (ref.times[0], cand.times[0]) == expected[i]:
                refs, cands = out.setdefault(ref.worker, ([], []))
                refs.append(ref.times[0])
                cands.append(cand.times[0])
                i += 1
    for ref_t, cand_t in expected[i:]:
        refs, cands = out.setdefault(c.worker or "-", ([], []))
        refs.append(ref_t)
        cands.append(cand_t)
    return out


def csv_rows(c: Comparison, overrides: str, rundirs: tuple[str, ...]) -> list[list[str]]:
    """The header and, per worker, a line of the optimal tree's paired run times and one of
    the heuristic's (README.md, "results/")."""
    by_worker = pairs_by_worker(c) or {c.worker or "-": ([], [])}
    longest = max(len(cands) for _, cands in by_worker.values())
    rows = [["worker", "overrides", "rundirs", *(f"run_{i + 1}" for i in range(longest))]]
    for worker, (refs, cands) in by_worker.items():
        for label, source, times in ((overrides, ";".join(rundirs), cands),
                                     (HEURISTIC, "", refs)):
            cells = [f"{t:.6f}" for t in times]
            rows.append([worker, label, source, *cells, *[""] * (longest - len(cells))])
    return rows


def write_csv(path: Path, rows: list[list[str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(path) as tmp:
        with open(tmp, "w", newline="") as f:
            csv.writer(f, lineterminator="\n").writerows(rows)
    return path


def outcome(name: str, hyper: str, c: Comparison) -> Outcome:
    speedup, low, high = c.interval
    return Outcome(name, hyper, speedup, low, high, c.pairs, c.worker, c.stopped)


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
    per benchmark, and the hyperparameters of least total regret across benchmarks."""
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        _fail(str(exc))
    targets = collect(rewards, model, benchmarks, hypers)
    sizes = {}
    for t in targets:
        try:
            sizes[t.name] = t.bench.size(size or config.run.size)
        except ManifestError as exc:
            _fail(str(exc))
    runs = runs or config.run.runs
    policy = pairing_policy(config, runs, max_pairs)
    try:
        session = Session(config)
    except CompilerNotFound as exc:
        _fail(str(exc))
    show_warnings()
    outcomes: list[Outcome] = []
    errors = 0

    def error(message: str) -> None:
        nonlocal errors
        errors += 1
        click.echo(f"{PROG}: {message}", err=True)

    # (comparison, benchmark, tree): two trees that compile to one binary share one future
    pending: list[tuple[Future[Comparison], Target, OptimalTree]] = []

    def finish_done() -> None:
        for item in [p for p in pending if p[0].done()]:
            pending.remove(item)
            finish(*item)

    def finish(future: Future[Comparison], target: Target, tree: OptimalTree) -> None:
        label = f"{target.name}/{model}/{tree.hyper}"
        try:
            compared = future.result()
        except (AgentError, ReferenceFailed) as exc:
            error(f"{label}: not measured: {exc}")
            return
        try:
            path = write_csv(results / target.name / model / f"{tree.hyper}.csv",
                             csv_rows(compared, str(tree.path), target.rundirs))
        except OSError as exc:  # the comparison itself is in the store: a rerun writes it
            _fail(f"{results}: cannot write the results: {exc.strerror or exc}")
        got = outcome(target.name, tree.hyper, compared)
        outcomes.append(got)
        click.echo(f"{label}: speedup {format_speedup(got)} ({compared.pairs} pairs on "
                   f"{compared.worker}, stopped: {compared.stopped}) -> {path}", err=True)
        if compared.failed:
            error(f"{label}: the optimal tree's build failed a run "
                  f"({_candidate_failure(compared)})")

    # Every build is asked for at once (the compile pool takes them in turn, each benchmark's
    # heuristic first); a comparison starts as soon as its build is done, and its CSV is
    # written as soon as it ends.
    compiling: list[tuple[Future[CompileResult], Target, OptimalTree | None]] = []
    no_heuristic: set[str] = set()

    def start(future: Future[CompileResult], target: Target, tree: OptimalTree | None) -> None:
        if target.name in no_heuristic:
            return
        try:
            compiled = future.result()
            if tree is None:
                return
            job = run_job(config, sizes[target.name], compiled, runs)
            pending.append((heuristic_comparison(session, target.bench, job, policy),
                            target, tree))
        except OverridesMismatch as exc:
            error(f"{tree.path if tree else target.name}: {exc}")
        except CompileError as exc:
            if tree is None or future.exception() is None:  # the heuristic's own build
                no_heuristic.add(target.name)
                error(f"{target.name}: the heuristic build failed: {exc}")
            else:
                error(f"{tree.path}: compile failed: {exc}")

    try:
        for target in targets:
            compiling.append((session.compiler.submit(CompileJob(target.bench)), target, None))
            compiling += [(session.compiler.submit(CompileJob(target.bench, t.overrides)),
                           target, t) for t in target.trees]
        while compiling or pending:
            futures: set[Future[Any]] = {f for f, _, _ in compiling} | {f for f, _, _ in pending}
            wait(futures, return_when=FIRST_COMPLETED)
            for item in [c for c in compiling if c[0].done()]:
                compiling.remove(item)
                start(*item)
            finish_done()
    finally:
        for f, _, _ in compiling:  # Ctrl-C: builds not started yet are not waited for
            f.cancel()
        session.close()
    report_lost_workers(session)
    if outcomes:
        print_tables(outcomes)
    if errors:
        sys.exit(1)


main = run_all_benchmarks
