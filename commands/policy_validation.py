"""``train-policy --validate measured``: each leave-one-benchmark-out fold's policy compiled into
the benchmark it never saw and measured against that benchmark's heuristic build.

Label accuracy says how often a classifier agrees with the labels; it does not say what its
answers cost (docs/policies.md, "lu: one answer that costs everything").  Here each fold's
classifier, trained on every benchmark but one, is written as a policy file with the command's
guard rails, the compiler evaluates it (``-inlining-policy``) on the held-out benchmark, and
the build is compared in pairs with the heuristic's through ``dispatcher.compare`` (the store
answers comparisons measured before: fold files are deterministic, so a rerun measures only
what is new).  The classifier kept is the one whose worst held-out speedup is best; the gate
fails when that worst speedup is below ``GATE``.

This module words what it measured; ``commands.train_policy`` decides when to call it.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from contextlib import closing
from pathlib import Path

import click
import pandas as pd

from analysis.policy_training import TrainingSet, train
from commands.common import closing_session
from dispatcher.build.manifest import Benchmark, Size
from dispatcher.build.policies import PolicyError, parse_policy
from dispatcher.build.policy_file import save_policy_file
from dispatcher.build.service import CompileJob
from dispatcher.compare import Contender, Failure, compare_with_heuristic, pairing_policy
from dispatcher.config import Config
from dispatcher.core.figures import Figure
from dispatcher.session import Session
from pipeline.longrun import progress
from pipeline.policy.selection import (  # noqa: F401  (train-policy reads them here)
    EXIT_GATE,
    GATE,
    FoldMeasure,
    choose_measured,
    gate_line,
    geomean,
    worst,
)

_NAME_BAD = re.compile(r"[^A-Za-z0-9._-]")


def subset(ts: TrainingSet, keep: pd.Series) -> TrainingSet:
    """The rows of ``ts`` where ``keep`` holds."""
    return TrainingSet(features=ts.features[keep], labels=ts.labels[keep],
                       benchmarks=ts.benchmarks[keep])


def fold_policies(ts: TrainingSet, classifiers: Sequence[str], threshold: float,
                  folds_dir: Path, *, margin: float, ranges: bool,
                  growth_budget: int | None) -> dict[tuple[str, str], Path]:
    """Per (classifier, held-out benchmark): the policy file of that classifier trained on
    every other benchmark, with the guard rails the kept policy will have, written under
    ``folds_dir``.  Nothing when fewer than two benchmarks (no fold has training data)."""
    benches = sorted(ts.benchmarks.unique())
    out: dict[tuple[str, str], Path] = {}
    if len(benches) < 2:
        return out
    folds_dir.mkdir(parents=True, exist_ok=True)
    for name in classifiers:
        for bench in benches:
            policy = train(subset(ts, ts.benchmarks != bench), name, threshold,
                           margin=margin, ranges=ranges, growth_budget=growth_budget)
            path = folds_dir / f"{name}.{_NAME_BAD.sub('_', bench)}.policy"
            save_policy_file(policy, path)
            out[(name, bench)] = path
    return out


def measure_folds(config: Config, folds: Mapping[tuple[str, str], Path],
                  benches: Mapping[str, Benchmark], sizes: Mapping[str, Size], runs: int,
                  max_pairs: int | None) -> list[FoldMeasure]:
    """Every fold's policy compiled into its held-out benchmark (the compiler evaluating the
    file) and compared with that benchmark's heuristic build, all at once (builds in the
    compile pool, comparisons as slots free up).  A progress line per fold as it ends."""
    contenders = []
    for (name, bench), path in folds.items():
        try:
            spec = parse_policy(str(path))
        except PolicyError as exc:  # written a moment ago: only a disk fault gets here
            raise click.ClickException(str(exc)) from None
        b = benches[bench]
        contenders.append(Contender((name, bench, path), b, CompileJob(b, policy=spec),
                                    sizes[bench]))
    session = Session(config)
    pairing = pairing_policy(config, runs, max_pairs)
    got_all: list[FoldMeasure] = []
    with closing_session(session):
        with closing(compare_with_heuristic(session, contenders, runs, pairing)) as compared:
            for got in compared:
                name, bench, path = got.contender.tag
                measure = _measure_of(session, got, name, bench, path)
                got_all.append(measure)
                ratio = measure.figure.size_ratio
                size = f", binary {ratio:.3f}x the heuristic's" if ratio is not None else ""
                progress(f"fold {name}, {bench} held out: speedup {measure.text()}"
                         f"{size}")
    return got_all


def _measure_of(session: Session, got, name: str, bench: str, path: Path) -> FoldMeasure:
    if got.failure in (Failure.COMPILE, Failure.HEURISTIC):
        return FoldMeasure(name, bench, path, Figure(
            error=f"compile failed: {_line(got.error)}", compiled=False))
    if got.failure is Failure.MEASURE:
        return FoldMeasure(name, bench, path,
                           Figure(error=f"not measured: {_line(got.error)}"))
    compared = got.comparison
    assert compared is not None
    if not compared.resolved:
        return FoldMeasure(name, bench, path, Figure(pairs=compared.pairs,
                                                     error=compared.unresolved_line()))
    if compared.failed:
        return FoldMeasure(name, bench, path, Figure(
            pairs=compared.pairs, error="a run of the policy's build failed"))
    speedup, low, high = compared.interval
    ratio = None
    if got.compiled is not None:
        heuristic = session.builds.compile(CompileJob(got.contender.bench))
        try:
            ratio = got.compiled.binary.stat().st_size / heuristic.binary.stat().st_size
        except OSError:  # a binary the store dropped: the size is informative only
            ratio = None
    return FoldMeasure(name, bench, path, Figure(speedup, low, high, compared.pairs, ratio))


def _line(error: object) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def report(measures: Sequence[FoldMeasure], scores: pd.DataFrame,
           classifiers: Sequence[str]) -> None:
    """Per classifier and held-out benchmark: label accuracy beside the measured speedup;
    then per classifier its worst and geometric mean held-out speedup."""
    acc = {(r.classifier, r.held_out): r.balanced_accuracy for r in scores.itertuples()}
    click.echo("measured, each benchmark held out (speedup = heuristic time / fold policy "
               "time, paired, 95% interval; binary size relative to the heuristic's):")
    click.echo(f"  {'classifier':10} {'held out':20} {'bal.acc':>7}  {'speedup [95% CI]':24} "
               f"{'size':>6} pairs")
    for m in sorted(measures, key=lambda m: (classifiers.index(m.classifier), m.held_out)):
        a = acc.get((m.classifier, m.held_out), math.nan)
        size = f"{m.figure.size_ratio:.3f}" if m.figure.size_ratio is not None else "-"
        click.echo(f"  {m.classifier:10} {m.held_out:20} {a:7.3f}  {m.text():24} "
                   f"{size:>6} {m.figure.pairs}")
    for name in classifiers:
        mine = [m for m in measures if m.classifier == name]
        w = worst(mine)
        if w is None:
            missing = ", ".join(m.held_out for m in mine if not m.measured)
            click.echo(f"{name}: no worst held-out speedup (not measured: {missing})")
        else:
            click.echo(f"{name}: worst held-out measured speedup {w.text()} ({w.held_out}); "
                       f"geometric mean {geomean(mine)} over {len(mine)} benchmarks")


def scores_with_measures(scores: pd.DataFrame, measures: Sequence[FoldMeasure]
                         ) -> pd.DataFrame:
    """The held-out scores with each fold's measured speedup, interval, pairs and binary size
    ratio (empty where not measured): what ``<out>.scores.csv`` keeps."""
    table = pd.DataFrame([{"classifier": m.classifier, "held_out": m.held_out,
                           "measured_speedup": m.figure.speedup,
                           "measured_low": m.figure.low, "measured_high": m.figure.high,
                           "measured_pairs": m.figure.pairs,
                           "size_ratio": m.figure.size_ratio} for m in measures],
                         columns=["classifier", "held_out", "measured_speedup",
                                  "measured_low", "measured_high", "measured_pairs",
                                  "size_ratio"])
    return scores.merge(table, on=["classifier", "held_out"], how="left")
