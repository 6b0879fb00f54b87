"""``assign-rewards``'s procedure: the rundirs to fit, each benchmark's rewards fitted over the
hyperparameter grid and written (``analysis.rewards``), one ``Fitted`` record per benchmark.

One fit, one metric: a chain searched in an exact metric gives every candidate its counted
figure (``extract(..., counted=True)``, its confirmed best included), a timed chain its paired
wall-time figures, and a benchmark whose chains were measured in different metrics is refused
in one line (``mixed_metrics``): a count ratio and a wall-time speedup are not one target.

The fitting modules (scipy, scikit-learn) are imported when the work starts, not when this
module is: ``assign-rewards --help`` starts without them.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dispatcher.core.rundir import RundirError, rundirs_of_batch_log

if TYPE_CHECKING:
    from analysis.extract import Candidates
    from analysis.models import Hyper
    from analysis.rewards import BenchmarkRewards, Written


class RewardsInputError(ValueError):
    """Rundirs, benchmarks or an output directory that cannot be used: one line."""


def rundirs_to_fit(rundirs: Sequence[Path], batch_log: Path | None) -> list[Path]:
    """The rundirs named, and every rundir of ``batch_log`` (default ``./batch.log`` when no
    rundir is named), through the one batch-log reader."""
    paths = list(rundirs)
    if batch_log is not None or not paths:
        log = batch_log or Path("batch.log")
        try:
            listed = rundirs_of_batch_log(log)
        except RundirError as exc:
            raise RewardsInputError(str(exc)) from None
        if not listed:
            raise RewardsInputError(f"{log}: the batch log lists no experiment")
        paths += [rundir for _, rundir in listed]
    return paths


def candidates_of(paths: Sequence[Path], benchmarks: Sequence[str]) -> dict[str, Candidates]:
    """Each benchmark's candidates in ``paths`` (only ``benchmarks``, when named); a chain
    searched in an exact metric with every candidate's counted figure."""
    from analysis.extract import ExtractError, extract
    try:
        by_bench = extract(paths, counted=True)
    except ExtractError as exc:
        raise RewardsInputError(str(exc)) from None
    if benchmarks:
        unknown = sorted(set(benchmarks) - set(by_bench))
        if unknown:
            raise RewardsInputError(f"no rundir of benchmark {', '.join(unknown)} "
                                    f"(found: {', '.join(sorted(by_bench)) or 'none'})")
        by_bench = {b: by_bench[b] for b in benchmarks}
    return by_bench


@dataclass(frozen=True)
class Fitted:
    """One benchmark's rewards: fitted and written, or ``error`` (one line: its data cannot
    be fitted).  ``best``: the fit of best held-out Spearman (model, hyperparameters, split,
    spearman), if any; ``unresolved``: candidates left out for want of pairs."""

    benchmark: str
    result: BenchmarkRewards | None = None
    written: tuple[Written, ...] = ()
    best: Mapping[str, object] | None = None
    unresolved: int = 0
    error: str | None = None
    metric: str = "time"  # what every speedup fitted is in


def metrics_of(candidates: Candidates) -> dict[str, list[str]]:
    """The metrics a benchmark's measured candidates are in (the baseline, 1 in any metric,
    left out), each with the chains measured in it."""
    table = candidates.table
    rows = table[(table["mutation"] != "baseline") & table["speedup"].notna()]
    out: dict[str, list[str]] = {}
    for metric, chain in zip(rows["metric"].fillna("time"), rows["chain"]):
        chains = out.setdefault(str(metric), [])
        if chain not in chains:
            chains.append(chain)
    return out


def mixed_metrics(bench: str, candidates: Candidates) -> str | None:
    """Why ``bench``'s candidates cannot be fitted together (one line), or None: they are
    all in one metric."""
    metrics = metrics_of(candidates)
    if len(metrics) < 2:
        return None
    said = "; ".join(f"in {m}: {', '.join(chains[:2])}{', ...' if len(chains) > 2 else ''}"
                     for m, chains in sorted(metrics.items()))
    return (f"{bench}: its rundirs measured candidates in {' and '.join(sorted(metrics))} "
            f"({said}): one rewards assignment fits one metric; name the rundirs of one")


def fit_each(by_bench: Mapping[str, Candidates], hypers: Sequence[Hyper], rounds: int,
             seed: int, out: Path, min_r2: float, min_supported: int, plots: bool = True
             ) -> Iterator[Fitted]:
    """Each benchmark's rewards fitted and written under ``out``, as each is done, by name
    (``plots``: with their figures)."""
    from analysis.rewards import RewardError, assign, write
    for bench, candidates in sorted(by_bench.items()):
        mixed = mixed_metrics(bench, candidates)
        if mixed is not None:
            yield Fitted(bench, error=mixed)
            continue
        metric = next(iter(metrics_of(candidates)), "time")
        try:
            result = assign(candidates, hypers, rounds, seed)
        except RewardError as exc:
            yield Fitted(bench, error=str(exc))
            continue
        try:
            written = write(result, out, min_r2, min_supported, plots)
        except OSError as exc:
            raise RewardsInputError(f"{out}: cannot write the results: "
                                    f"{exc.strerror or exc}") from None
        table = result.scores_table()
        best = table[table["spearman"].notna()].sort_values("spearman", ascending=False).head(1)
        unresolved = int(candidates.table["unresolved"].fillna(False).astype(bool).sum())
        yield Fitted(bench, result, tuple(written),
                     best.iloc[0].to_dict() if len(best) else None, unresolved, metric=metric)
