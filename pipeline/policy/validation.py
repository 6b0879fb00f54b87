"""``train-policy --validate measured``: each leave-one-benchmark-out fold's policy compiled into
the benchmark it never saw and measured against that benchmark's heuristic build.

Label accuracy says how often a classifier agrees with the labels; it does not say what its
answers cost (docs/policies.md, "lu: one answer that costs everything").  Here each fold's
classifier, trained on every benchmark but one, is made a policy with the command's guard
rails; the compiler evaluates it (``-inlining-policy``) on the held-out benchmark, and the
build is compared in pairs with the heuristic's through ``dispatcher.compare`` (the store
answers comparisons measured before: a fold's bytes are deterministic, so a rerun measures
only what is new).  Each fold policy reaches the compile service as the bytes it was
serialised to (``learned_spec``); its file under ``<out>.folds`` is written for the user, not
read back.  Which classifier is kept, and the gate: ``pipeline.policy.selection``.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.policy_training import TrainingSet, exported_policy, train
from analysis.sources import SourcesError, benchmark_of
from dispatcher.baselines import cost_ratios, past_guard
from dispatcher.build.manifest import Benchmark, ManifestError, Size, resolve_benchmark
from dispatcher.build.policies import PolicySpec, learned_spec
from dispatcher.build.policy_file import write_policy_bytes
from dispatcher.build.service import CompileJob
from dispatcher.compare import Compared, Contender, Failure, compare_with_heuristic, pairing_policy
from dispatcher.config import Config
from dispatcher.core.figures import Figure
from dispatcher.session import Session
from pipeline.longrun import progress
from pipeline.policy.inputs import InputError
from pipeline.policy.selection import FoldMeasure

_NAME_BAD = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True)
class FoldPolicy:
    """One fold's policy: the file written for the user, and the spec (its bytes, hashed
    once) that the compile service is given."""

    path: Path
    spec: PolicySpec


@dataclass(frozen=True)
class MeasuredFolds:
    """Every fold measured, and the lost-worker lines the session ended with."""

    measures: list[FoldMeasure]
    lost_workers: list[str]


def subset(ts: TrainingSet, keep: pd.Series) -> TrainingSet:
    """The rows of ``ts`` where ``keep`` holds."""
    return TrainingSet(features=ts.features[keep], labels=ts.labels[keep],
                       benchmarks=ts.benchmarks[keep])


def fold_policies(ts: TrainingSet, classifiers: Sequence[str], threshold: float,
                  folds_dir: Path, *, margin: float, ranges: bool,
                  growth_budget: int | None,
                  models: Mapping[tuple[str, str], Any] | None = None
                  ) -> dict[tuple[str, str], FoldPolicy]:
    """Per (classifier, held-out benchmark): the policy of that classifier trained on every
    other benchmark, with the guard rails the kept policy will have, its file written under
    ``folds_dir``.  Nothing when fewer than two benchmarks (no fold has training data).
    ``models``: the folds' models the label scores fitted (``analysis.policy_training.
    fold_models``), exported rather than fitted again; a fold without one is fitted here."""
    benches = sorted(ts.benchmarks.unique())
    out: dict[tuple[str, str], FoldPolicy] = {}
    if len(benches) < 2:
        return out
    folds_dir.mkdir(parents=True, exist_ok=True)
    for name in classifiers:
        for bench in benches:
            rest = subset(ts, ts.benchmarks != bench)
            fitted = (models or {}).get((name, bench))
            policy = (train(rest, name, threshold, margin=margin, ranges=ranges,
                            growth_budget=growth_budget) if fitted is None else
                      exported_policy(rest, name, fitted, threshold, margin=margin,
                                      ranges=ranges, growth_budget=growth_budget))
            path = folds_dir / f"{name}.{_NAME_BAD.sub('_', bench)}.policy"
            spec = learned_spec(policy, source=str(path.resolve()))
            write_policy_bytes(spec.data, path)
            out[(name, bench)] = FoldPolicy(path, spec)
    return out


def held_out_programs(names: Sequence[str], reward_names: Sequence[str],
                      rewards_dir: Path | None, labels_dir: Path | None
                      ) -> dict[str, Benchmark]:
    """The program of each benchmark, for --validate measured: a rewards benchmark's from its
    sources.json (or the bundled one of its name), a labels-only one the bundled benchmark of
    its name."""
    out = {}
    for n in names:
        try:
            if n in reward_names and rewards_dir is not None:
                out[n] = benchmark_of(rewards_dir, n)[0]
            else:
                out[n] = resolve_benchmark(n)
        except (SourcesError, ManifestError) as exc:
            if n in reward_names:
                raise InputError(f"--validate measured compiles each held-out benchmark: "
                                 f"{exc}") from None
            raise InputError(f"{labels_dir / n if labels_dir else n}: --validate measured "
                             "compiles each held-out benchmark, and "
                             f"{n} is not the name of a bundled one") from None
    return out


def measure_folds(config: Config, folds: Mapping[tuple[str, str], FoldPolicy],
                  benches: Mapping[str, Benchmark], sizes: Mapping[str, Size], runs: int,
                  max_pairs: int | None) -> MeasuredFolds:
    """Every fold's policy compiled into its held-out benchmark (the compiler evaluating its
    bytes) and compared with that benchmark's heuristic build, all at once (builds in the
    compile pool, comparisons as slots free up).  A progress line per fold as it ends."""
    contenders = [Contender((name, bench, fold.path), benches[bench],
                            CompileJob(benches[bench], policy=fold.spec), sizes[bench])
                  for (name, bench), fold in folds.items()]
    session = Session(config)
    got_all: list[FoldMeasure] = []
    with session, closing(compare_with_heuristic(
            session, contenders, runs, pairing_policy(config, runs, max_pairs))) as compared:
        for got in compared:
            measure = _measure_of(session, got)
            got_all.append(measure)
            ratio = measure.figure.size_ratio
            size = f", binary {ratio:.3f}x the heuristic's" if ratio is not None else ""
            progress(f"fold {measure.classifier}, {measure.held_out} held out: speedup "
                     f"{measure.text()}{size}")
            if measure.fallback is not None:
                progress(f"{measure.held_out}: fold {measure.classifier}: {measure.fallback}: "
                         "counted at the heuristic's figure (1.000)")
    return MeasuredFolds(got_all, session.lost_workers())


def _measure_of(session: Session, got: Compared[Any]) -> FoldMeasure:
    name, bench, path = got.contender.tag

    if got.failure in (Failure.COMPILE, Failure.HEURISTIC):
        return FoldMeasure(name, bench, path, Figure(
            error=f"compile failed: {_line(got.error)}", compiled=False))
    size, cpu = cost_ratios(session, got)  # (None: a binary the store dropped, a compile
    # time not recorded; the guard then judges what is known)

    def fold(figure: Figure) -> FoldMeasure:
        figure = replace(figure, size_ratio=size, compile_ratio=cpu)
        return FoldMeasure(name, bench, path, figure,
                           past_guard(figure, session.config.policy))
    if got.failure is Failure.MEASURE:
        return fold(Figure(error=f"not measured: {_line(got.error)}"))
    compared = got.comparison
    assert compared is not None
    if not compared.resolved:
        return fold(Figure(pairs=compared.pairs, error=compared.unresolved_line()))
    if compared.failed:
        return fold(Figure(pairs=compared.pairs, error="a run of the policy's build failed"))
    speedup, low, high = compared.interval
    return fold(Figure(speedup, low, high, compared.pairs, metric=compared.metric))


def _line(error: object) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def scores_with_measures(scores: pd.DataFrame, measures: Sequence[FoldMeasure]
                         ) -> pd.DataFrame:
    """The held-out scores with each fold's measured speedup, interval, pairs, binary size
    and compile time ratios (empty where not measured), the speedup the gate counts
    (``counted``: 1 past the cost guards) and why (``note``): what ``<out>.scores.csv``
    keeps."""
    columns = ["classifier", "held_out", "measured_speedup", "measured_low", "measured_high",
               "measured_pairs", "size_ratio", "compile_ratio", "counted", "note"]
    table = pd.DataFrame([(m.classifier, m.held_out, m.figure.speedup, m.figure.low,
                           m.figure.high, m.figure.pairs, m.figure.size_ratio,
                           m.figure.compile_ratio, m.judged.speedup, m.fallback or "")
                          for m in measures], columns=columns)
    return scores.merge(table, on=["classifier", "held_out"], how="left")
